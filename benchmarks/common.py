"""Shared helpers of the benchmark scripts: tiny models, side-by-side timing, tables, RESULTS.md.

Every script measures its sides **alternately** (A B A B ...) after a warm-up and reports
medians, because these machines are noisy; ratios are always taken within one run.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "RESULTS.md"
CACHE = ROOT / "benchmarks" / ".cache"


def tiny_model(preset: str) -> Path:
    """A tiny model built once into benchmarks/.cache (not committed)."""
    from trine.models import init_model

    path = CACHE / preset
    if not (path / "config.json").exists():
        init_model(preset, path, seed=0, overwrite=True)
    return path


def threads(n: int = 2) -> None:
    torch.set_num_threads(n)


def alternate(sides: dict[str, Callable[[], float]], rounds: int, warmup: int = 1) -> dict[str, list[float]]:
    """Run each side ``warmup`` times, then ``rounds`` times in turn (A B A B ...).

    Each side returns the quantity it measured (seconds, or a rate). Returns every round's value.
    """
    for _ in range(warmup):
        for fn in sides.values():
            fn()
    out: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(rounds):
        for name, fn in sides.items():
            out[name].append(fn())
    return out


def timed(fn: Callable[[], object]) -> float:
    """Wall seconds of ``fn()``; on a GPU machine the device is synchronised at both ends."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def median(values: list[float]) -> float:
    return statistics.median(values)


def machine() -> str:
    return (
        f"{platform.machine()} {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), Python {sys.version.split()[0]}, "
        f"{'CUDA ' + torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'CPU only'}"
    )


def markdown_table(headers: list[str], rows: list[list[object]]) -> str:
    def cell(v: object) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def report(title: str, table: str, notes: str = "", write: bool = True) -> None:
    """Print the table and append it, dated, with the machine, to benchmarks/RESULTS.md."""
    stamp = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    block = f"### {title}\n\n{stamp} — {machine()}\n\n{table}\n"
    if notes:
        block += f"\n{notes}\n"
    print(block)
    if write:
        with RESULTS.open("a", encoding="utf-8") as f:
            f.write("\n" + block)
