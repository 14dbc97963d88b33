"""The measurements behind ``trine check`` (see :mod:`trine.inspect.check` for what each one is for).

Each probe takes the tokenizer (and, for the sampled checks, a :class:`Sampled` conversation or the model)
and returns :class:`CheckRow` s; none of them raises on what it finds: a problem is a row.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from trine.inspect.mask_view import Span, experience_spans
from trine.models.batching import collate, forward_logprobs
from trine.models.sampling import kept_set
from trine.tools import format_tool_call
from trine.types import Completion, SamplingParams
from trine.workflows.trajectory import ChatDelta, Trajectory

Result = Literal["OK", "WARN", "FAIL", "INFO", "SKIP"]
Chat = list[dict[str, Any]]

OBSERVATIONS = (
    "That is not right yet. Check your work and answer again.",
    "Observation: the counter now reads 42. What do you do next?",
    "Thanks. Give your final answer in one line.",
)
"""The fixed texts the world answers with between sampled turns (user messages)."""

ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
"""The tool listed in the tool-call chat (OpenAI function format, as ``ToolBox.specs()`` gives it)."""

RETOKENIZE_NOTE = (
    "Re-tokenizing a conversation's text would train on tokens the model never produced; a Trajectory "
    "keeps the sampled ids (token-in token-out), so what is trained is what was sampled."
)
UNTRUNCATED_NOTE = (
    "With top-p / top-k the engine reports log pi_trunc (the kept set renormalised) and the trainer replays "
    "the same truncation from Experience.info top_k / top_p; the two must agree."
)
TRUNCATION_NOTE = (
    "The truncation gap is log pi_trunc(y) - log pi(y) = -log(kept probability mass) at the sampled tokens: "
    "how far the sampled distribution is from the untruncated policy. The trainer replays the truncation, so "
    "it is no off-policy bias, but the policy only learns about the kept tokens."
)


@dataclass
class CheckRow:
    """One line of the report."""

    check: str
    """What is checked (e.g. ``template round trip``)."""
    result: Result
    """``OK``, ``WARN`` (works, but read the detail), ``FAIL`` (fix it before a long run), ``INFO`` (a
    measured size, no verdict) or ``SKIP`` (could not run: an earlier check failed)."""
    value: str
    """The measured value, short."""
    detail: str
    """Where and what, short; for WARN/FAIL what to do."""
    note: str = ""
    """Why it matters (printed once under the table)."""
    data: dict[str, Any] = field(default_factory=dict)
    """Machine-readable measurements (``--json``)."""


@dataclass
class Sampled:
    """One conversation sampled with the engine, kept token-in token-out."""

    label: str
    """``plain``, ``top_p=0.9``, ``top_k=20``..."""
    params: SamplingParams
    configured: bool
    """Whether the config itself samples with this truncation (else it is shown for information)."""
    traj: Trajectory
    completions: list[Completion] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------ 1. template
def template_rows(tokenizer: Any, opening: Chat, stop_ids: set[int]) -> list[CheckRow]:
    """Round trip of a few chats, whole vs incremental tokenization, and the end-of-turn token."""
    chats = demo_chats(opening)
    trips: list[tuple[str, str]] = []
    steps: list[tuple[Result, str, str]] = []
    tokens = 0
    for name, messages, tools in chats:
        problem, count = _round_trip(tokenizer, messages, tools)
        trips += [(name, problem)] if problem else []
        tokens += count
        steps.append((*_incremental(tokenizer, messages, tools), name))
    names = ", ".join(name for name, _, _ in chats)
    rows = [
        CheckRow(
            "template round trip",
            "FAIL" if trips else "OK",
            f"{len(chats)} chats, {tokens} tokens",
            _grouped(trips) or f"render -> tokenize -> decode is lossless ({names})",
            data={"problems": [f"{n}: {p}" for n, p in trips]},
        )
    ]
    bad = [s for s in steps if s[0] == "FAIL"] + [s for s in steps if s[0] == "WARN"]
    result: Result = bad[0][0] if bad else "OK"
    rows.append(
        CheckRow(
            "template incremental",
            result,
            f"{len(steps) - len(bad)}/{len(steps)} chats equal",
            _grouped([(n, p) for _, p, n in bad])
            or "a Trajectory's incremental tokens = the chat tokenized whole",
            data={"problems": [f"{n}: {p}" for _, p, n in bad]},
        )
    )
    rows.append(_end_of_turn(tokenizer, stop_ids))
    return rows


def _grouped(problems: list[tuple[str, str]]) -> str:
    """``"a, b: problem; c: other"``: each distinct problem once, after the chats that have it."""
    by_text: dict[str, list[str]] = {}
    for name, text in problems:
        by_text.setdefault(text, []).append(name)
    return "; ".join(f"{', '.join(names)}: {text}" for text, names in by_text.items())


def demo_chats(opening: Chat) -> list[tuple[str, Chat, list[dict[str, Any]] | None]]:
    """``(name, messages, tools)``: the task's opening chat, a multi-turn chat and one with a tool call,
    a ``tool`` message and the tool listed."""
    multi = [
        {"role": "assistant", "content": "Let me think step by step. The answer is 42."},
        {"role": "user", "content": "Are you sure? Check it once more."},
        {"role": "assistant", "content": "Yes, I checked it: 42."},
        {"role": "user", "content": "Thank you."},
    ]
    tool = [
        {"role": "assistant", "content": format_tool_call("add", {"a": 2, "b": 3})},
        {"role": "tool", "name": "add", "tool_call_id": "call_0", "content": "5"},
        {"role": "assistant", "content": "The sum is 5."},
        {"role": "user", "content": "Thanks."},
    ]
    return [
        ("opening", opening, None),
        ("multi-turn", opening + multi, None),
        ("tool call", opening + tool, [ADD_TOOL]),
    ]


def _round_trip(tokenizer: Any, messages: Chat, tools: Any) -> tuple[str, int]:
    """``(problem or "", tokens)`` of render -> tokenize -> decode."""
    try:
        text = _render(tokenizer, messages, tools)
    except Exception as err:  # a template that cannot render this chat: reported, not raised
        return f"the chat template raised {type(err).__name__}: {err}", 0
    ids = _encode(tokenizer, text)
    back = tokenizer.decode(ids, skip_special_tokens=False)
    i = _first_diff(text, back)
    if i is None:
        return "", len(ids)
    return f"decodes to other text from char {i}: {_around(text, i)} vs {_around(back, i)}", len(ids)


def _incremental(tokenizer: Any, messages: Chat, tools: Any) -> tuple[Result, str]:
    """Build the chat as a Trajectory does (assistant turns as sampled ids, the rest as template deltas)
    and compare it with the chat rendered and tokenized whole."""
    try:
        whole_text = _render(tokenizer, messages, tools)
        first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
        traj = Trajectory(tokenizer, messages[:first], tools=tools)
        pending: Chat = []
        for m in messages[first:]:
            if m["role"] != "assistant":
                pending.append(m)
                continue
            if pending:
                traj.add_messages(pending)
                pending = []
            traj.add_completion(_as_completion(tokenizer, traj, m["content"]))
        if pending:
            traj.add_messages(pending)
    except ValueError as err:  # ChatDelta: not prefix-consistent
        return "FAIL", str(err)
    except Exception as err:  # the template raised on this chat
        return "FAIL", f"the chat template raised {type(err).__name__}: {err}"
    built = tokenizer.decode(traj.tokens, skip_special_tokens=False)
    i = _first_diff(whole_text, built)
    if i is not None:
        return "FAIL", (
            f"built turn by turn it reads otherwise from char {i}: whole {_around(whole_text, i)}, "
            f"incremental {_around(built, i)}; the template must render a chat as a prefix of its continuation"
        )
    whole = _encode(tokenizer, whole_text)
    j = _first_diff(whole, traj.tokens)
    if j is None:
        return "OK", ""
    return "WARN", (
        f"same text, other tokens from token {j}: whole {_show(tokenizer, whole[j : j + 3])}, "
        f"incremental {_show(tokenizer, traj.tokens[j : j + 3])} (merges across message boundaries: data "
        "tokenized whole differs from what trajectories train on)"
    )


def _as_completion(tokenizer: Any, traj: Trajectory, content: str) -> Completion:
    """An assistant message as the model would sample it: its content's tokens, then the template's
    end-of-turn token when the closing starts with a special token."""
    ids = _encode(tokenizer, content)
    closing = _encode(tokenizer, traj.delta.closing)
    if closing and closing[0] in set(tokenizer.all_special_ids):
        ids = ids + closing[:1]
    return Completion(
        prompt_ids=[], response_ids=ids, logprobs=[0.0] * len(ids), text=content, finish_reason="stop"
    )


def _end_of_turn(tokenizer: Any, stop_ids: set[int]) -> CheckRow:
    """The template's end-of-turn token is one the engine stops on."""
    name = "template end of turn"
    try:
        closing = ChatDelta(tokenizer).closing
    except ValueError:
        return CheckRow(
            name, "SKIP", "-", "needs a chat template that renders turns incrementally (see above)"
        )
    ids = _encode(tokenizer, closing)
    stops = _show(tokenizer, sorted(stop_ids))
    if ids and ids[0] in stop_ids:
        return CheckRow(
            name, "OK", _show(tokenizer, ids[:1]), f"closes turns with {closing!r}; engine stops on {stops}"
        )
    return CheckRow(
        name,
        "WARN",
        repr(closing),
        f"closes turns with {closing!r} but the engine stops on {stops}: turns run to max_tokens. Add the "
        "end-of-turn id to sampling.stop_token_ids or to eos_token_id in generation_config.json",
    )


