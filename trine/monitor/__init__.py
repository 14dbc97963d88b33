"""Metric sinks (console, jsonl, tensorboard, wandb, mlflow), the Monitor that fans out to them, and plots.

``SINKS`` is the table of built-in sink names.

``plot_run`` is imported lazily (it pulls in matplotlib only when called).
"""

from __future__ import annotations

from typing import Any

from trine.monitor.sinks import ConsoleSink, JsonlSink, Monitor, TensorBoardSink, build_monitor, read_metrics
from trine.monitor.tracking import MlflowSink, WandbSink

SINKS: dict[str, type] = {
    "console": ConsoleSink,
    "jsonl": JsonlSink,
    "tensorboard": TensorBoardSink,
    "wandb": WandbSink,
    "mlflow": MlflowSink,
}

__all__ = [
    "SINKS",
    "ConsoleSink",
    "JsonlSink",
    "MlflowSink",
    "Monitor",
    "TensorBoardSink",
    "WandbSink",
    "build_monitor",
    "plot_run",
    "read_metrics",
]


def __getattr__(name: str) -> Any:
    if name == "plot_run":
        from trine.monitor.plot import plot_run

        return plot_run
    raise AttributeError(f"module 'trine.monitor' has no attribute {name!r}")
