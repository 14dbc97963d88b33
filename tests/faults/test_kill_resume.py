"""kill -9 at a random step, then resume, with every buffer storage: clean records, nothing lost or doubled.

A real ``trine run`` subprocess (checkpoint every 2 steps) is killed with SIGKILL once metrics.jsonl
reaches a step drawn from a seeded range. Its status must still name the dead run's pid and step, and
``trine status`` must call it dead. Running the command again resumes from the last checkpoint and must
end ``finished`` with exit code 0, with metrics.jsonl and rollouts.jsonl holding each step once and equal
(timings aside) to an uninterrupted run's, and for persistent storages exactly the uninterrupted run's
consumed rows (the killed timeline's later rows are ``rolled_back``, none left ``ready``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import jsonl_rows, trine, write_arithmetic_config
from trine.cli import app
from trine.config import load_config
from trine.loop import run
from trine.status import write_status
from trine.trainer.checkpoint import list_checkpoints

pytestmark = pytest.mark.slow

VOLATILE = ("time/", "trainer/tokens_per_second", "sync/seconds")
PG_URL = os.environ.get("TRINE_TEST_POSTGRES_URL")
STORAGES = [
    "memory",
    "sql",
    "file",
    pytest.param(
        "postgres",
        marks=pytest.mark.skipif(
            not PG_URL,
            reason='PostgreSQL variant: set TRINE_TEST_POSTGRES_URL (export TRINE_TEST_POSTGRES_URL="$(scripts/postgres.sh)")',
        ),
    ),
]


def write_config(tmp_path: Path, model: Path, name: str, storage: str, table: str, steps: int = 6) -> Path:
    buffer = {"storage": storage}
    if storage == "postgres":
        buffer = {"storage": "sql", "url": PG_URL, "storage_args": {"table": table}}
    small = {
        "num_threads": 1,
        "tasks": {"batch_size": 2, "total_steps": steps, "train": {"repeat": 2}},
        "buffer": buffer,
        "explorer": {"dump_rollouts": True},
        "trainer": {"save_every": 2},
    }
    return write_arithmetic_config(tmp_path, model, name, small)


def stable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def rollouts(run_dir: Path) -> list[tuple]:
    return [
        (r["batch"], r["task_id"], json.dumps(r["responses"])) for r in jsonl_rows(run_dir / "rollouts.jsonl")
    ]


def buffer_rows(run_dir: Path, storage: str, table: str) -> list[tuple[tuple, str]] | None:
    """(batch, task, tokens) and status of every stored experience (None for the memory buffer)."""
    if storage == "memory":
        return None
    if storage == "postgres":  # own table: read it as trine.buffer.inspect reads "experiences"
        import sqlalchemy as sa

        from trine.buffer.sql import normalize_url
        from trine.buffer.sql_schema import build_table, row_to_experience
        from trine.buffer.states import sql_state

        engine = sa.create_engine(normalize_url(PG_URL))
        t = build_table(sa.MetaData(), table)
        with engine.connect() as conn:
            rows = conn.execute(sa.select(t).order_by(t.c.seq)).fetchall()
        engine.dispose()
        found = [
            (row_to_experience(r), sql_state(r.reward_status, r.consumed_at, r.expired_at, r.reward))
            for r in rows
        ]
    else:
        from trine.buffer.inspect import read_rows

        found = read_rows(run_dir)
    return [((e.info["batch"], e.task_id, tuple(e.tokens)), s) for e, s in found]


def kill_at_step(proc: subprocess.Popen, metrics: Path, step: int, limit: float = 120.0) -> None:
    """SIGKILL ``proc``'s process group as soon as ``metrics`` holds ``step`` (freeze it first with
    SIGSTOP so that what the test reads is what the killed run left)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the run ended before step {step}:\n{proc.stdout.read()}"
        if metrics.is_file() and any(r["step"] >= step for r in jsonl_rows(metrics)):
            os.killpg(proc.pid, signal.SIGSTOP)
            return
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    raise AssertionError(f"metrics never reached step {step} within {limit}s")


