"""The stuck and plateau rules (trine.monitor.progress), the stuck record in status.json and its report
(trine.status.describe, `trine status`), with a clock the test moves."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest
from typer.testing import CliRunner

from trine.cli import app
from trine.monitor.progress import StepWatch, plateau, stuck_reason, stuck_threshold
from trine.status import Heartbeat, describe, read_status


class Clock:
    """``time.monotonic`` for a watch: moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watch_at(clock: Clock, **kwargs) -> StepWatch:
    watch = StepWatch(stuck_after=10, min_seconds=30, clock=clock, **kwargs)
    watch.advance(0)
    watch.set_phase("step")
    return watch


def steps(watch: StepWatch, clock: Clock, seconds: list[float]) -> None:
    """Advance one step per entry, each taking its seconds."""
    for s in seconds:
        clock.now += s
        watch.advance(watch.step + 1)


# ------------------------------------------------------------------ the rules, pure


def test_threshold_is_the_multiple_of_the_median_with_a_floor():
    assert stuck_threshold([], 10, 300) == 300  # no step yet: the floor alone
    assert stuck_threshold([64, 60, 70, 500], 10, 300) == 670  # the median (67), not the mean: one slow step
    assert stuck_threshold([1, 2, 3], 10, 300) == 300  # fast steps: the floor


@pytest.mark.parametrize(
    ("values", "evals", "min_delta", "plateaued"),
    [
        ([0.2, 0.3, 0.3, 0.3], 2, 0.0, True),  # the last two are no better than 0.3 before them
        ([0.2, 0.3, 0.3, 0.31], 2, 0.0, False),  # any rise is a gain
        ([0.2, 0.3, 0.3, 0.31], 2, 0.05, True),  # ... unless min_delta asks for more
        ([0.2, 0.3, 0.3], 3, 0.0, False),  # not enough evaluations to judge
        ([0.5, 0.4, 0.3], 2, 0.0, True),  # falling is no gain either
        ([0.5, 0.1, 0.6], 1, 0.0, False),
    ],
)
def test_plateau_is_no_gain_of_the_last_evals_over_the_best_before(values, evals, min_delta, plateaued):
    why = plateau(values, evals, min_delta)
    assert (why is not None) == plateaued
    if why:
        assert f"no gain over the last {evals} evaluation" in why and f"{max(values[:-evals]):.4g}" in why


def test_the_reason_names_the_step_the_rule_and_what_each_side_waits_for():
    waiting = {
        "trainer": "waiting for rows (3 of 8 in the buffer)",
        "explorer": "waiting for admission",
        "tasks": "4 tasks running",
    }
    assert stuck_reason(12, 640, 64, 10, 300, waiting) == (
        "step 12 has not advanced for 640s (10× the median step 64s); trainer waiting for rows (3 of 8 in "
        "the buffer); explorer waiting for admission; 4 tasks running"
    )
    assert "(median step 2s; monitor.stuck_min_seconds=300s)" in stuck_reason(3, 301, 2, 10, 300, {})
    assert "(no step yet; monitor.stuck_min_seconds=300s)" in stuck_reason(0, 301, None, 10, 300, {})


# ------------------------------------------------------------------ the watch


def test_stuck_after_the_threshold_once_and_cleared_when_the_step_advances():
    clock, alerts, said = Clock(), [], []
    waiting = {"trainer": "waiting for rows (0 of 8 in the buffer) for 99s"}
    watch = watch_at(clock, waiting=lambda: waiting, on_stuck=alerts.append, say=said.append)
    steps(watch, clock, [5, 5, 5])  # median 5 s: stuck after max(30, 50) s
    clock.now += 49
    assert watch.check() is None
    clock.now += 2
    record = watch.check()
    assert (
        record["seconds"] == 51 and record["threshold_seconds"] == 50 and record["median_step_seconds"] == 5
    )
    assert record["step"] == 3 and record["waiting"] == waiting
    assert record["reason"].startswith("step 3 has not advanced for 51s (10× the median step 5s); trainer ")
    clock.now += 10
    assert watch.check()["seconds"] == 61
    assert len(alerts) == 1 and said == [f"STUCK {alerts[0]['reason']}"], "one alert per stuck episode"
    steps(watch, clock, [1])
    assert watch.stuck is None and watch.check() is None
    assert said[-1] == "no longer stuck: step 4 after 61s"
    clock.now += 1000
    assert watch.check() is not None and len(alerts) == 2, "a new episode alerts again"


