"""Explorer and trainer as separate processes (``trine explore`` ×2 + ``trine train``), each killed with
SIGKILL mid-run and started again: the run finishes, and the SQL buffer shows that no batch, task or task
sample was produced twice, none was lost, and every training step happened once."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers import jsonl_rows, trine, wait_built, write_arithmetic_config
from trine.trainer.checkpoint import list_checkpoints

pytestmark = pytest.mark.slow

STEPS = 10


def _config(tmp_path: Path, model: Path) -> Path:
    return write_arithmetic_config(
        tmp_path,
        model,
        "procs",
        {
            "mode": "async",
            "launch": "processes",
            "num_threads": 1,
            "tasks": {"batch_size": 2, "total_steps": STEPS, "train": {"repeat": 2}},
            "buffer": {"storage": "sql", "max_staleness": 2},
            "trainer": {"save_every": 2},
            "explorer": {"instances": 2},
            "sync": {"wait_timeout": 120},
        },
    )


def _explorer(config: Path, index: int) -> subprocess.Popen:
    return trine("explore", str(config), "--explorer-id", str(index), "--explorers", "2")


def _finish(proc: subprocess.Popen, what: str) -> str:
    out, _ = proc.communicate(timeout=240)
    assert proc.returncode == 0, f"{what} exited {proc.returncode}:\n{out}"
    return out


def _kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _freeze_trainer_mid_run(trainer: subprocess.Popen, run_dir: Path, limit: float = 120.0) -> int:
    """SIGSTOP the trainer once it has trained 3 steps and explorer 0 has put a batch; returns its step.
    Frozen, it holds its version, so the explorers soon wait on the staleness bound and the run cannot
    finish behind the test's back (explorer 1 alone can feed every step)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        assert trainer.poll() is None, f"the trainer ended early:\n{trainer.stdout.read()}"
        steps = [r["step"] for r in _rows(run_dir / "metrics.jsonl") if "trainer/loss" in r]
        if steps and steps[-1] >= 3 and _rows(run_dir / "explorers" / "0" / "metrics.jsonl"):
            os.killpg(trainer.pid, signal.SIGSTOP)
            return max(r["step"] for r in _rows(run_dir / "metrics.jsonl"))
        time.sleep(0.01)
    os.killpg(trainer.pid, signal.SIGKILL)
    raise AssertionError(f"the trainer did not reach step 3 with explorer 0 producing within {limit}s")


def _rows(path: Path) -> list[dict]:
    return jsonl_rows(path) if path.is_file() else []


def test_kill_9_the_trainer_and_an_explorer_then_restart_them(tmp_path, tiny_model_dir):
    config, run_dir = _config(tmp_path, tiny_model_dir), tmp_path / "procs"
    first = _explorer(config, 0)  # before the trainer: it waits for the first published weights
    wait_built(first, run_dir / "explorers" / "0" / "status.json")
    trainer = trine("train", str(config))
    second = _explorer(config, 1)
    frozen_at = _freeze_trainer_mid_run(trainer, run_dir)
    assert frozen_at < STEPS - 2, frozen_at
    _kill(first)  # mid-run: generating, or waiting on the frozen trainer's version
    first = _explorer(config, 0)
    _kill(trainer)
    checkpoint = int(list_checkpoints(run_dir / "checkpoints")[-1].name.removeprefix("step_"))
    assert frozen_at - 2 <= checkpoint <= frozen_at  # trainer.save_every: 2
    trainer = trine("train", str(config))
    out = _finish(trainer, "the restarted trainer")
    assert f"resuming from step {checkpoint}" in out, out
    for i, proc in enumerate((first, second)):
        assert "the trainer's run ended" in _finish(proc, f"explorer {i}")

    steps = [r["step"] for r in jsonl_rows(run_dir / "metrics.jsonl") if "trainer/loss" in r]
    assert steps == list(range(1, STEPS + 1))  # each step once: the killed timeline's lines rewound
    assert all(
        r["buffer/staleness_max"] <= 2 for r in jsonl_rows(run_dir / "metrics.jsonl") if "trainer/loss" in r
    )
    db = sqlite3.connect(run_dir / "buffer.db")
    batches = db.execute("SELECT producer, producer_batch, size FROM experiences_batches").fetchall()
    for producer in ("explorer-0", "explorer-1"):
        mine = sorted(b for p, b, _ in batches if p == producer)
        assert mine == list(range(len(mine))) and mine, producer  # no batch lost, none put twice
    rows = db.execute("SELECT task_id, run_id, reward_status, consumed_at FROM experiences").fetchall()
    assert sum(size for *_, size in batches) == len(rows)
    samples = Counter((task, run) for task, run, *_ in rows)
    assert max(samples.values()) == 1  # no task sample produced twice, by either explorer
    assert {status for _, _, status, _ in rows} <= {"ready", "dropped"}  # none rolled back or left pending
    # the task ledger: each task of the shared stream claimed in order, its rows stored by one claim only
    ledger = dict(db.execute("SELECT seq, state FROM experiences_tasks").fetchall())
    assert sorted(ledger) == list(range(len(ledger))) and set(ledger.values()) <= {"done", "open", "lost"}
    kept = db.execute(
        "SELECT task_seq, COUNT(*) FROM experiences WHERE reward_status != 'dropped' GROUP BY task_seq"
    ).fetchall()
    assert all(n == 2 for _, n in kept), kept  # repeat 2: no task's rows stored twice
    assert {seq for seq, _ in kept} == {seq for seq, state in ledger.items() if state == "done"}
    consumed = sum(1 for *_, at in rows if at is not None)
    assert consumed == STEPS * 4  # every step trained one batch of 2 tasks x 2 samples, none twice
    status = trine("status", str(run_dir))  # one line per process, the buffer, the published weights
    said, _ = status.communicate(timeout=120)
    assert status.returncode == 0, said
    assert f"trainer and 2 explorers\n  trainer: finished at step {STEPS}, version {STEPS}" in said, said
    assert all(f"\n  explorer {i}: finished, " in said for i in (0, 1)), said
    assert f", {consumed} trained" in said and f"weights: published version {STEPS}" in said, said
