"""``plots/bench.png``: the eval metrics of a run's checkpoints against their step (``trine bench``).

Drawn with the eval panel of :mod:`trine.monitor.plot` (points joined by lines, stages shaded);
matplotlib is imported lazily, through ``matplotlib.figure.Figure`` only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trine.monitor.plot import PANELS, View, collect_series, draw_view, stage_regions


def plot_bench(run_dir: str | Path, records: list[dict[str, Any]], dpi: int = 120) -> Path | None:
    """Draw ``records`` (``bench.jsonl`` lines: ``step``, ``stage``, ``eval/*``; the last line of a step
    wins) into ``run_dir/plots/bench.png``; returns its path, or None when there is no eval metric."""
    from matplotlib.figure import Figure

    run_dir = Path(run_dir)
    series = collect_series(records)
    panel = next(p for p in PANELS if p.name == "eval")
    if not panel.matching(series):
        return None
    view = View(panel, "Eval metrics by checkpoint", series, stage_regions(records))
    fig = Figure(figsize=(8.5, 4.2), dpi=dpi, layout="constrained")
    draw_view(fig.add_subplot(1, 1, 1), view, smoothing=0)
    fig.suptitle(f"bench: {run_dir.name}", fontsize=12, fontweight="bold")
    path = run_dir / "plots" / "bench.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
