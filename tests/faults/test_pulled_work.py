"""Explorer processes pull their tasks from the shared ledger (:mod:`trine.explorer.claims`), measured with
real processes on a latency-bound environment (every task waits ``LATENCY`` seconds before the model
answers, ``SLOWDOWN`` times longer in an explorer started with ``TRINE_TEST_SLOWDOWN``): two equal
explorers do at least 1.6x the tasks per second of one, and next to one 5x slower explorer a fast one does
most of the work, the two together at least as fast as the fast one alone. Tasks per second are counted
from the ledger's ``done_at`` over the time both explorers were putting. Measured here (2026-11-27, 2 cores):
one 9.1 tasks/s, two equal 17.4 (1.92x), fast next to 5x slow 10.7 (1.17x, the fast one 84 of 100 tasks)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, write_arithmetic_config

pytestmark = pytest.mark.slow

LATENCY = 0.4
STEPS = 30
PLUGIN = '''
import asyncio
import os

from trine.registry import register
from trine.workflows import SingleTurnWorkflow


@register("workflow", "latency_env")
class LatencyEnvironment(SingleTurnWorkflow):
    """Waits ``latency`` seconds (times TRINE_TEST_SLOWDOWN) before the model answers."""

    def __init__(self, reward, latency: float = 0.4) -> None:
        super().__init__(reward)
        self.latency = latency * float(os.environ.get("TRINE_TEST_SLOWDOWN", "1"))

    async def run(self, task, model):
        await asyncio.sleep(self.latency)
        return await super().run(task, model)
'''


def _setup(tmp_path: Path, model: Path, name: str, explorer: dict, steps: int = STEPS) -> tuple[Path, Path]:
    """The latency plugin file and an async processes config over it (``explorer``: that section)."""
    plugin = tmp_path / "latency_env.py"
    plugin.write_text(PLUGIN)
    overrides = {
        "mode": "async",
        "launch": "processes",
        "tasks": {
            "batch_size": 4,
            "total_steps": steps,
            "train": {"repeat": 2, "workflow": "latency_env", "workflow_args": {"latency": LATENCY}},
        },
        "trainer": {"batch_size": 8},
        "buffer": {"storage": "sql"},
        "explorer": explorer,
        "sync": {"wait_timeout": 120},
    }
    return plugin, write_arithmetic_config(tmp_path, model, name, overrides)


def _run(tmp_path: Path, model: Path, name: str, slowdowns: list[float]) -> dict[str, list[float]]:
    """A trainer and one explorer process per entry of ``slowdowns``, until the trainer's ``STEPS``; the
    ``done_at`` times of the tasks each explorer put."""
    plugin, config = _setup(tmp_path, model, name, {"instances": len(slowdowns)})
    base = [sys.executable, "-m", "trine.cli"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    n = str(len(slowdowns))
    procs = [subprocess.Popen([*base, "train", str(config), "--plugin", str(plugin)], cwd=ROOT, env=env)]
    for i, slowdown in enumerate(slowdowns):
        command = [
            *base,
            "explore",
            str(config),
            "--plugin",
            str(plugin),
            "--explorer-id",
            str(i),
            "--explorers",
            n,
        ]
        procs.append(subprocess.Popen(command, cwd=ROOT, env={**env, "TRINE_TEST_SLOWDOWN": str(slowdown)}))
    try:
        assert procs[0].wait(timeout=300) == 0
        for p in procs[1:]:
            assert p.wait(timeout=60) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    db = sqlite3.connect(tmp_path / name / "buffer.db")
    rows = db.execute("SELECT owner, done_at FROM experiences_tasks WHERE state = 'done'").fetchall()
    out: dict[str, list[float]] = {f"explorer-{i}": [] for i in range(len(slowdowns))}
    for owner, done_at in rows:
        out[owner].append(done_at)
    return out


def _window(done: dict[str, list[float]]) -> tuple[float, dict[str, int]]:
    """Seconds from when every explorer had put a task to the last task put, and the tasks each put then."""
    start = max(min(times) for times in done.values())
    end = max(t for times in done.values() for t in times)
    return end - start, {owner: sum(start < t <= end for t in times) for owner, times in done.items()}


def test_pulled_work_scales_with_explorers_and_a_slow_one_costs_nothing(tmp_path, tiny_model_dir):
    one = _window(_run(tmp_path, tiny_model_dir, "one", [1.0]))
    two = _window(_run(tmp_path, tiny_model_dir, "two", [1.0, 1.0]))
    slow = _window(_run(tmp_path, tiny_model_dir, "slow", [1.0, 5.0]))
    rate = {
        name: sum(n.values()) / seconds for name, (seconds, n) in (("one", one), ("two", two), ("slow", slow))
    }
    assert rate["two"] >= 1.6 * rate["one"], rate
    assert slow[1]["explorer-0"] >= 2 * slow[1]["explorer-1"], slow  # the fast one did most of the work
    assert rate["slow"] >= 0.95 * rate["one"], rate


def test_a_killed_explorers_claims_expire_and_the_other_takes_them(tmp_path, tiny_model_dir):
    """Explorer 0 is killed with SIGKILL (not restarted) while it holds claims: after its lease (3 s) they
    expire, explorer 1 claims them again, and the run finishes with every task done once."""
    import signal
    import time

    plugin, config = _setup(tmp_path, tiny_model_dir, "lease", {"instances": 2, "lease_seconds": 3}, steps=12)
    base = [sys.executable, "-m", "trine.cli"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    common = ["--plugin", str(plugin), "--explorers", "2"]
    trainer = subprocess.Popen([*base, "train", str(config), "--plugin", str(plugin)], cwd=ROOT, env=env)
    doomed = subprocess.Popen(
        [*base, "explore", str(config), *common, "--explorer-id", "0"], cwd=ROOT, env=env
    )
    db_path = tmp_path / "lease" / "buffer.db"
    deadline = time.monotonic() + 120
    held: list[int] = []
    while not held and time.monotonic() < deadline:  # explorer 0 holds claims: kill it there
        time.sleep(0.05)
        if db_path.exists():
            try:
                db = sqlite3.connect(db_path)
                held = [s for (s,) in db.execute("SELECT seq FROM experiences_tasks WHERE state = 'claimed'")]
            except sqlite3.OperationalError:  # the tables are being created
                pass
    assert held, "explorer 0 never claimed a task"
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait(timeout=30)
    survivor = subprocess.Popen(
        [*base, "explore", str(config), *common, "--explorer-id", "1"], cwd=ROOT, env=env
    )
    try:
        assert trainer.wait(timeout=300) == 0
        assert survivor.wait(timeout=60) == 0
    finally:
        for p in (trainer, survivor):
            if p.poll() is None:
                p.kill()
    db = sqlite3.connect(db_path)
    rows = {
        s: (state, owner, claim)
        for s, state, owner, claim in db.execute("SELECT seq, state, owner, claim FROM experiences_tasks")
    }
    assert all(rows[s][1] == "explorer-1" and rows[s][2] >= 2 for s in held if rows[s][0] == "done"), rows
    assert any(rows[s][0] == "done" for s in held)  # the killed explorer's tasks were done by the other
    kept = db.execute("SELECT task_seq, COUNT(*) FROM experiences GROUP BY task_seq").fetchall()
    assert all(n == 2 for _, n in kept), kept  # each task's rows stored once
