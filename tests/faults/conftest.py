"""Fixtures of the fault-injection tests: a tiny arithmetic config and helpers to run and read a run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import write_arithmetic_config

FAULT_DEFAULTS = {
    "num_threads": 1,
    "tasks": {"batch_size": 8, "total_steps": 2, "train": {"repeat": 2}},
    "explorer": {"timeout": 1.0, "reward_timeout": 0.5, "max_retries": 0},
}


@pytest.fixture
def fault_config(tmp_path, tiny_model_dir):
    """Write a tiny GRPO config over the arithmetic data with ``overrides`` merged in; returns its path.

    Small timeouts (``explorer.timeout`` 1 s, ``reward_timeout`` 0.5 s, no retries) keep a run with
    hanging plugins to seconds.
    """

    def make(overrides: dict | None = None, name: str = "run") -> Path:
        return write_arithmetic_config(tmp_path, tiny_model_dir, name, FAULT_DEFAULTS, overrides)

    return make


def run_dir_of(config: Path) -> Path:
    return Path(yaml.safe_load(config.read_text())["run_dir"])


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def step_metrics(run_dir: Path) -> list[dict]:
    """The training steps' lines of metrics.jsonl (those with explorer counters), in order."""
    return [m for m in read_jsonl(run_dir / "metrics.jsonl") if "explorer/tasks" in m]


def status(run_dir: Path) -> dict:
    return json.loads((run_dir / "status.json").read_text())


def trine_run(config: Path, plugin: Path, timeout: float = 240) -> tuple[subprocess.CompletedProcess, float]:
    """``trine run CONFIG --plugin PLUGIN`` in a fresh process; returns it and its wall time."""
    script = Path(sys.executable).with_name("trine")  # the console script, as a user runs it
    command = [str(script)] if script.exists() else [sys.executable, "-m", "trine.cli"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    proc = subprocess.run(
        [*command, "run", str(config), "--plugin", str(plugin)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    return proc, time.monotonic() - start
