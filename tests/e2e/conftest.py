"""Fixtures of the end-to-end tests: an arithmetic config writer and the SFT warm-up checkpoint, and the
hook that marks every test here ``slow`` (plain helpers, such as ``trine_process`` and
``run_crashing_after_step``, are in :mod:`tests.helpers`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import EXAMPLE, write_arithmetic_config, write_config


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test here runs the real loop, real processes or a CLI run: all are ``slow`` (DESIGN §6), so
    ``pytest -m "not slow"`` (the development loop) leaves the whole directory out."""
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def arithmetic_config(tmp_path, tiny_model_dir):
    """Write an arithmetic config (GRPO by default) with ``overrides`` merged in; returns its path."""

    def make(overrides: dict | None = None, name: str = "run") -> Path:
        return write_arithmetic_config(tmp_path, tiny_model_dir, name, overrides)

    return make


@pytest.fixture(scope="session")
def sft_start(tmp_path_factory):
    """tiny-1m after the main job's SFT warm-up (200 steps at a constant 3e-3): ~20-30% avg@8, room to
    learn. Trained once per session, also when pytest-xdist runs the tests in several workers."""
    from tests.helpers import shared_once

    def train(root: Path) -> Path:
        from trine.config import load_config
        from trine.loop import run

        cfg = {
            "name": "sft",
            "run_dir": str(root / "run"),
            "seed": 0,
            "num_threads": 1,
            "mode": "train",
            "model": {"path": str(root / "model"), "init_preset": "tiny-1m"},
            "algorithm": {"name": "sft"},
            "tasks": {
                "batch_size": 16,
                "total_steps": 200,
                "train": {"path": str(EXAMPLE / "data" / "train.jsonl")},
            },
            "trainer": {"lr": 3e-3},
            "eval": {"at_start": False},
            "monitor": {"sinks": ["jsonl"], "plot": False},
        }
        run(load_config(write_config(root / "sft.yaml", cfg)))
        return root / "run" / "checkpoints" / "step_200"

    return shared_once(tmp_path_factory, "sft-start", train)
