"""Shared pytest fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``tiny-0.5m`` model + tokenizer built once per test session (HF format, float32, seed 0).

    Treat it as read-only: copy it (``shutil.copytree``) before changing anything inside.
    """
    from trine.models.tiny import init_model

    return init_model("tiny-0.5m", tmp_path_factory.mktemp("models") / "tiny-0.5m", seed=0)
