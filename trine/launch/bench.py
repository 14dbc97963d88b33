"""``trine bench``: evaluate the checkpoints of a run on its eval tasksets.

Each checkpoint's weights are loaded (:func:`trine.build.load_policy`) and evaluated by the same
:class:`~trine.explorer.evaluator.Evaluator` a run builds (:func:`trine.build.build_evaluator`), with the eval
settings of the checkpoint's stage (``stage_index`` in its ``loop_state.pt``) and the seed
``seed + step``: benching the checkpoint of a step where the run evaluated reproduces the run's
``eval/*`` numbers.

One line per evaluated checkpoint is appended to ``<run_dir>/bench.jsonl``: ``step``, ``stage``,
``checkpoint``, ``settings`` (a digest of the eval settings), ``saved_ns`` (when the checkpoint was
written), ``stage_start`` (the global step its stage began after: where the plot puts the stage boundary)
and the ``eval/<taskset>/*`` metrics. A checkpoint already there with the same settings and
write time is not evaluated again unless ``force``. ``<run_dir>/plots/bench.png`` is redrawn from it.

Safe on a run that is still training: only complete checkpoints are listed
(:func:`trine.trainer.checkpoint.list_checkpoints`), one removed meanwhile (``keep_checkpoints``
rotation) is skipped with a warning, and nothing but ``bench.jsonl`` and the plot is written (no lock,
no status change).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trine.config import RunConfig

BENCH_FILE = "bench.jsonl"


class BenchError(Exception):
    """Bad input to ``trine bench``: no eval tasksets, no checkpoints, an unknown step."""


@dataclass(frozen=True)
class BenchRow:
    """The metrics of one checkpoint: evaluated now, or read back from ``bench.jsonl`` (``cached``)."""

    step: int
    stage: str
    checkpoint: str
    settings: str
    """Digest of the eval settings the metrics were measured with (:func:`eval_settings`)."""
    saved_ns: int
    """When the checkpoint was written (its ``loop_state.pt``'s mtime): a re-run's step_N is not the same."""
    metrics: dict[str, float]
    seconds: float = 0.0
    cached: bool = False
    stage_start: int | None = None
    """The global step the checkpoint's stage began after (its ``global_step`` − ``stage_step``): the
    stage boundary of the plot lies just after it, however sparse the checkpoints are."""

    def line(self) -> dict[str, Any]:
        """The ``bench.jsonl`` record (metrics flat, like ``metrics.jsonl``'s ``eval/*`` keys)."""
        head = {"step": self.step, "stage": self.stage, "checkpoint": self.checkpoint}
        head.update(settings=self.settings, saved_ns=self.saved_ns, stage_start=self.stage_start)
        return {**head, **self.metrics, "bench/seconds": round(self.seconds, 3)}


@dataclass
class BenchResult:
    """What :func:`bench` did: a row per selected checkpoint that has metrics, and its notes."""

    run_dir: Path
    rows: list[BenchRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Checkpoints skipped (already benched, removed meanwhile, a stage without eval tasksets)."""
    plot: Path | None = None


def run_dir_of(stages: list[RunConfig], run_dir: str | Path | None = None) -> Path:
    """The run directory of ``stages`` (as ``trine run`` picks it), unless ``run_dir`` is given."""
    if run_dir is not None:
        return Path(run_dir)
    return stages[0].run_path


def select_checkpoints(run_dir: Path, which: str) -> list[tuple[int, Path]]:
    """(step, path) of the complete checkpoints ``which`` names: ``all``, ``latest`` or ``2,4,...``."""
    from trine.trainer.checkpoint import list_checkpoints

    found = {int(p.name.removeprefix("step_")): p for p in list_checkpoints(run_dir / "checkpoints")}
    if not found:
        raise BenchError(
            f"no checkpoints in {str(run_dir / 'checkpoints')!r}; bench evaluates the checkpoints of a run "
            f"(run it first, with trainer.save_every for intermediate ones, or pass --run-dir)."
        )
    if which == "all":
        return sorted(found.items())
    if which == "latest":
        return [max(found.items())]
    try:
        steps = [int(s) for s in which.split(",") if s.strip()]
    except ValueError:
        steps = []
    if not steps:
        raise BenchError(f"--checkpoints {which!r}: expected all, latest or comma-separated steps (2,4).")
    missing = [s for s in steps if s not in found]
    if missing:
        raise BenchError(
            f"--checkpoints: no checkpoint for step(s) {missing} in {str(run_dir / 'checkpoints')!r}; "
            f"the steps there are {sorted(found)}."
        )
    return [(s, found[s]) for s in dict.fromkeys(steps)]


def eval_settings(cfg: RunConfig) -> str:
    """A digest of what evaluation results depend on: eval section, eval tasksets, seed, engine."""
    settings = {
        "eval": cfg.eval.model_dump(mode="json", exclude={"every", "at_start"}),
        "tasksets": [t.model_dump(mode="json") for t in cfg.tasks.eval],
        "seed": cfg.seed,
        "model": cfg.model.model_dump(mode="json", include={"engine", "dtype", "device"}),
        "max_batch_size": cfg.explorer.max_batch_size,
    }
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def read_bench(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``run_dir/bench.jsonl`` ([] when there is none)."""
    from trine.monitor.sinks import read_metrics

    path = run_dir / BENCH_FILE
    return read_metrics(path) if path.is_file() else []


def bench(
    stages: list[RunConfig],
    *,
    checkpoints: str = "all",
    run_dir: str | Path | None = None,
    force: bool = False,
    say: Callable[[str], None] = print,
) -> BenchResult:
    """Evaluate the checkpoints ``checkpoints`` names (see :func:`select_checkpoints`) of the run of
    ``stages``; ``say`` gets a line per checkpoint (evaluating, already benched, skipped) and the torch
    threads chosen (:mod:`trine.threads`)."""
    from trine.threads import threads_for

    if not any(cfg.tasks.eval for cfg in stages):
        raise BenchError(
            "the config has no eval tasksets (tasks.eval is empty); bench evaluates checkpoints on them: "
            "add tasks.eval: [{path: ...}] to the config."
        )
    result = BenchResult(run_dir_of(stages, run_dir))
    selected = select_checkpoints(result.run_dir, checkpoints)
    done = {(r.get("step"), r.get("settings"), r.get("saved_ns")): r for r in read_bench(result.run_dir)}
    with threads_for(stages[0].num_threads, say):  # as the run: CPU results depend on the thread count
        for step, path in selected:
            row = _bench_one(stages, step, path, done, force, result, say)
            if row is not None:
                result.rows.append(row)
    if result.rows:
        from trine.monitor.bench_plot import plot_bench

        result.plot = plot_bench(result.run_dir, with_stage_starts(read_bench(result.run_dir), result.rows))
    return result


def with_stage_starts(records: list[dict[str, Any]], rows: list[BenchRow]) -> list[dict[str, Any]]:
    """``records`` with the ``stage_start`` of ``rows`` filled in where a line lacks it (lines written
    before bench recorded it), so that their plot puts the stage boundary where the stage began."""
    starts = {r.step: r.stage_start for r in rows if r.stage_start is not None}
    return [
        {**r, "stage_start": starts[r["step"]]}
        if r.get("stage_start") is None and r.get("step") in starts
        else r
        for r in records
    ]


def _bench_one(
    stages: list[RunConfig],
    step: int,
    path: Path,
    done: dict[tuple[Any, Any, Any], dict[str, Any]],
    force: bool,
    result: BenchResult,
    say: Callable[[str], None],
) -> BenchRow | None:
    """Evaluate one checkpoint (or read it back from ``done``); None when it is skipped."""
    files = _files(path)
    try:
        saved_ns = (path / "loop_state.pt").stat().st_mtime_ns
        state = _loop_state(path)
        index = int(state.get("stage_index", 0))
    except Exception:  # re-raised unless the checkpoint was (partly) deleted meanwhile
        if not _gone(path, files):
            raise
        return _note(result, say, f"warning: step {step}: {path} was removed meanwhile (rotation); skipped")
    if index >= len(stages):
        raise BenchError(
            f"{path} is a checkpoint of stage index {index}, but the config has {len(stages)} stage(s); "
            "bench the run with the config it was run with."
        )
    cfg = stages[index]
    if not cfg.tasks.eval:
        return _note(result, say, f"step {step} (stage {cfg.stage}): that stage has no tasks.eval; skipped")
    settings = eval_settings(cfg)
    start = _stage_start(state, step)
    old = done.get((step, settings, saved_ns))
    if old is not None and not force:
        _note(result, say, f"step {step}: already in {BENCH_FILE} with these eval settings (--force to redo)")
        metrics = {k: v for k, v in old.items() if k.startswith("eval/")}
        return BenchRow(
            step, cfg.stage, str(path), settings, saved_ns, metrics, cached=True, stage_start=start
        )
    say(f"step {step} (stage {cfg.stage}): evaluating {path}")
    tick = time.perf_counter()
    try:
        metrics = evaluate_checkpoint(cfg, path, step)
    except Exception:  # re-raised unless the checkpoint was (partly) deleted meanwhile
        if not _gone(path, files):
            raise
        return _note(result, say, f"warning: step {step}: {path} was removed meanwhile (rotation); skipped")
    seconds = time.perf_counter() - tick
    row = BenchRow(step, cfg.stage, str(path), settings, saved_ns, metrics, seconds, stage_start=start)
    with (result.run_dir / BENCH_FILE).open("a", encoding="utf-8") as out:
        out.write(json.dumps(row.line()) + "\n")
    return row


def evaluate_checkpoint(cfg: RunConfig, path: Path, step: int) -> dict[str, float]:
    """The ``eval/<taskset>/*`` metrics of the weights in checkpoint ``path`` at global ``step``, as
    the run with stage config ``cfg`` evaluates them (same evaluator, seed ``cfg.seed + step``)."""
    from trine import build

    model, tokenizer = build.load_policy(cfg, path=str(path))
    explorer = build.build_eval_explorer(cfg, model, tokenizer)
    try:
        return build.build_evaluator(cfg, explorer).evaluate(step)
    finally:
        explorer.close()
        close = getattr(explorer.model, "close", None)  # the engine's worker thread
        if close is not None:
            close()


def _loop_state(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(path / "loop_state.pt", weights_only=False, map_location="cpu")


def _stage_start(state: dict[str, Any], step: int) -> int | None:
    """The global step the checkpoint's stage began after (None for a checkpoint that does not say)."""
    stage_step = state.get("stage_step")
    return int(state.get("global_step", step)) - int(stage_step) if isinstance(stage_step, int) else None


def _files(path: Path) -> set[str]:
    try:
        return {p.name for p in path.iterdir()}
    except OSError:
        return set()


def _gone(path: Path, files: set[str]) -> bool:
    """True when the checkpoint (whose entries were ``files``) is gone or partly deleted."""
    return not files or not files <= _files(path)


def _note(result: BenchResult, say: Callable[[str], None], text: str) -> None:
    result.notes.append(text)
    say(text)


def print_bench(result: BenchResult) -> None:
    """A table of the rows: one line per checkpoint, one column per ``eval/*`` metric (rates in percent)."""
    import sys

    from rich.console import Console
    from rich.table import Table

    from trine.monitor.summary import eval_cell

    keys = sorted({k for r in result.rows for k in r.metrics})
    table = Table(title=f"Trine bench: {result.run_dir}")
    for col in ("step", "stage", *(k.removeprefix("eval/") for k in keys), "source"):
        table.add_column(col, justify="left" if col in ("stage", "source") else "right")
    for r in sorted(result.rows, key=lambda r: r.step):
        values = [eval_cell(r.metrics.get(k), k) for k in keys]
        table.add_row(str(r.step), r.stage, *values, "cached" if r.cached else f"{r.seconds:.1f}s")
    console = Console(file=sys.stdout, width=None if sys.stdout.isatty() else 160)  # a log: never squeezed
    console.print(table)
    console.print(f"results: {result.run_dir / BENCH_FILE}", soft_wrap=True)
    if result.plot is not None:
        console.print(f"plot: {result.plot}", soft_wrap=True)
