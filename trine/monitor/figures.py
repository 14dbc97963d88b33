"""What every Trine plot shares: the colour cycle, a figure (matplotlib's ``Figure``, no pyplot: safe in
threads and servers) and writing it as a titled PNG. Used by :mod:`~trine.monitor.plot` and
:mod:`~trine.monitor.process_plot`."""

from __future__ import annotations

import threading
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


def preload() -> threading.Thread:
    """Import matplotlib's ``Figure`` and its Agg backend in a daemon thread, so that the plots drawn at a
    run's end (:func:`trine.monitor.plot.plot_run`) do not wait for the import (~0.7 s on a 2-core CPU,
    half of drawing a short run's plots). The import runs while the run's first steps run, mostly in torch
    kernels that release the GIL; a run that ends before it finished simply waits for it in the import."""

    def load() -> None:
        import matplotlib.backends.backend_agg  # noqa: F401
        import matplotlib.figure  # noqa: F401

    thread = threading.Thread(target=load, name="trine-plot-import", daemon=True)
    thread.start()
    return thread
