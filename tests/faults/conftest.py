"""Fixtures of the fault-injection tests: a tiny arithmetic config (helpers to run and read a run, such as
``trine_run`` and ``step_metrics``, are in :mod:`tests.helpers`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import write_arithmetic_config

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