@pytest.mark.parametrize("storage", STORAGES)
def test_kill_9_then_resume_leaves_clean_records(storage, tmp_path, tiny_model_dir, capsys):
    tables = {name: f"t_{uuid.uuid4().hex[:10]}" for name in ("full", "killed")}
    full = write_config(tmp_path, tiny_model_dir, "full", storage, tables["full"])
    run(load_config(full))
    reference = stable(jsonl_rows(tmp_path / "full" / "metrics.jsonl"))
    assert [r["step"] for r in reference] == [1, 2, 3, 4, 5, 6]

    killed = write_config(tmp_path, tiny_model_dir, "killed", storage, tables["killed"])
    run_dir = tmp_path / "killed"
    target = random.Random(f"kill-{storage}").randint(2, 4)
    proc = trine("run", str(killed))
    kill_at_step(proc, run_dir / "metrics.jsonl", target)
    last = max(r["step"] for r in jsonl_rows(run_dir / "metrics.jsonl"))
    status = json.loads((run_dir / "status.json").read_text())
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL
    proc.stdout.close()
    # the record a dead run leaves: still "running", but with its pid and the step it had reached
    assert status["state"] == "running" and status["pid"] == proc.pid and status["heartbeat"]
    assert last - 1 <= status["step"] <= last  # the status is written right after each step's metrics
    said = CliRunner().invoke(app, ["status", str(run_dir)])
    assert said.exit_code == 1 and f"dead at step {status['step']}" in said.output, said.output
    assert f"process {proc.pid}" in said.output

    found = list_checkpoints(run_dir / "checkpoints")  # complete ones: the kill may land mid-save
    saved = int(found[-1].name.split("_")[1]) if found else 0
    resumed = trine("run", str(killed))
    out, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, out
    assert (f"resuming from step {saved} (checkpoint " in out) == bool(found), out
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"
    said = CliRunner().invoke(app, ["status", str(run_dir)])
    assert said.exit_code == 0 and "finished at step 6" in said.output

    rows = stable(jsonl_rows(run_dir / "metrics.jsonl"))  # a plain reader: each step once
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert rows == reference
    assert rollouts(run_dir) == rollouts(tmp_path / "full")  # each batch once, the same samples
    rewound = jsonl_rows(run_dir / "metrics.jsonl.rewound") if last > saved else []
    assert [r["step"] for r in rewound] == list(range(saved + 1, last + 1))

    before, after = (
        buffer_rows(tmp_path / "full", storage, tables["full"]),
        buffer_rows(run_dir, storage, tables["killed"]),
    )
    if before is not None:
        consumed = Counter(key for key, s in after if s == "trained")
        assert consumed == Counter(key for key, s in before if s == "trained")  # none lost, none twice
        assert {s for _, s in after} <= {"trained", "rolled_back"}  # nothing left behind as ready
        assert all(key[0] >= saved for key, s in after if s == "rolled_back")  # only after the checkpoint

    # as if killed after its last checkpoint but before it wrote "finished"; a third run: nothing to do
    write_status(run_dir, "running", step=6, pid=proc.pid, host=status["host"], heartbeat=status["heartbeat"])
    capsys.readouterr()
    run(load_config(killed))
    assert "already finished: nothing to do" in capsys.readouterr().out
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"
    assert [r["step"] for r in jsonl_rows(run_dir / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize(
    "sig, code, said, reason",
    [
        (signal.SIGINT, 130, "interrupted: stopped", "KeyboardInterrupt"),  # Ctrl-C in a terminal
        (signal.SIGTERM, 143, "terminated (SIGTERM): stopped", "Terminated"),  # a scheduler's stop
    ],
)
def test_ctrl_c_or_sigterm_stops_cleanly_and_the_next_run_resumes(
    sig, code, said, reason, tmp_path, tiny_model_dir
):
    # 40 steps: a 6-step run of the tiny model can finish between the poll that sees step 2 and the stop
    config = write_config(tmp_path, tiny_model_dir, "interrupted", "memory", "unused", steps=40)
    run_dir = tmp_path / "interrupted"
    proc = trine("run", str(config))
    kill_at_step(proc, run_dir / "metrics.jsonl", 2)  # leaves it frozen (SIGSTOP) at step >= 2
    os.killpg(proc.pid, sig)
    os.killpg(proc.pid, signal.SIGCONT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == code, out
    assert said in out and "Traceback" not in out, out
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "stopped" and reason in status["reason"]
    resumed = trine("run", str(config))
    out, _ = resumed.communicate(timeout=300)
    assert (
        resumed.returncode == 0 and json.loads((run_dir / "status.json").read_text())["state"] == "finished"
    )
    assert [r["step"] for r in jsonl_rows(run_dir / "metrics.jsonl")] == list(range(1, 41))
