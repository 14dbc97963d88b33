"""The studio shows a stuck run (trine.monitor.progress) as ``stuck``, with the reason: in the runs table,
on the run's page, and for each process of a run with explorer processes."""

from __future__ import annotations

import json
import os
import socket
from datetime import datetime, timezone

import httpx
import pytest

pytest.importorskip("fastapi", reason="the studio needs fastapi (pip install -e '.[dev]')")
pytest.importorskip("uvicorn", reason="the studio needs uvicorn (pip install -e '.[dev]')")

from tests.helpers import write_config  # noqa: E402
from trine.studio.server import background  # noqa: E402
from trine.studio.settings import StudioSettings  # noqa: E402

REASON = (
    "step 12 has not advanced for 640s (10× the median step 64s); trainer waiting for rows (3 of 8 in the "
    "buffer) for 640s; explorer waiting for admission (buffer.max_staleness; 2 tasks in flight)"
)


def live(**extra) -> dict:
    beat = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return {"state": "running", "pid": os.getpid(), "host": socket.gethostname(), "heartbeat": beat, **extra}


def test_a_stuck_run_and_a_stuck_explorer_show_stuck_with_the_reason(tmp_path):
    run = tmp_path / "slow"
    run.mkdir()
    write_config(run / "config.yaml", {"name": "slow", "mode": "async", "tasks": {"total_steps": 20}})
    stuck = {"since": "2025-01-01T00:00:00+00:00", "seconds": 640.0, "reason": REASON, "step": 12}
    (run / "status.json").write_text(json.dumps(live(step=12, stuck=stuck)))
    explorer = run / "explorers" / "0"
    explorer.mkdir(parents=True)
    waiting = "step 3 has not advanced for 400s (no step yet; monitor.stuck_min_seconds=300s)"
    (explorer / "status.json").write_text(json.dumps(live(step=3, stuck={"reason": waiting})))
    with (
        background(StudioSettings(runs_dir=tmp_path)) as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        (row,) = client.get("/api/runs").json()["runs"]
        assert (row["state"], row["why"], row["notes"]) == ("stuck", REASON, [])
        detail = client.get("/api/runs/slow").json()
        assert (detail["state"], detail["why"]) == ("stuck", REASON)
        by = {p["name"]: p for p in detail["processes"]}
        assert (by["trainer"]["state"], by["explorer 0"]["state"]) == ("stuck", "stuck")
        assert by["explorer 0"]["why"] == waiting
