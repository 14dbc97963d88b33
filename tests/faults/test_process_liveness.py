"""Each side of an async run as processes notices the other is gone (:mod:`trine.launch.liveness`):
real ``trine train`` and ``trine explore`` processes, one side killed with SIGKILL.

- the trainer killed and not restarted: every explorer stops within ``sync.wait_timeout`` with exit
  code 1, saying what it saw and how to continue, and its ``status.json`` says ``failed``;
- the trainer killed and restarted at once: the explorers go on and the run finishes;
- every explorer killed: the trainer stops within ``sync.wait_timeout``, naming each explorer.

The bound asserted is ``wait_timeout`` + :data:`SLACK` (a loaded 2-core machine), never tighter.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers import jsonl_rows, run_status, trine, wait_built, write_arithmetic_config

pytestmark = pytest.mark.slow

WAIT = 10.0
"""``sync.wait_timeout`` of the tests that wait for a dead side (small: the test waits that long)."""
SLACK = 15.0
"""Seconds allowed past ``wait_timeout`` for noticing, closing and exiting."""


def _config(tmp_path: Path, model: Path, wait: float) -> Path:
    return write_arithmetic_config(
        tmp_path,
        model,
        "live",
        {
            "mode": "async",
            "launch": "processes",
            "num_threads": 1,
            "tasks": {"batch_size": 2, "total_steps": 40, "train": {"repeat": 2}},
            "buffer": {"storage": "sql", "max_staleness": 1},  # explorers wait for the trainer's steps
            "trainer": {"save_every": 2},
            "explorer": {"instances": 2},
            "sync": {"wait_timeout": wait},
        },
    )


def _start(config: Path, built_first: bool = False) -> tuple[subprocess.Popen, list[subprocess.Popen]]:
    """The trainer and two explorers; ``built_first``: the trainer starts once both explorers are built
    (under load one explorer's start-up outlasted a 6-step run that the other fed alone)."""
    explorers = [trine("explore", str(config), "--explorer-id", str(i), "--explorers", "2") for i in (0, 1)]
    if built_first:
        for i, proc in enumerate(explorers):
            wait_built(proc, config.with_suffix("") / "explorers" / str(i) / "status.json")
    return trine("train", str(config)), explorers


def _wait_for_steps(run_dir: Path, procs: list[subprocess.Popen], steps: int, limit: float = 240.0) -> None:
    """Until the trainer has trained ``steps`` steps and every explorer has put a batch."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        for proc in procs:
            assert proc.poll() is None, f"{proc.args[3:]} ended early:\n{proc.stdout.read()}"
        trained = [r for r in _rows(run_dir / "metrics.jsonl") if "trainer/loss" in r]
        explored = [_rows(run_dir / "explorers" / str(i) / "metrics.jsonl") for i in (0, 1)]
        if len(trained) >= steps and all(explored):
            return
        time.sleep(0.2)
    _kill_all(procs)
    raise AssertionError(f"the run did not reach step {steps} with both explorers producing in {limit}s")


def _rows(path: Path) -> list[dict]:
    try:
        return jsonl_rows(path)
    except (OSError, ValueError):  # not there yet, or a line half written
        return []


def _kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _kill_all(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            _kill(proc)


def _ends_within(proc: subprocess.Popen, seconds: float, what: str) -> str:
    """``proc``'s output once it ended; fails (killing it) when it is still running after ``seconds``."""
    try:
        out, _ = proc.communicate(timeout=max(seconds, 1.0))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
        raise AssertionError(f"{what} was still running {seconds:.0f}s later:\n{out}") from None
    return out


def test_explorers_stop_when_the_trainer_is_killed(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "live"
    trainer, explorers = _start(_config(tmp_path, tiny_model_dir, WAIT))
    try:
        _wait_for_steps(run_dir, [trainer, *explorers], 2)
        _kill(trainer)
        killed = time.monotonic()
        for i, proc in enumerate(explorers):
            left = WAIT + SLACK - (time.monotonic() - killed)
            out = _ends_within(proc, left, f"explorer {i}, its trainer killed {WAIT:.0f}s wait_timeout ago,")
            assert proc.returncode not in (0, None), out
            assert f"the trainer (pid {trainer.pid}" in out and "is gone" in out, out
            assert "waited" in out and "trine train" in out and "trine explore" in out, out
            status = run_status(run_dir / "explorers" / str(i))
            assert status["state"] == "failed" and "the trainer" in status["error"], status
    finally:
        _kill_all([trainer, *explorers])


def test_explorers_go_on_with_a_trainer_restarted_in_time(tmp_path, tiny_model_dir):
    run_dir, config = tmp_path / "live", _config(tmp_path, tiny_model_dir, wait=60.0)
    trainer, explorers = _start(config, built_first=True)
    try:
        _wait_for_steps(run_dir, [trainer, *explorers], 2)
        _kill(trainer)
        trainer = trine("train", str(config))  # within wait_timeout: the explorers pick it up
        out, _ = trainer.communicate(timeout=300)
        assert trainer.returncode == 0, out
        for i, proc in enumerate(explorers):
            said = _ends_within(proc, 60.0, f"explorer {i} after the run finished")
            assert proc.returncode == 0 and "the trainer's run ended" in said, said
        assert run_status(run_dir)["state"] == "finished"
    finally:
        _kill_all([trainer, *explorers])


def test_the_trainer_stops_when_every_explorer_is_killed(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "live"
    trainer, explorers = _start(_config(tmp_path, tiny_model_dir, WAIT))
    try:
        _wait_for_steps(run_dir, [trainer, *explorers], 2)
        for proc in explorers:
            _kill(proc)
        killed = time.monotonic()
        out = _ends_within(trainer, WAIT + SLACK, "the trainer, its explorers killed")
        assert trainer.returncode not in (0, None), out
        for i, proc in enumerate(explorers):
            assert f"explorer {i} (pid {proc.pid}" in out, out
        assert "is gone" in out and "trine explore" in out, out
        status = run_status(run_dir)
        assert status["state"] == "failed" and "explorer 0" in status["error"], status
        assert time.monotonic() - killed <= WAIT + SLACK
    finally:
        _kill_all([trainer, *explorers])