# ------------------------------------------------------------------------------------------ sampling
async def sample_conversations(
    engine: Any,
    tokenizer: Any,
    opening: Chat,
    variants: list[tuple[str, SamplingParams, bool]],
    turns: int,
    seed: int,
) -> list[Sampled]:
    """One conversation per ``(label, params, configured)`` variant, sampled concurrently (the engine
    batches their turns); each request is seeded, observations are :data:`OBSERVATIONS`."""

    async def one(index: int, label: str, params: SamplingParams, configured: bool) -> Sampled:
        sample = Sampled(label, params, configured, Trajectory(tokenizer, opening))
        for t in range(turns):
            if t:
                text = OBSERVATIONS[(t - 1) % len(OBSERVATIONS)]
                sample.traj.add_messages([{"role": "user", "content": text}])
                sample.observations.append(text)
            request = params.replace(seed=seed + 1000 * index + t)
            completion = (await engine.generate(sample.traj.tokens, request))[0]
            sample.traj.add_completion(completion)
            sample.completions.append(completion)
        return sample

    return list(await asyncio.gather(*(one(i, *v) for i, v in enumerate(variants))))


# ------------------------------------------------------------------------------------------ 2. fidelity
def fidelity_row(tokenizer: Any, sample: Sampled) -> CheckRow:
    """The sampled conversation's tokens (its last turn closed by the template) vs its text
    (``apply_chat_template(messages)``) tokenized whole: the first divergence."""
    traj = sample.traj
    last = traj.turns[-1]
    ours = traj.tokens + _encode(tokenizer, traj.delta.close(traj.tokens[last.start : last.end]))
    theirs = _encode(tokenizer, tokenizer.apply_chat_template(traj.messages, tokenize=False))
    special = set(tokenizer.all_special_ids)
    canonical = [
        _encode(tokenizer, c.text) == [i for i in c.response_ids if i not in special]
        for c in sample.completions
    ]
    data: dict[str, Any] = {"tokens": len(ours), "retokenized": len(theirs), "turns_canonical": canonical}
    i = _first_diff(ours, theirs)
    name = "multi-turn token fidelity"
    if i is None:
        return CheckRow(
            name,
            "OK",
            f"{len(ours)} tokens identical",
            "re-tokenizing the text gives the same ids",
            data=data,
        )
    where = _where(traj, i)
    before = tokenizer.decode(ours[max(0, i - 6) : i], skip_special_tokens=False)
    data.update(
        position=i,
        where=where,
        sampled_tokens=_pieces(tokenizer, ours[i : i + 4]),
        retokenized_tokens=_pieces(tokenizer, theirs[i : i + 4]),
    )
    odd = sum(not c for c in canonical)
    return CheckRow(
        name,
        "WARN",
        f"diverges at token {i} of {len(ours)}",
        f"in {where}, after {before[-20:]!r}: sampled {_show(tokenizer, ours[i : i + 4])}, re-tokenized "
        f"{_show(tokenizer, theirs[i : i + 4])}; {odd} of {len(canonical)} turns are not the tokenizer's "
        "own tokenization of their text",
        RETOKENIZE_NOTE,
        data,
    )


