"""Fixtures of the end-to-end tests: an arithmetic config writer, the SFT warm-up checkpoint, and helpers
to start a ``trine`` child process or crash a run (plain helpers are in :mod:`tests.helpers`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# EXAMPLE and read_metrics re-exported: tests written before tests/helpers.py import them from here
from tests.helpers import EXAMPLE, read_metrics, write_arithmetic_config, write_config  # noqa: F401


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


def trine_process(*args: str, unbuffered: bool = False) -> subprocess.Popen:
    """``trine ARGS`` as a child process in its own session (output piped, one torch thread, Ray's local
    auth off); ``unbuffered`` for tests that time each printed line."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    return subprocess.Popen(
        [sys.executable, "-m", "trine.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )


@pytest.fixture(scope="session")
def sft_start(tmp_path_factory):
    """tiny-1m after the main job's SFT warm-up (200 steps): ~20-30% avg@8, room to learn."""
    from trine.config import load_config
    from trine.loop import run

    root = tmp_path_factory.mktemp("sft-start")
    cfg = {
        "name": "sft",
        "run_dir": str(root / "run"),
        "seed": 0,
        "num_threads": 2,
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


class Crash(RuntimeError):
    """A simulated crash of the trainer."""


def run_crashing_after_step(config: Path, step: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run ``config`` until the trainer has logged ``step``, then crash it (the next step's batch may be
    explored already, not trained); the run directory is left as a crash leaves it."""
    import trine.stage
    from trine.config import load_config
    from trine.loop import run

    consume = trine.trainer.side.TrainerSide.consume

    def crash_after(side):
        if side.version == step:
            raise Crash(f"simulated crash after step {step}")
        return consume(side)

    monkeypatch.setattr(trine.trainer.side.TrainerSide, "consume", crash_after)
    with pytest.raises(Crash):
        run(load_config(config))
    monkeypatch.undo()