def test_evaluations_checkpoints_and_start_up_do_not_count():
    clock = Clock()
    watch = StepWatch(stuck_after=1.5, min_seconds=30, clock=clock)
    watch.advance(0)
    clock.now += 500  # loading the model, building the stage: phase "starting"
    assert watch.check() is None
    watch.set_phase("step")
    clock.now += 10
    with watch.during("eval"):
        clock.now += 1000
        assert watch.check() is None
    assert watch.phase == "step" and watch.stalled() == 10
    with watch.during("checkpoint"):
        clock.now += 1000
    clock.now += 5
    watch.advance(1)
    assert list(watch.durations) == [15], "the step's own time, not the evaluation's or the checkpoint's"
    clock.now += 29
    assert watch.check() is None
    clock.now += 2
    assert watch.check()["reason"].startswith("step 1 has not advanced for 31s (median step 15s; ")


def test_a_failing_waiting_report_is_part_of_the_record_not_an_error():
    clock = Clock()

    def broken() -> dict:
        raise RuntimeError("database is locked")

    watch = watch_at(clock, waiting=broken)
    clock.now += 31
    assert "database is locked" in watch.check()["waiting"]["unknown"]


# ------------------------------------------------------------------ status.json, describe, trine status


def test_the_heartbeat_writes_the_stuck_record_and_status_reports_it(tmp_path):
    clock = Clock()
    waiting = {"trainer": "waiting for rows (3 of 8 in the buffer) for 40s", "tasks": "4 tasks running"}
    watch = StepWatch(stuck_after=10, min_seconds=30, waiting=lambda: waiting, clock=clock)
    beat = Heartbeat(tmp_path, step=12, interval=0.05, watch=watch)
    try:
        watch.set_phase("step")
        clock.now += 40
        deadline = time.monotonic() + 10
        while "stuck" not in read_status(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        status = read_status(tmp_path)
        assert status["state"] == "running" and status["stuck"]["seconds"] == 40
        assert status["stuck"]["waiting"] == waiting and status["stuck"]["median_step_seconds"] is None
        state, why = describe(status)
        assert state == "stuck"
        assert why == (
            "step 12 has not advanced for 40s (no step yet; monitor.stuck_min_seconds=30s); trainer waiting "
            "for rows (3 of 8 in the buffer) for 40s; 4 tasks running"
        )
        said = CliRunner().invoke(app, ["status", str(tmp_path)])
        assert said.exit_code == 0, "stuck is not dead: the run goes on"
        assert said.output == f"{tmp_path}: stuck at step 12 ({why})\n"
        beat.beat(13)  # the step advances: cleared at once
        assert "stuck" not in read_status(tmp_path) and describe(read_status(tmp_path))[0] == "running"
    finally:
        beat.end("finished")
    assert "stuck" not in read_status(tmp_path)


def test_a_dead_run_is_dead_even_with_a_stuck_record(tmp_path):
    stuck = {"reason": "step 3 has not advanced for 999s"}
    now = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    alive = {"state": "running", "pid": os.getpid(), "host": socket.gethostname(), "heartbeat": now}
    assert describe({**alive, "stuck": stuck}) == ("stuck", stuck["reason"])
    old = {**alive, "heartbeat": "2000-01-01T00:00:00+00:00", "stuck": stuck}
    assert describe(old)[0] == "dead"
    (tmp_path / "status.json").write_text(json.dumps({**alive, "stuck": stuck}))
    said = CliRunner().invoke(app, ["status", str(tmp_path), "--json"])
    trainer = json.loads(said.output)["trainer"]
    assert (trainer["state"], trainer["stuck"], said.exit_code) == ("stuck", stuck, 0)