def _where(traj: Trajectory, i: int) -> str:
    """Which part of the conversation token ``i`` belongs to."""
    if i < traj.prompt_length:
        return "the opening prompt"
    for k, turn in enumerate(traj.turns):
        if turn.start <= i < turn.end:
            return f"turn {k + 1}'s sampled tokens"
    after = sum(turn.end <= i for turn in traj.turns)
    return f"the template/observation tokens after turn {after}"


# ------------------------------------------------------------------------------------------ 3. mask
def mask_row(tokenizer: Any, sample: Sampled) -> tuple[CheckRow, list[Span]]:
    """Every trained token (mask 1) is a sampled one and no template/observation token is trained, in
    the concatenated experience and the step-wise ones; also the conversation in mask runs."""
    traj = sample.traj
    exp = traj.experience(None, temperature=sample.params.temperature)
    start, mask = exp.prompt_length, exp.action_mask
    spans = experience_spans(tokenizer, exp)
    trained = [exp.tokens[s.start : s.end] for s in spans if s.trained]
    untrained = [s.text for s in spans if not s.trained and s.start >= start]
    sampled = [list(c.response_ids) for c in sample.completions]
    problems = []
    if not len(mask) == len(exp.tokens) - start == len(exp.logprobs):
        problems.append(
            f"action_mask ({len(mask)}), logprobs ({len(exp.logprobs)}) and the response "
            f"({len(exp.tokens) - start} tokens) differ in length"
        )
    if trained != sampled:
        problems.append(
            f"the trained runs ({[len(r) for r in trained]} tokens) are not the sampled turns "
            f"({[len(s) for s in sampled]} tokens)"
        )
    for k, text in enumerate(sample.observations):
        if not any(text in u for u in untrained):
            problems.append(f"observation {k + 1} ({text[:24]!r}...) is not among the untrained tokens")
    for k, completion in enumerate(sample.completions[:-1]):
        end = tokenizer.decode(completion.response_ids[-1:], skip_special_tokens=False)
        if end and completion.finish_reason == "stop" and k < len(untrained) and untrained[k].startswith(end):
            problems.append(f"turn {k + 1}'s end of turn {end!r} is there twice (sampled, then templated)")
    if any(lp != 0.0 for lp, m in zip(exp.logprobs, mask) if not m):
        problems.append("untrained tokens carry behaviour logprobs")
    for t, step in enumerate(traj.turn_experiences(None)):
        if step.tokens[step.prompt_length :] != sampled[t] or not all(step.action_mask):
            problems.append(f"the step-wise experience of turn {t + 1} is not that turn's sampled tokens")
    value = f"{sum(mask)} of {len(mask)} response tokens trained, {len(trained)} turns"
    detail = "; ".join(problems) or "trained = sampled tokens only; template and observations untrained"
    result: Result = "FAIL" if problems else "OK"
    return CheckRow("action-mask alignment", result, value, detail, data={"problems": problems}), spans


