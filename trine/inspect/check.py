"""``trine check CONFIG``: the consistency checks to run before a long agent run.

Users of every RFT framework lose days to a chat template that is not prefix-consistent, to a multi-turn
conversation that is re-tokenized from its text, to observation tokens that are trained on, or to rollout
logprobs that are not what the trainer recomputes. ``trine check`` loads the config's model and tokenizer
(the first stage's, as ``trine run`` loads them) and measures each of these in a few seconds:

1. **Chat template** (:func:`template_rows`): a few chats (system / user / assistant, and one with a tool
   call, a ``tool`` message and tools listed) render -> tokenize -> decode back to the rendered text; the
   whole chat tokenized at once equals what a :class:`~trine.workflows.trajectory.Trajectory` builds from
   its incremental deltas; the template's end-of-turn token is one the engine stops on.
2. **Multi-turn token fidelity** (:func:`fidelity_row`): a short conversation sampled with the real engine
   (fixed seed, fixed observation texts) kept token-in token-out, against the same conversation's text
   re-tokenized as a whole; the first divergence is shown (a WARN: it is what re-tokenizing would get wrong).
3. **Action-mask alignment** (:func:`mask_row`): every trained token (mask 1) is a sampled one, and no
   template or observation token is trained; the conversation is printed with the trained tokens highlighted.
4. **Rollout vs trainer logprobs** (:func:`logprob_rows`), per turn, for plain, top-p and top-k sampling:
   the engine reports ``log_softmax(logits / T)`` *before* truncation, which is what the trainer recomputes,
   so the two must agree within a tolerance that depends on the dtype. What the sampler really drew from
   (the distribution renormalised over the kept tokens) differs from that: the size of the gap is reported.
5. **Real episodes** (:mod:`trine.inspect.episodes`): the first ``episodes`` train tasks played once each
   with the configured workflow, environment, tools and reward through the run's explorer, printed with the
   trained tokens highlighted and the masked ones (prompt, template, observations, tool output) marked
   (:mod:`trine.inspect.mask_view`), with the per-turn logprob agreement and the reward and its parts.
6. **Reward probes** (:mod:`trine.inspect.reward_probes`): padded, repeated, truncated, junk-appended and
   empty answers scored with the configured reward; a WARN when one scores near the correct answer.
7. **Eval rows in training** (:func:`~trine.inspect.contamination.contamination_row`): a WARN when an eval
   taskset's prompt is also a training prompt (exact, after normalizing), with how many and one example;
   bounded (exact matches only, the first 50,000 training / 10,000 eval rows of each taskset):
   ``trine tasks overlap --config CONFIG`` measures n-gram overlap too.

:func:`run_checks` returns a :class:`CheckReport`; :func:`print_report` prints it (rich table) and
``CheckReport.as_dict()`` is the ``--json`` output.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trine.config import RunConfig
from trine.types import SamplingParams

if TYPE_CHECKING:  # torch and the probes are imported when the checks run, after the estimate is printed
    from trine.inspect.episodes import Episode
    from trine.inspect.mask_view import Span
    from trine.inspect.probes import CheckRow, Sampled

TOLERANCE: dict[str, float] = {"float32": 1e-3, "float16": 5e-2, "bfloat16": 2.5e-1}
"""Largest ``|engine logprob - trainer logprob|`` accepted on a trained token, by the model's dtype: the
KV-cached decode and the full forward round differently, more so in 16-bit floats."""


@dataclass
class CheckReport:
    """Everything ``trine check`` measured."""

    config: str
    model: str
    dtype: str
    device: str
    seed: int
    turns: int
    rows: list[CheckRow]
    conversation: list[Span]
    """The plain-sampling probe conversation, in mask runs (``--json`` only)."""
    episodes: list[Episode]
    """The real episodes played (printed with the trained tokens highlighted)."""
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        """Whether a check failed."""
        return any(r.result == "FAIL" for r in self.rows)

    def exit_code(self, strict: bool = False) -> int:
        """1 when a check failed (or, ``strict``, warned), else 0."""
        bad = ("FAIL", "WARN") if strict else ("FAIL",)
        return 1 if any(r.result in bad for r in self.rows) else 0

    def as_dict(self) -> dict[str, Any]:
        """The report as JSON-able data (``trine check --json``)."""
        data = asdict(self)
        data["ok"] = not self.failed
        return data


def run_checks(
    cfg: RunConfig,
    *,
    turns: int = 3,
    seed: int | None = None,
    max_tokens: int = 48,
    tolerance: float | None = None,
    config: str = "",
    episodes: int = 2,
) -> CheckReport:
    """Load ``cfg``'s model and tokenizer and run every check (see the module docstring).

    Args:
        cfg: the first stage's config.
        turns: model turns of each sampled conversation (observations are fixed texts in between).
        seed: sampling seed (None: ``cfg.seed``).
        max_tokens: most tokens sampled per turn (also bounded by the train taskset's ``max_tokens``).
        tolerance: largest accepted |engine - trainer| logprob (None: :data:`TOLERANCE` of the dtype).
        config: the config's path, for the report's header.
        episodes: real episodes of the configured workflow to play (0: none).
    """
    if turns < 1 or max_tokens < 1 or episodes < 0:
        raise ValueError(
            f"turns={turns}, max_tokens={max_tokens}, episodes={episodes}; expected turns and max_tokens "
            ">= 1 and episodes >= 0 (e.g. --turns 3 --episodes 2)."
        )
    if tolerance is not None and not tolerance > 0:
        raise ValueError(f"tolerance={tolerance}; expected a number > 0 (e.g. 1e-3).")
    if cfg.tasks.train is None:  # tasks.source: buffer
        raise ValueError(
            "trine check samples tasks.train's first row; this stage trains on a buffer: check a config with one"
        )
    from trine.build import load_policy
    from trine.inspect.contamination import contamination_row
    from trine.inspect.episodes import episode_rows, play_episodes
    from trine.inspect.probes import CheckRow, fidelity_row, logprob_rows, mask_row, template_rows
    from trine.inspect.reward_probes import reward_probe_row
    from trine.threads import threads_for

    started = time.perf_counter()
    seed = cfg.seed if seed is None else seed
    with threads_for(cfg.num_threads, say=_stderr):  # as the run does; restored after
        model, tokenizer = load_policy(cfg)
        model.eval()
        opening, sampling = _opening(cfg)
        rows = template_rows(tokenizer, opening, _stop_ids(model, tokenizer))
        samples, why = _sample(cfg, model, tokenizer, opening, sampling, turns, seed, max_tokens)
        conversation: list[Span] = []
        if tolerance is None:
            dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
            tolerance = TOLERANCE.get(dtype, TOLERANCE["bfloat16"])
        if samples:
            rows.append(fidelity_row(tokenizer, samples[0]))
            mask, conversation = mask_row(tokenizer, samples[0])
            rows.append(mask)
            for sample in samples:
                rows += logprob_rows(model, tokenizer, sample, tolerance)
        else:
            for name in ("multi-turn token fidelity", "action-mask alignment", "engine vs trainer logprobs"):
                rows.append(CheckRow(name, "SKIP", "-", why))
        played = play_episodes(cfg, model, tokenizer, episodes, seed) if episodes else []
        rows += episode_rows(played, tolerance)
        rows.append(reward_probe_row(cfg))
        rows.append(contamination_row(cfg, config or "CONFIG"))
    param = next(model.parameters())
    return CheckReport(
        config=config,
        model=cfg.model.path,
        dtype=str(param.dtype).removeprefix("torch."),
        device=str(param.device),
        seed=seed,
        turns=turns,
        rows=rows,
        conversation=conversation,
        episodes=played,
        seconds=time.perf_counter() - started,
    )


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)  # stdout is the report (``--json``: one JSON object)


def _opening(cfg: RunConfig) -> tuple[list[dict[str, Any]], SamplingParams]:
    """The first train task's chat (with its workflow's ``system_prompt`` when the task has none, without a
    supervised row's answer) and its sampling settings."""
    from trine.build import build_taskset

    tasks = build_taskset(cfg.tasks.train.model_copy(update={"limit": 1}))
    if not len(tasks):
        raise ValueError(
            f"tasks.train ({cfg.tasks.train.origin}) has no usable row; trine check opens its conversation "
            "with the first one. Check the file and its prompt_key / messages_key."
        )
    task = tasks[0]
    opening = task.messages()
    system = task.workflow_args.get("system_prompt")  # a multi-turn workflow's own system prompt
    if isinstance(system, str) and system and not any(m.get("role") == "system" for m in opening):
        opening.insert(0, {"role": "system", "content": system})
    while len(opening) > 1 and opening[-1].get("role") == "assistant":
        opening.pop()
    return opening, task.sampling


def _sample(
    cfg: RunConfig,
    model: Any,
    tokenizer: Any,
    opening: list[dict[str, Any]],
    base: SamplingParams,
    turns: int,
    seed: int,
    max_tokens: int,
) -> tuple[list[Sampled], str]:
    """The sampled conversations (plain, top-p, top-k) or, when a Trajectory cannot be built with this
    tokenizer, none and why."""
    from trine import registry
    from trine.inspect.probes import sample_conversations

    engine = registry.resolve("engine", cfg.model.engine)(
        model, tokenizer, max_batch_size=cfg.explorer.max_batch_size, seed=seed
    )
    try:
        variants = sampling_variants(base, max_tokens)
        return asyncio.run(sample_conversations(engine, tokenizer, opening, variants, turns, seed)), ""
    except ValueError as err:  # no (prefix-consistent) chat template: template_rows says more
        short = str(err) if len(str(err)) <= 100 else str(err)[:100] + "..."
        return [], f"no multi-turn conversation can be built: {short}"
    finally:
        engine.close()


def sampling_variants(base: SamplingParams, max_tokens: int) -> list[tuple[str, SamplingParams, bool]]:
    """``(label, params, configured)``: plain sampling (no truncation), top-p and top-k. Truncation values
    are the config's when it sets them (``configured``), else 0.9 / 20 to show their effect. A greedy config
    is sampled at temperature 1 so the sampler's distribution is exercised."""
    temperature = base.temperature or 1.0
    plain = base.replace(
        n=1, max_tokens=min(base.max_tokens, max_tokens), temperature=temperature, top_p=1.0, top_k=0
    )
    top_p = base.top_p if base.top_p < 1 else 0.9
    top_k = base.top_k if base.top_k > 0 else 20
    return [
        ("plain", plain, True),
        (f"top_p={top_p:g}", plain.replace(top_p=top_p), base.top_p < 1),
        (f"top_k={top_k}", plain.replace(top_k=top_k), base.top_k > 0),
    ]


def _stop_ids(model: Any, tokenizer: Any) -> set[int]:
    """The token ids the built-in engine stops on: the generation config's eos ids and the tokenizer's."""
    config = getattr(model, "generation_config", None)
    ids = getattr(config, "eos_token_id", None)
    found = set([ids] if isinstance(ids, int) else list(ids or []))
    if tokenizer.eos_token_id is not None:
        found.add(tokenizer.eos_token_id)
    return found


# ---------------------------------------------------------------------------------------------- estimate
IMPORT_SECONDS = 4.0
"""Importing torch and transformers and starting the engine, measured on a 2-core CPU."""
_WIDTH = {"float32": 4, "float16": 2, "bfloat16": 2}


def estimate(cfg: RunConfig, turns: int, max_tokens: int, episodes: int = 2) -> str:
    """What ``trine check`` is about to do and about how long it will take, to say before it starts (nothing
    is loaded: the model's size comes from its weight files or its preset). The rates are measured on a
    2-core CPU (tiny-1m, 3 turns of 6 tokens: ~8 s, half of it importing torch and transformers): per
    sampled token a fixed cost plus reading every weight once; the range is half to twice the estimate.
    The ``episodes`` are counted as one turn of the train taskset's ``max_tokens`` each (a multi-turn game
    takes longer)."""
    params = _parameters(cfg)
    device = cfg.model.device
    gpu = device.startswith("cuda") or (device == "auto" and Path("/dev/nvidiactl").exists())
    size = params * (2 if gpu or cfg.model.dtype in ("bfloat16", "float16") else 4)  # bytes as loaded
    train = cfg.tasks.train
    tokens = min(max_tokens, train.sampling.max_tokens) if train is not None else max_tokens
    steps = 3 * turns * (tokens + 2)  # plain, top-p and top-k conversations; each turn also a trainer forward
    steps += episodes * ((train.sampling.max_tokens if train is not None else tokens) + 2)
    per_step = 0.03 + size / 5e11 if gpu else 0.05 + size / 3e9
    seconds = IMPORT_SECONDS + 0.5 + size / 3e8 + steps * per_step
    return (
        f"trine check: loads {cfg.model.path} ({params / 1e6:.1f}M parameters) and samples 3 conversations of "
        f"{turns} turn(s), up to {tokens} tokens each, and plays {episodes} episode(s) of the configured "
        f"workflow, on the {'GPU' if gpu else 'CPU'}: expect about "
        f"{_duration(seconds)} ({_duration(seconds / 2)} to {_duration(seconds * 2)})"
    )


def _parameters(cfg: RunConfig) -> int:
    """The policy's parameter count: from its preset when ``model.init_preset`` will build it, else the size
    of its weight files over the width of the dtype its config.json names (float32 if none)."""
    import json

    path = Path(cfg.model.path)
    if not path.exists() and cfg.model.init_preset:
        from trine import registry
        from trine.models.tiny import estimate_parameters

        return estimate_parameters(**registry.resolve("model_preset", cfg.model.init_preset))
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    width = _WIDTH.get(str(config.get("torch_dtype") or config.get("dtype")), 4)
    files = [*path.glob("*.safetensors"), *path.glob("pytorch_model*.bin")]
    return sum(f.stat().st_size for f in files) // width


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


# ---------------------------------------------------------------------------------------------- printing
_STYLE = {"OK": "green", "WARN": "yellow", "FAIL": "bold red", "INFO": "cyan", "SKIP": "dim"}


def print_report(report: CheckReport, console: Any = None) -> None:
    """Print the real episodes (trained tokens highlighted, masked ones marked: :func:`print_episodes`) and
    the table of checks."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    console.print(
        f"trine check {report.config}: model {report.model} ({report.dtype}, {report.device}), "
        f"{report.turns} turn(s), seed {report.seed}"
    )
    print_episodes(report.episodes, console)
    table = Table(title="trine check", show_lines=False)
    for col, ratio in (("check", 3), ("result", 1), ("value", 3), ("detail", 7)):
        table.add_column(col, overflow="fold", ratio=ratio, no_wrap=col == "result")
    for row in report.rows:
        table.add_row(row.check, Text(row.result, style=_STYLE[row.result]), row.value, row.detail)
    console.print(table)
    for note in dict.fromkeys(r.note for r in report.rows if r.note):
        console.print(f"[dim]- {note}[/]")
    verdict = "FAILED" if report.failed else "OK"
    style = "bold red" if report.failed else "bold green"
    console.print(f"[{style}]{verdict}[/] ({report.seconds:.1f}s)")


def print_episodes(episodes: list[Episode], console: Any) -> None:
    """Each episode's experiences with their trained and masked tokens (:func:`~trine.inspect.mask_view.
    print_spans`), reward and reward parts."""
    from trine.inspect.mask_view import print_spans

    for k, ep in enumerate(episodes, 1):
        head = f"episode {k} ({ep.workflow}, task {ep.task_id})"
        if ep.skipped:
            console.print(f"{head}: skipped ({ep.skipped})", markup=False, highlight=False)
            continue
        for j, step in enumerate(ep.steps, 1):
            parts = ", ".join(f"{name} {v:g}" for name, v in step.parts.items())
            reward = "pending" if step.reward is None else f"{step.reward:g}"
            where = f", experience {j}/{len(ep.steps)}" if len(ep.steps) > 1 else ""
            title = f"{head}{where}: reward {reward}" + (f" ({parts})" if parts else "")
            print_spans(console, step.spans, title)
