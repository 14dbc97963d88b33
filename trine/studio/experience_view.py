"""One experience as the studio shows it: its tokens (decoded with the run's tokenizer) flagged prompt /
model action / observation, with their logprobs and advantages; its turns; its group and its steps.

Advantages are not stored in the buffer. For outcome-reward algorithms they are recomputed here the way
the run's trainer computes them: the advantage function of the run's algorithm (its preset, with the
config's ``algorithm.advantage`` / ``advantage_args`` over it; built-ins and plugins loaded at start only,
never an import path from a config) called on the rewards of the experience's group. Where that is
impossible (a critic's values, a supervised row, a pending reward) ``advantage`` is null and
``advantage_note`` says why; where it is an approximation (batch-wide normalization) the note says so.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from trine.studio.experience_rows import PREVIEW, finite, summary
from trine.types import Experience

_TOKENIZERS: dict[tuple[str, str | None, str], Any] = {}
BATCH_WIDE = ("reinforce_pp", "reinforce_pp_baseline")
"""Advantage functions that normalize over the trainer's whole batch, not over a group."""


def run_tokenizer(run_dir: Path, stage: str | None) -> Any:
    """The run's tokenizer (newest checkpoint, else the config's ``model.path``; see
    :func:`trine.cli.buffer._tokenizer`), cached per run and newest checkpoint; None if none loads."""
    from trine.cli.buffer import _tokenizer
    from trine.trainer.checkpoint import list_checkpoints

    found = list_checkpoints(run_dir / "checkpoints")
    key = (str(run_dir.resolve()), stage, found[-1].name if found else "")
    if key not in _TOKENIZERS:
        try:
            _TOKENIZERS[key] = _tokenizer(run_dir, stage)
        except (FileNotFoundError, ValueError, OSError):
            _TOKENIZERS[key] = None
    return _TOKENIZERS[key]