# ------------------------------------------------------------------------------------------ 4. logprobs
def logprob_rows(model: Any, tokenizer: Any, sample: Sampled, tolerance: float) -> list[CheckRow]:
    """Per turn, max |engine - trainer| logprob over the trained tokens (trainer: ``forward_logprobs`` on
    the concatenated experience); for a truncated variant also the truncation gap (:func:`truncation_gap`)."""
    traj, params = sample.traj, sample.params
    exp = traj.experience(None, temperature=params.temperature)
    if params.top_k > 0 or params.top_p < 1:  # what the explorer records, so the trainer replays it
        exp.info.update(top_k=params.top_k, top_p=params.top_p)
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    batch = collate([exp], [0], pad, device)
    seen: list[torch.Tensor] = []

    def keep(logits: torch.Tensor) -> torch.Tensor:  # the trainer's own temperature-scaled logits
        seen.append(logits)
        return torch.zeros(logits.shape[:-1], device=logits.device)

    with torch.no_grad():
        trainer, _ = forward_logprobs(model, batch, entropy_fn=keep)
    trainer, logits = trainer[0].float().cpu(), seen[0][0].float().cpu()
    diff = (torch.tensor(exp.logprobs, dtype=torch.float32) - trainer).abs()
    spans = [(t.start - exp.prompt_length, t.end - exp.prompt_length) for t in traj.turns]
    per_turn = [float(diff[a:b].max()) for a, b in spans]
    means = [float(diff[a:b].mean()) for a, b in spans]
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    truncated = params.top_p < 1 or params.top_k > 0
    ok = max(per_turn) <= tolerance
    if ok:
        detail = (
            f"max |engine - trainer| over trained tokens <= {tolerance:g} ({dtype}, T={params.temperature:g})"
        )
    else:
        detail = (
            f"above {tolerance:g} ({dtype}): the trainer's ratios start off-policy. Check that the engine "
            "samples the trainer's weights, dtype and attention kernels, and that Experience.info"
            "['temperature'] is the sampling temperature (or pass --tolerance)"
        )
    rows = [
        CheckRow(
            f"engine vs trainer logprobs ({sample.label})",
            "OK" if ok else "FAIL",
            "per turn: " + ", ".join(f"{d:.1e}" for d in per_turn),
            detail,
            UNTRUNCATED_NOTE if truncated else "",
            {"per_turn_max_abs": per_turn, "per_turn_mean_abs": means, "tolerance": tolerance},
        )
    ]
    if truncated:
        trained = torch.tensor(exp.action_mask, dtype=torch.bool)
        gap, outside = truncation_gap(
            logits[trained], batch.targets[0].cpu()[trained], params.top_k, params.top_p
        )
        rows.append(_truncation_row(sample, gap, outside))
    return rows


