"""Trine: reinforcement fine-tuning of language models (explorer → buffer → trainer).

The public API is imported lazily so ``import trine`` (and ``trine --help``) stays fast.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Task": "trine.types",
    "Experience": "trine.types",
    "SamplingParams": "trine.types",
    "Completion": "trine.types",
    "register": "trine.registry",
    "RunConfig": "trine.config",
    "load_config": "trine.config",
    "run": "trine.loop",
    "Workflow": "trine.workflows",
    "Algorithm": "trine.algorithms",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'trine' has no attribute {name!r}")
