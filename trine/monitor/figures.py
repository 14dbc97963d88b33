"""What every Trine plot shares: the colour cycle, a figure (matplotlib's ``Figure``, no pyplot: safe in
threads and servers) and writing it as a titled PNG. Used by :mod:`~trine.monitor.plot` and
:mod:`~trine.monitor.process_plot`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]


def figure(size: tuple[float, float], dpi: int) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=size, dpi=dpi, layout="constrained")


def save(fig: Any, path: Path, run_name: str) -> Path:
    """Title the figure with the run name and write it as PNG."""
    fig.suptitle(f"run: {run_name}", fontsize=12, fontweight="bold")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