def truncation_gap(
    logits: torch.Tensor, targets: torch.Tensor, top_k: int, top_p: float
) -> tuple[torch.Tensor, int]:
    """``log pi_trunc(y) - log pi(y)`` at each target ``y`` kept by the truncation, where ``pi_trunc`` is
    ``pi = softmax(logits)`` renormalised over the :func:`kept_set` (so the gap is ``-log`` of the kept
    mass, >= 0); and how many targets fall outside the kept set."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    kept = kept_set(logp, top_k, top_p)
    log_mass = torch.logsumexp(logp.masked_fill(~kept, float("-inf")), dim=-1)
    inside = kept.gather(-1, targets[:, None]).squeeze(-1)
    return -log_mass[inside], int((~inside).sum())


def _truncation_row(sample: Sampled, gap: torch.Tensor, outside: int) -> CheckRow:
    mean, most = (float(gap.mean()), float(gap.max())) if gap.numel() else (0.0, 0.0)
    result: Result = "INFO"
    detail = (
        "the config samples with it" if sample.configured else "for information: the config does not truncate"
    )
    if outside:
        detail += f"; {outside} sampled token(s) outside the set the trainer's logits keep (ties at its edge)"
    return CheckRow(
        f"truncation gap ({sample.label})",
        result,
        f"mean {mean:.3f} / max {most:.3f} nats",
        detail,
        TRUNCATION_NOTE,
        {"mean": mean, "max": most, "outside": outside, "tokens": int(gap.numel()) + outside},
    )


# ------------------------------------------------------------------------------------------ helpers
def _render(tokenizer: Any, messages: Chat, tools: Any) -> str:
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def _first_diff(a: Any, b: Any) -> int | None:
    """First index where two sequences differ (the shorter one's length if one is a prefix), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _around(text: str, i: int) -> str:
    return repr(text[max(0, i - 12) : i + 18])


def _pieces(tokenizer: Any, ids: list[int]) -> list[str]:
    return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]


def _show(tokenizer: Any, ids: list[int]) -> str:
    return "|".join(repr(p) for p in _pieces(tokenizer, ids)) or "(end)"
