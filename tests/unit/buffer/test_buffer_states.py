"""One vocabulary for the states of stored experiences (:mod:`trine.buffer.states`): ``trine buffer
stats``, ``trine status`` and the studio show the same names, and the same counts, for the same buffer.

The buffer is a real SQL (or file) buffer driven through its own API into every state: rows trained,
dropped as stale, expired while pending (a fake clock past ``pending_timeout``), rolled back by a resume
from a checkpoint, and left ready and pending.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from tests.helpers import exp, write_config
from trine.buffer.files import FileBuffer
from trine.buffer.sampling import SamplingRules
from trine.buffer.sql import SQLBuffer
from trine.buffer.states import STATES, check_state
from trine.cli import app
from trine.status import write_status

pytest.importorskip("fastapi")

EXPECTED = {"pending": 1, "ready": 1, "trained": 2, "stale": 1, "expired": 1, "rolled_back": 1}


def fill(run: Path, storage: str) -> None:
    """Drive a run's buffer into every state, once each (trained: twice)."""
    clock = [0.0]
    rules = SamplingRules(pending_timeout=5.0)

    def open_buffer():
        if storage == "sql":
            return SQLBuffer(f"sqlite:///{run / 'buffer.db'}", rules=rules, clock=lambda: clock[0])
        return FileBuffer(run / "buffer.jsonl", rules=rules, clock=lambda: clock[0])

    buffer = open_buffer()
    buffer.put([exp(task_id="a", version=0), exp(task_id="b", version=0)])
    buffer.put(
        [exp(task_id="c", version=1), exp(task_id="d", version=1), exp(task_id="e", version=1, reward=None)]
    )
    assert [e.task_id for e in buffer.get(1)] == ["a"]  # trained
    assert [e.task_id for e in buffer.get(1, min_version=1)] == ["c"]  # b: stale (version 0 < 1)
    clock[0] = 8.0
    buffer.put([exp(task_id="g", version=1, reward=None)])  # pending (put at 8)
    clock[0] = 10.0
    buffer.metrics()  # e (put at 0) is past its 5 s: expired, dropped
    state = buffer.state_dict()  # a checkpoint
    buffer.put([exp(task_id="h", version=1)])  # put after it by a run that then crashed
    buffer.close()
    resumed = open_buffer()
    resumed.load_state_dict(state)  # the resume: h is rolled back
    resumed.close()


@pytest.fixture(params=["sql", "file"])
def run(request, tmp_path) -> Path:
    """A run with explorer processes (so that `trine status` shows its buffer), its buffer filled."""
    run = tmp_path / "run"
    run.mkdir()
    write_config(run / "config.yaml", mode="async", buffer={"storage": request.param})
    write_status(run, "finished", step=2)
    (run / "explorers" / "0").mkdir(parents=True)
    write_status(run / "explorers" / "0", "finished", step=3)
    fill(run, request.param)
    return run


def stats_counts(run: Path) -> dict[str, int]:
    """The first table of `trine buffer stats RUN`: status -> count, in the order shown."""
    result = CliRunner().invoke(app, ["buffer", "stats", str(run)])
    assert result.exit_code == 0, result.output
    table = result.stdout.split("by policy version")[0]
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in table.splitlines() if line.count("│") > 3]
    return {row[0]: int(row[1]) for row in cells}


def studio_views(run: Path) -> tuple[dict, dict, dict]:
    """The studio's counts on the run page, its filter facets, and the rows each filter lists."""
    from trine.studio.server import background
    from trine.studio.settings import StudioSettings

    base = f"/api/runs/{run.name}"
    with (
        background(StudioSettings(runs_dir=run.parent)) as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        counts = client.get(base).json()["buffer"]["counts"]
        facets = client.get(f"{base}/experiences/facets").json()["statuses"]
        rows = client.get(f"{base}/experiences", params={"limit": 50}).json()["rows"]
        listed = {s: [r["task_id"] for r in rows if r["status"] == s] for s in STATES}
        for state in STATES:  # the filter selects the rows shown with that name
            chosen = client.get(f"{base}/experiences", params={"status": state}).json()["rows"]
            assert sorted(r["task_id"] for r in chosen) == sorted(listed[state]), state
    return counts, facets, {s: len(v) for s, v in listed.items()}


def test_buffer_stats_status_and_the_studio_name_and_count_states_alike(run):
    stats = stats_counts(run)
    assert list(stats) == list(STATES)  # every state, in the one order
    assert stats == EXPECTED
    counts, facets, listed = studio_views(run)
    assert counts == facets == listed == EXPECTED
    if (run / "buffer.db").is_file():  # `trine status` counts a SQL buffer (only it can be read from outside)
        result = CliRunner().invoke(app, ["status", str(run)])
        line = next(x for x in result.stdout.splitlines() if x.startswith("  buffer: "))
        shown = "  buffer: 1 pending, 1 ready, 2 trained, 1 stale, 1 expired, 1 rolled_back; "
        assert line.startswith(shown), line
        as_json = json.loads(CliRunner().invoke(app, ["status", str(run), "--json"]).stdout)["buffer"]
        assert {s: as_json[s] for s in STATES} == EXPECTED


def test_an_old_state_name_is_refused_with_its_new_name(run):
    with pytest.raises(ValueError, match=r"'consumed' is now called 'trained'"):
        check_state("consumed")
    result = CliRunner().invoke(app, ["buffer", "head", str(run), "--status", "dropped"])
    assert result.exit_code == 2
    assert "expected one of pending, ready, trained, stale, expired, rolled_back" in result.stderr
    assert "'dropped' is now called 'stale'" in result.stderr
    trained = CliRunner().invoke(
        app, ["buffer", "export", str(run), str(run / "t.jsonl"), "--status", "trained"]
    )
    assert trained.exit_code == 0 and "wrote 2 experiences" in trained.stdout
