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
