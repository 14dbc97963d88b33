"""status.json (pid, host, heartbeat; dead vs live runs; `trine status`) and cutting the records back to
the checkpoint a run resumes from."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from typer.testing import CliRunner

from trine.cli import app
from trine.rundir import rewind_records
from trine.status import Heartbeat, describe, read_status, write_status


def metrics_lines(steps) -> str:
    return "".join(json.dumps({"step": s, "trainer/loss": float(s)}) + "\n" for s in steps)


def test_heartbeat_records_pid_host_step_and_keeps_beating(tmp_path):
    beat = Heartbeat(tmp_path, step=3, interval=0.05)
    first = read_status(tmp_path)
    assert first["state"] == "running" and first["step"] == 3
    assert first["pid"] == os.getpid() and first["host"] == socket.gethostname()
    time.sleep(1.2)  # the daemon thread refreshes the heartbeat (second resolution)
    assert read_status(tmp_path)["heartbeat"] > first["heartbeat"]
    beat.beat(4)
    assert read_status(tmp_path)["step"] == 4
    assert describe(read_status(tmp_path))[0] == "running"
    beat.end("stopped", reason="interrupted (KeyboardInterrupt); run again to resume")
    time.sleep(0.2)  # a beat racing the end must not bring back "running"
    final = read_status(tmp_path)
    assert final["state"] == "stopped" and final["step"] == 4 and "KeyboardInterrupt" in final["reason"]
    assert describe(final) == ("stopped", final["reason"])


def test_a_killed_run_reads_dead_by_pid_or_by_stale_heartbeat(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a pid that is gone
    now = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    write_status(tmp_path, "running", step=7, pid=child.pid, host=socket.gethostname(), heartbeat=now)
    state, why = describe(read_status(tmp_path))
    assert state == "dead" and f"process {child.pid}" in why
    result = CliRunner().invoke(app, ["status", str(tmp_path)])
    assert result.exit_code == 1 and f"dead at step 7 (process {child.pid}" in result.output

    old = "2020-01-01T00:00:00+00:00"  # another host: only the heartbeat's age can tell
    write_status(tmp_path, "running", step=7, pid=1, host="elsewhere", heartbeat=old)
    state, why = describe(read_status(tmp_path))
    assert state == "dead" and "last heartbeat" in why
    write_status(tmp_path, "running", step=7, pid=1, host="elsewhere", heartbeat=now)
    assert describe(read_status(tmp_path))[0] == "running"
    assert CliRunner().invoke(app, ["status", str(tmp_path)]).exit_code == 0


def test_status_command_on_a_directory_without_a_run(tmp_path):
    result = CliRunner().invoke(app, ["status", str(tmp_path)])
    assert result.exit_code == 2 and "status.json does not exist" in result.output


def test_rewind_cuts_records_to_the_checkpoint_sizes_and_keeps_the_rest(tmp_path):
    kept = metrics_lines([1, 2])
    (tmp_path / "metrics.jsonl").write_text(
        kept + metrics_lines([3, 4]) + '{"step": 5, "trai'
    )  # killed mid-line
    (tmp_path / "rollouts.jsonl").write_text('{"batch": 0}\n{"batch": 1}\n{"batch": 2}\n')
    state = {"global_step": 2, "records": {"metrics.jsonl": len(kept), "rollouts.jsonl": 26}}
    rewind_records(tmp_path, state)
    assert (tmp_path / "metrics.jsonl").read_text() == kept
    assert (tmp_path / "rollouts.jsonl").read_text() == '{"batch": 0}\n{"batch": 1}\n'
    rewound = (tmp_path / "metrics.jsonl.rewound").read_text()
    assert rewound == metrics_lines([3, 4]) + '{"step": 5, "trai\n'
    assert (tmp_path / "rollouts.jsonl.rewound").read_text() == '{"batch": 2}\n'


def test_rewind_without_sizes_cuts_metrics_by_step_and_a_fresh_start_keeps_nothing(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(metrics_lines([1, 2, 3]))
    rewind_records(tmp_path, {"global_step": 2})  # a checkpoint from before the sizes were recorded
    assert (tmp_path / "metrics.jsonl").read_text() == metrics_lines([1, 2])
    rewind_records(tmp_path, {})  # killed before the first checkpoint: the run starts over
    assert (tmp_path / "metrics.jsonl").read_text() == ""
    assert (tmp_path / "metrics.jsonl.rewound").read_text() == metrics_lines([3, 1, 2])
