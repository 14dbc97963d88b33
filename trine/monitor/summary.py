"""The run summary: what each stage's record keeps while the loop runs, and the table printed at its end.

A stage's record (``summary["stages"][stage]``, saved in every checkpoint so a resumed run keeps it) holds
its evaluation before and after (``eval_start`` / ``eval_end``), its seconds, and from :func:`track_step`
its step count and the first and last few values of its training reward and loss. :func:`print_summary`
shows the evaluation of a stage that has one, else what the stage trained: reward and loss (mean of the
first window → mean of the last), and its steps. Every mode prints the same table (``trine run``,
``trine train``, a Ray driver).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from trine.monitor.sinks import fmt_number, scalars

WINDOW = 10
"""Most steps averaged at each end of a stage for the training rows of the summary."""


def track_step(record: dict[str, Any], metrics: dict[str, Any], total_steps: int) -> None:
    """Count one step of a stage of ``total_steps`` in its summary ``record`` and keep the first and last
    values (``min(WINDOW, total_steps // 2)`` of each) of its reward (the explored batch's, else the trained
    batch's) and its loss."""
    numbers = scalars(metrics)
    record["steps"] = record.get("steps", 0) + 1
    window = max(1, min(WINDOW, total_steps // 2))
    explored = numbers.get("explorer/reward_mean")
    reward = (
        explored if explored is not None and math.isfinite(explored) else numbers.get("trainer/reward_mean")
    )
    train = record.setdefault("train", {})
    for name, value in (("reward", reward), ("loss", numbers.get("trainer/loss"))):
        if value is None or not math.isfinite(value):
            continue
        seen = train.setdefault(name, {"first": [], "last": []})
        if len(seen["first"]) < window:
            seen["first"].append(value)
        seen["last"] = [*seen["last"], value][-window:]


def summary_rows(rec: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(metric, start, end) rows of one stage's record: its evaluation (percentages) when it has one,
    else its training reward and loss (window means) and its step count."""
    start, end = rec.get("eval_start", {}), rec.get("eval_end", {})
    keys = sorted(set(start) | set(end))
    if keys:
        return [(key, eval_cell(start.get(key), key), eval_cell(end.get(key), key)) for key in keys]
    rows = []
    for name, seen in rec.get("train", {}).items():
        first, last = seen["first"], seen["last"]
        label = f"{name} (mean of {len(first)} step{'s' if len(first) > 1 else ''})"
        rows.append((label, fmt_number(_mean(first)), fmt_number(_mean(last))))
    if "steps" in rec:
        rows.append(("steps", "0", str(rec["steps"])))
    return rows or [("-", "-", "-")]


def print_summary(summary: dict[str, Any], file: Any = None) -> None:
    """The table printed at the end of a run (per stage: evaluation before/after, or the training reward,
    loss and steps; seconds), then the run directory and the plots."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Trine run summary")
    for col in ("stage", "metric", "start", "end", "seconds"):
        table.add_column(col, justify="left" if col in ("stage", "metric") else "right")
    for stage, rec in summary.get("stages", {}).items():
        for i, (metric, start, end) in enumerate(summary_rows(rec)):
            seconds = f"{rec.get('seconds', 0.0):.1f}" if i == 0 else ""
            table.add_row(stage if i == 0 else "", metric, start, end, seconds)
    console = Console(file=file or sys.stdout)
    console.print(table)
    console.print(f"run directory: {summary.get('run_dir')}", soft_wrap=True)
    if summary.get("plots"):
        console.print(f"plots: {Path(summary['plots'][0]).parent}", soft_wrap=True)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


COUNTS = ("return_mean", "invalid_actions", "turns_mean")
"""Eval metrics that are not rates (:mod:`trine.explorer.outcomes`): shown as numbers, not percentages."""


def eval_cell(value: float | None, key: str = "") -> str:
    """An ``eval/*`` value as a table shows it: a rate as a percentage, a count or return as a number."""
    if value is not None and key.endswith(COUNTS):
        return fmt_number(value)
    return "-" if value is None else f"{100 * value:.1f}%"