def _decode(tokenizer: Any, ids: list[int]) -> str:
    if not ids:
        return ""
    if tokenizer is None:
        return " ".join(f"<{i}>" for i in ids)
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _pieces(tokenizer: Any, ids: list[int]) -> list[str]:
    if tokenizer is None:
        return [f"<{i}>" for i in ids]
    return tokenizer.batch_decode(
        [[i] for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False
    )


def token_rows(e: Experience, tokenizer: Any, advantages: list[float | None] | None) -> list[dict[str, Any]]:
    """One entry per token: id, text, prompt flag, action flag (action_mask 1), logprob, advantage."""
    texts = _pieces(tokenizer, e.tokens)
    out = []
    for i, (token, text) in enumerate(zip(e.tokens, texts)):
        r = i - e.prompt_length
        prompt = r < 0
        action = not prompt and r < len(e.action_mask) and bool(e.action_mask[r])
        logprob = finite(e.logprobs[r]) if action and e.logprobs and r < len(e.logprobs) else None
        advantage = advantages[r] if advantages is not None and not prompt and r < len(advantages) else None
        out.append(
            {"id": token, "text": text, "prompt": prompt, "action": action, "logprob": logprob,
             "advantage": advantage}
        )  # fmt: skip
    return out


def turns(e: Experience, tokenizer: Any) -> list[dict[str, str]]:
    """The prompt, then the response split into runs of model tokens and observation tokens."""
    out = [{"role": "prompt", "text": _decode(tokenizer, e.tokens[: e.prompt_length])}]
    response, mask = e.response_tokens, [bool(m) for m in e.action_mask]
    start = 0
    while start < len(response):
        end = start
        while end < len(response) and mask[end] == mask[start]:
            end += 1
        out.append(
            {
                "role": "model" if mask[start] else "observation",
                "text": _decode(tokenizer, response[start:end]),
            }
        )
        start = end
    return out


def _algorithm(run_dir: Path, stage: str | None) -> tuple[Any, Any, str | None]:
    """(algorithm record, its advantage function, None) or (None, None, why not)."""
    from trine import registry
    from trine.buffer.inspect import run_stage_config

    section = run_stage_config(run_dir, stage).get("algorithm") or {}
    name = section.get("name") or "grpo"
    presets = registry.builtins("algorithm")
    if name not in presets:
        why = f"algorithm {name!r} is not a preset or a plugin loaded with `trine studio --plugin`"
        return None, None, why + " (the studio imports no code named in a config): advantage not computed"
    overrides = {k: section[k] for k in ("advantage", "advantage_args") if section.get(k) is not None}
    algo = presets[name].with_overrides(**overrides)
    if algo.advantage is None:
        return None, None, f"algorithm {name!r} has no advantages (its loss {algo.loss!r} uses none)"
    functions = registry.builtins("advantage")
    if algo.advantage not in functions:
        why = f"advantage function {algo.advantage!r} is not a built-in or a plugin loaded with --plugin"
        return None, None, why + ": advantage not computed"
    return algo, functions[algo.advantage], None


def advantages_for(
    e: Experience, group: list[tuple[Experience, str, int]], run_dir: Path, stage: str | None
) -> tuple[list[float | None] | None, str | None]:
    """Per response token advantage of ``e`` (None on observation tokens), with a note, or (None, why)."""
    from trine.algorithms import ADVANTAGE_INPUTS, needed_inputs
    from trine.trainer.inputs import sample_inputs, token_inputs

    if e.kind != "rollout":
        return None, f"a {e.kind} row is trained without advantages"
    if e.reward is None:
        return None, "the reward is still pending: the advantage is known once it arrives"
    try:
        algo, fn, why = _algorithm(run_dir, stage)
    except (ValueError, TypeError, FileNotFoundError) as err:
        return None, f"the run's algorithm section cannot be read: {err}"
    if algo is None:
        return None, why
    needed = needed_inputs(fn, ADVANTAGE_INPUTS)
    if "values" in needed:
        return (
            None,
            f"{algo.name}'s advantage ({algo.advantage}) needs the critic's values, which are not stored",
        )
    members = [m for m, _, _ in group if m.reward is not None and m.kind == "rollout" and m.id != e.id]
    members.insert(0, e)
    width = max(m.response_length for m in members) or 1
    inputs = {**sample_inputs(members, needed), **token_inputs(members, needed, width)}
    extra = {k: v for k, v in inputs.items() if k not in ("rewards", "group_ids")}
    base = sample_inputs(members, ("rewards", "group_ids"))
    try:
        adv, _ = fn(base["rewards"], base["group_ids"], **extra, **algo.advantage_args)
    except (ValueError, TypeError, RuntimeError, IndexError) as err:
        return None, f"{algo.advantage} advantage failed on this group: {err}"
    row = adv[0]
    values = [float(row)] * e.response_length if row.dim() == 0 else row[width - e.response_length :].tolist()
    per_token = [finite(v) if m else None for v, m in zip(values, e.action_mask)]
    return per_token, _approximation(algo, e, group, len(members))


def _approximation(algo: Any, e: Experience, group: list[Any], used: int) -> str | None:
    notes = [
        f"{algo.advantage} advantage of algorithm {algo.name!r} over the {used} rewarded rows of its group"
    ]
    if algo.advantage in BATCH_WIDE or algo.advantage_args.get("std_scope") == "batch":
        notes.append("the trainer normalized over its whole training batch, so the scale may differ")
    if algo.kl_coef and algo.kl_mode == "reward":
        notes.append("without the KL penalty the trainer subtracted from the rewards (kl_mode: reward)")
    if used < len(group):
        notes.append(f"{len(group) - used} group rows without a reward (pending) or not rollouts left out")
    return "; ".join(notes)


def _json_safe(x: Any) -> Any:
    """``x`` with non-finite floats replaced by None (JSON has no NaN)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): _json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_safe(v) for v in x]
    return x


def experience_detail(
    source: Any, found: tuple[Experience, str, int], run_dir: Path, stage: str | None
) -> dict[str, Any]:
    """The detail view of the contract (``GET /api/runs/{name}/experiences/{id}``)."""
    e, status, seq = found
    tokenizer = run_tokenizer(run_dir, stage)
    group = source.group(e)
    advantages, advantage_note = advantages_for(e, group, run_dir, stage)
    experience = {
        **summary(e, status, seq),
        "trajectory_status": e.status,
        "reward_parts": _json_safe(e.info.get("reward_parts") or {}),
        "info": _json_safe(e.info),
    }
    return {
        "experience": experience,
        "tokens": token_rows(e, tokenizer, advantages),
        "prompt_text": _decode(tokenizer, e.tokens[: e.prompt_length]),
        "response_text": _decode(tokenizer, e.response_tokens),
        "turns": turns(e, tokenizer),
        "group": [
            {
                "id": m.id,
                "reward": finite(m.reward),
                "status": s,
                "preview": str(m.info.get("response", ""))[:PREVIEW],
            }
            for m, s, _ in group
        ],
        "steps": [
            {"id": m.id, "step": m.step, "reward": finite(m.reward), "status": s}
            for m, s, _ in source.steps(e)
        ],
        "advantage_note": advantage_note,
        "tokenizer_note": None
        if tokenizer is not None
        else (
            "the run's tokenizer could not be loaded (no checkpoint and no model.path that loads): "
            "tokens are shown as <id>"
        ),
    }
