"""``trine status`` on a run with explorer processes (one line per process, lag, buffer depth, published
weights, ``--json``, exit codes), the ``time/unix`` stamp of the jsonl sink, and ``plots/processes.png``.

The run directory is laid out as ``trine train`` + ``trine explore`` leave it, written by the real
writers: ``status.json`` by :func:`trine.status.write_status` / :class:`trine.status.Heartbeat`,
``metrics.jsonl`` by the jsonl sink, the buffer by a real :class:`~trine.buffer.SQLBuffer` opened from
the run's ``config.yaml`` as the run opens it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import struct
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import dead_pid, exp, write_config
from trine.buffer.inspect import run_buffer_config
from trine.buffer.open import open_buffer
from trine.cli import app
from trine.inspect.report import last_value, published_version, run_status
from trine.monitor import build_monitor, read_metrics
from trine.monitor.plot import plot_run
from trine.status import Heartbeat, write_status

HOST = socket.gethostname()


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())


def log_lines(directory: Path, rows: list[dict], start: float) -> None:
    """Metrics lines shaped as a run's jsonl sink writes them, ``time/unix`` set to ``start + i``."""
    with (directory / "metrics.jsonl").open("a") as f:
        for i, row in enumerate(rows, start=1):
            f.write(json.dumps({"step": i, **row, "time/unix": start + i}) + "\n")


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A live trainer at step 12 (version 12), explorer 0 running (7 batches, version 11), explorer 1
    dead (3 batches, version 5), a SQL buffer with ready, pending, stale and trained rows, version 12
    published."""
    run = tmp_path / "run"
    run.mkdir()
    write_config(run / "config.yaml", mode="async", buffer={"storage": "sql"})
    write_status(run, "running", step=12, pid=os.getpid(), host=HOST, heartbeat=now(), threads=1, cores="0")
    start = time.time() - 100
    log_lines(run, [{"trainer/loss": 1.0 / s, "trainer/version": float(s)} for s in range(1, 13)], start)
    for index, (batches, pid, version) in enumerate([(7, os.getpid(), 11), (3, dead_pid(), 5)]):
        out = run / "explorers" / str(index)
        out.mkdir(parents=True)
        write_status(out, "running", step=batches, pid=pid, host=HOST, heartbeat=now(), threads=1, cores="1")
        rows = [
            {"explorer/reward_mean": 0.1 * b, "explorer/version": float(version - batches + b)}
            for b in range(1, batches + 1)
        ]
        log_lines(out, rows, start + index)
    buffer = open_buffer(run_buffer_config(run), run)
    buffer.put([exp(i, version=0) for i in range(4)], producer="explorer-0", producer_batch=0)
    buffer.put(
        [exp(4, version=1), exp(5, version=1), exp(6, version=1, reward=None)],
        producer="explorer-1",
        producer_batch=0,
    )
    buffer.get(2, timeout=1.0)  # trains the two oldest
    buffer.get(1, min_version=1, timeout=1.0)  # the other two of version 0 are stale: dropped
    buffer.close()
    published = run / "weights" / "v00000012"
    published.mkdir(parents=True)
    (published / "meta.json").write_text("{}")
    return run


def status(*args: str) -> tuple[int, str]:
    """``trine status ARGS``: exit code and output, heartbeat ages as ``Ns`` (they tick while it runs)."""
    said = CliRunner().invoke(app, ["status", *args])
    return said.exit_code, re.sub(r"heartbeat \d+s ago", "heartbeat Ns ago", said.output)


def test_status_lists_each_process_the_buffer_and_the_published_weights(run_dir):
    code, out = status(str(run_dir))
    dead = [line for line in out.splitlines() if line.startswith("  explorer 1:")][0]
    assert out.splitlines() == [
        f"{run_dir}: trainer and 2 explorers",
        f"  trainer: running at step 12, version 12, 1 thread on core 0 (pid {os.getpid()} on {HOST}, "
        "heartbeat Ns ago)",
        f"  explorer 0: running, 7 batches, weights version 11 (lag 1), 1 thread on core 1 (pid {os.getpid()} "
        f"on {HOST}, "
        "heartbeat Ns ago)",
        dead,
        "  buffer: 1 pending, 1 ready, 3 trained, 2 stale; 2 explored batches waiting",
        "  weights: published version 12",
    ]
    assert dead.startswith("  explorer 1: dead, 3 batches, weights version 5 (lag 7) (process ")
    assert code == 1, "an explorer is dead while the trainer runs"


def test_a_finished_run_calls_its_untaken_batches_left_over_not_waiting(run_dir):
    """Explorers run ahead of the trainer's last step; once it has finished, nothing will take those
    batches, and "waiting" read as if the run were stuck (issue 25 item 12)."""
    write_status(run_dir, "finished", step=12, pid=os.getpid(), host=HOST, heartbeat=now())
    _, out = status(str(run_dir))
    buffer_line = [line for line in out.splitlines() if line.startswith("  buffer:")][0]
    assert buffer_line.endswith("2 explored batches left over (explored past the last step; not trained)")
    assert "waiting" not in out


def test_buffer_depth_matches_the_buffers_own_counts(run_dir):
    depth = run_status(run_dir).buffer
    buffer = open_buffer(run_buffer_config(run_dir), run_dir)
    try:
        own = buffer.metrics()
        assert (depth.ready, depth.pending, depth.stale) == (
            own["buffer/size"],
            own["buffer/pending"],
            own["buffer/dropped_stale"],
        )
        assert depth.batches_waiting == buffer.batches_waiting()
    finally:
        buffer.close()


def test_json_has_the_same_and_exit_codes_follow_the_processes(run_dir):
    code, out = status(str(run_dir), "--json")
    data = json.loads(out)
    assert code == 1 and data["exit_code"] == 1 and data["state"] == "running" and data["step"] == 12
    assert data["trainer"]["version"] == 12 and data["published_version"] == 12
    assert [(e["name"], e["state"], e["step"], e["version"], e["lag"]) for e in data["explorers"]] == [
        ("explorer 0", "running", 7, 11, 1),
        ("explorer 1", "dead", 3, 5, 7),
    ]
    assert data["buffer"] == {
        "ready": 1,
        "pending": 1,
        "stale": 2,
        "expired": 0,
        "trained": 3,
        "rolled_back": 0,
        "batches_waiting": 2,
    }
    out1 = run_dir / "explorers" / "1"
    write_status(out1, "finished", step=3, reason="the trainer's run ended")
    assert status(str(run_dir))[0] == 0  # an explorer that ended is no fault
    write_status(out1, "running", step=3, pid=dead_pid(), host=HOST, heartbeat=now())
    write_status(run_dir, "finished", step=12)
    assert status(str(run_dir))[0] == 0  # the trainer finished: explorers left behind do not matter
    write_status(run_dir, "running", step=12, pid=dead_pid(), host=HOST, heartbeat=now())
    code, out = status(str(run_dir))
    assert code == 1 and "  trainer: dead at step 12, version 12 (process " in out


def test_a_live_explorer_heartbeat_and_one_not_started_yet(run_dir):
    (run_dir / "explorers" / "2").mkdir()  # made before the model loads, status.json comes after
    beat = Heartbeat(run_dir / "explorers" / "1", step=4)
    try:
        code, out = status(str(run_dir))
    finally:
        beat.end("finished", reason="its tasks ran out")
    assert code == 0, out
    assert f"  explorer 1: running, 4 batches, weights version 5 (lag 7) (pid {os.getpid()}" in out
    assert (
        "  explorer 2: unknown (no status.json yet: starting, or it failed before its first heartbeat)" in out
    )
    assert f"{run_dir}: trainer and 3 explorers" in out
    assert (
        "explorer 1: finished, 4 batches, weights version 5 (lag 7) (its tasks ran out)"
        in status(str(run_dir))[1]
    )


def test_a_memory_buffer_or_no_database_is_a_note(run_dir, tmp_path):
    write_config(run_dir / "config.yaml", buffer={"storage": "memory"})
    out = status(str(run_dir))[1]
    assert "  buffer: not shown for buffer.storage 'memory' (only a SQL buffer" in out
    write_config(run_dir / "config.yaml", buffer={"storage": "sql"})
    (run_dir / "buffer.db").unlink()
    assert f"  buffer: no database yet ({run_dir / 'buffer.db'} does not exist)" in status(str(run_dir))[1]
    assert not (run_dir / "buffer.db").exists(), "status must not create the database"


def test_a_plain_run_keeps_its_one_line_and_no_run_exits_2(tmp_path):
    write_status(tmp_path, "finished", step=6)
    assert status(str(tmp_path)) == (0, f"{tmp_path}: finished at step 6\n")
    data = json.loads(status(str(tmp_path), "--json")[1])
    assert (data["state"], data["step"], data["explorers"], data["exit_code"]) == ("finished", 6, [], 0)
    assert data["buffer"] is None and "config.yaml" in data["buffer_note"]
    code, out = status(str(tmp_path / "nothing"), "--json")
    assert code == 2 and json.loads(out)["trainer"]["state"] == "absent"
    (tmp_path / "early" / "explorers" / "0").mkdir(parents=True)  # an explorer started first
    code, out = status(str(tmp_path / "early"))
    assert (
        code == 2 and "  trainer: not started (no status.json yet;" in out and "  explorer 0: unknown" in out
    )


def test_last_value_reads_from_the_end_across_chunks_and_torn_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": i, "pad": "x" * 900, **({"k": float(i)} if i < 150 else {})} for i in range(200)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 200, "k": 9')
    assert last_value(path, "k") == 149.0  # 50 lines (~45 kB) without it, then a torn one
    assert last_value(path, "missing") is None and last_value(tmp_path / "none.jsonl", "k") is None


def test_jsonl_lines_of_a_run_carry_time_unix_that_comparisons_ignore(tmp_path):
    before = time.time()
    with build_monitor(["jsonl"], tmp_path / "a", resume_step=0) as monitor:
        monitor.log({"trainer/loss": 1.0}, step=1)
    (record,) = read_metrics(tmp_path / "a")
    assert record["trainer/loss"] == 1.0 and before - 1 <= record["time/unix"] <= time.time() + 1
    with build_monitor(["jsonl"], tmp_path / "b") as monitor:  # not a run: no stamp, as before
        monitor.log({"trainer/loss": 1.0}, step=1)
    assert read_metrics(tmp_path / "b") == [{"step": 1, "trainer/loss": 1.0}]
    script = Path(__file__).resolve().parents[3] / "scripts" / "compare_metrics.py"
    spec = importlib.util.spec_from_file_location("compare_metrics", script)
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    a, b = tmp_path / "a" / "metrics.jsonl", tmp_path / "b" / "metrics.jsonl"
    assert compare.stable_records(a) == compare.stable_records(b)


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_plot_draws_the_processes_on_one_time_axis(run_dir):
    written = plot_run(run_dir)
    assert [p.name for p in written] == ["loss.png", "overview.png", "processes.png"]
    width, height = png_size(run_dir / "plots" / "processes.png")
    assert 800 <= width <= 2400 and 600 <= height <= 2400
    assert (run_dir / "plots" / "processes.png").stat().st_size > 20_000


def test_processes_plot_is_skipped_without_timestamps(tmp_path):
    (tmp_path / "explorers" / "0").mkdir(parents=True)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "trainer/loss": 1.0, "trainer/version": 1.0}\n')
    assert [p.name for p in plot_run(tmp_path)] == ["loss.png", "overview.png"]


def test_published_version_agrees_with_published_weights(tmp_path):
    from trine.sync.published import PublishedWeights

    weights = tmp_path / "weights"
    assert published_version(tmp_path) is None
    for name, complete in [
        ("v00000003", True),
        ("v00000009", True),
        ("v00000011", False),
        ("v00000012.tmp", True),
    ]:
        (weights / name).mkdir(parents=True)
        if complete:
            (weights / name / "meta.json").write_text("{}")
    assert published_version(tmp_path) == PublishedWeights(weights).latest() == 9


def test_buffer_line_names_expired_and_rolled_back_rows_only_when_there_are_some():
    from trine.inspect.report import BufferDepth

    assert BufferDepth(0, 48, 112, 16, 0, 0, 3).line() == "0 pending, 48 ready, 112 trained, 16 stale"
    assert BufferDepth(1, 2, 3, 4, 5, 6, 0).line() == (
        "1 pending, 2 ready, 3 trained, 4 stale, 5 expired, 6 rolled_back"
    )
