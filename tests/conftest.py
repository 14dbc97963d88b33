"""Shared pytest fixtures and the ``gpu`` marker's skip rule."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``@pytest.mark.gpu`` tests where torch sees no CUDA device (CPU-only machines, CI)."""
    if not any("gpu" in item.keywords for item in items):
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``tiny-0.5m`` model + tokenizer built once per test session (HF format, float32, seed 0).

    Treat it as read-only: copy it (``shutil.copytree``) before changing anything inside.
    """
    from trine.models.tiny import init_model

    return init_model("tiny-0.5m", tmp_path_factory.mktemp("models") / "tiny-0.5m", seed=0)


EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "arithmetic"
"""The main job's example directory (its shipped arithmetic tasksets)."""


def write_arithmetic_config(tmp_path: Path, model_dir: Path, name: str, *overrides: dict | None) -> Path:
    """Write a tiny GRPO config over the shipped arithmetic data into ``tmp_path/<name>.yaml`` (run
    directory ``tmp_path/<name>``) with each of ``overrides`` merged in, in order; returns its path."""
    import yaml

    from trine.config import merge

    data = {
        "name": name,
        "run_dir": str(tmp_path / name),
        "seed": 0,
        "num_threads": 2,
        "model": {"path": str(model_dir)},
        "tasks": {
            "batch_size": 4,
            "total_steps": 6,
            "train": {
                "path": str(EXAMPLE / "data" / "train.jsonl"),
                "repeat": 4,
                "sampling": {"temperature": 1.0, "max_tokens": 4},
            },
        },
        "trainer": {"lr": 1e-3},
        "eval": {"at_start": False},
        "monitor": {"sinks": ["jsonl"], "plot": False},
    }
    for extra in overrides:
        data = merge(data, extra or {})
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path
