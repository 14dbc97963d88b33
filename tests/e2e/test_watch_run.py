"""Watching real short runs (issue 28 items 2 and 3): a run whose workflow hangs is reported ``stuck`` in
status.json and by `trine status`, with what each side waits for, while it lives on, and finishes once the
workflow goes on; a stage whose evaluations stop improving ends early and the next stage starts
(``eval.plateau``); alerts reach a local HTTP receiver on finished, failed and alarm, and a receiver that
is down or never answers costs the run at most ``monitor.alerts.timeout_seconds``."""

from __future__ import annotations

import contextlib
import signal
import time

import pytest
from typer.testing import CliRunner

from tests.helpers import (
    EXAMPLE,
    closed_port,
    jsonl_rows,
    run_crashing_after_step,
    run_dir_of,
    run_status,
    silent_server,
    trine_process,
)
from trine import registry
from trine.cli import app
from trine.config import load_config
from trine.loop import run

HANG = '''
import asyncio
from pathlib import Path

from trine.registry import register
from trine.workflows.single_turn import SingleTurnWorkflow

RELEASE = Path({release!r})
started = [0]


@register("workflow", "hangs_after_two_steps")
class HangsAfterTwoSteps(SingleTurnWorkflow):
    """The first 4 tasks (2 steps of 2) answer at once; the next wait until the test writes RELEASE."""

    async def run(self, task, model):
        started[0] += 1
        if started[0] > 4:
            while not RELEASE.exists():
                await asyncio.sleep(0.05)
        return await super().run(task, model)
'''


def test_a_hanging_workflow_is_reported_stuck_while_the_run_lives_and_it_then_finishes(
    tmp_path, arithmetic_config
):
    release = tmp_path / "release"
    plugin = tmp_path / "hang.py"
    plugin.write_text(HANG.format(release=str(release)))
    config = arithmetic_config(
        {
            "mode": "async",
            "tasks": {
                "batch_size": 2,
                "total_steps": 4,
                "train": {"repeat": 2, "workflow": "hangs_after_two_steps"},
            },
            "trainer": {"batch_size": 4},
            "sync": {"wait_timeout": 300},
            "monitor": {"stuck_after": 3, "stuck_min_seconds": 2},
        },
        name="hang",
    )
    run_dir = run_dir_of(config)
    proc = trine_process("run", str(config), "--plugin", str(plugin))
    try:
        deadline = time.monotonic() + 180
        status: dict = {}
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(FileNotFoundError, ValueError):
                status = run_status(run_dir)
            if "stuck" in status:
                break
            time.sleep(0.2)
        assert proc.poll() is None, "the run is alive while it is stuck"
        assert status.get("state") == "running" and "stuck" in status, status
        stuck = status["stuck"]
        assert stuck["step"] == 2 and stuck["seconds"] >= 2 and stuck["median_step_seconds"] > 0
        assert stuck["waiting"]["trainer"].startswith("waiting for rows (0 of 4 in the buffer) for ")
        assert stuck["waiting"]["tasks"].startswith("2 tasks running, the oldest (")
        shown = CliRunner().invoke(app, ["status", str(run_dir)])
        assert shown.exit_code == 0, shown.output
        assert shown.output.startswith(f"{run_dir}: stuck at step 2 (step 2 has not advanced for "), (
            shown.output
        )
        assert "; trainer waiting for rows (0 of 4 in the buffer) for " in shown.output
        assert "; 2 tasks running, the oldest (" in shown.output
        release.write_text("go on")
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, out
    final = run_status(run_dir)
    assert final["state"] == "finished" and final["step"] == 4 and "stuck" not in final
    said = [line for line in out.splitlines() if "STUCK" in line or "no longer stuck" in line]
    assert said[0].startswith("STUCK step 2 has not advanced for ") and "no longer stuck: step 3" in said[-1]


def test_a_stage_that_stops_improving_ends_early_and_the_next_stage_starts(tmp_path, arithmetic_config):
    evals = [{"name": "sums", "path": str(EXAMPLE / "data" / "eval.jsonl"), "limit": 8}]
    config = arithmetic_config(
        {
            "tasks": {"eval": evals},
            "eval": {"at_start": True, "k": 0},
            "stages": [  # no gain can exceed 1.0: the first evaluation after the start is a plateau
                {
                    "stage": "first",
                    "tasks": {"total_steps": 6},
                    "eval": {"every": 1, "plateau": {"evals": 1, "min_delta": 1.0}},
                },
                {"stage": "second", "tasks": {"total_steps": 2}},
            ],
        },
        name="plateau",
    )
    summary = run(load_config(config))
    run_dir = run_dir_of(config)
    steps = [(m["step"], m["stage"]) for m in jsonl_rows(run_dir / "metrics.jsonl") if "trainer/loss" in m]
    assert steps == [(1, "first"), (2, "second"), (3, "second")]
    first = next(m for m in jsonl_rows(run_dir / "metrics.jsonl") if "trainer/loss" in m)
    assert first["stage/ended_early"] == 1.0
    record = summary["stages"]["first"]
    assert record["ended"].startswith("stage ended early at step 1: plateau of eval/sums/accuracy: no gain ")
    assert len(record["plateau"]) == 2, "the start of the stage, then step 1"
    status = run_status(run_dir)
    assert status["state"] == "finished" and status["step"] == 3
    (ended,) = status["ended_early"]
    assert (ended["stage"], ended["step"]) == ("first", 1)
    assert ended["reason"].startswith("eval/sums/accuracy: no gain over the last 1 evaluation: ")
    assert run(load_config(config))["stages"]["second"]["steps"] == 2, "resumed: already finished"


# ------------------------------------------------------------------ alerts


@pytest.fixture
def timed_close(monkeypatch) -> list[float]:
    """The seconds each ``Alerts.close`` took: what a run's end waited for its alerts."""
    from trine.monitor.alerts import Alerts

    took, close = [], Alerts.close

    def timed(self, timeout=None):
        start = time.monotonic()
        close(self, timeout)
        took.append(time.monotonic() - start)

    monkeypatch.setattr(Alerts, "close", timed)
    return took


def test_alerts_on_finished_and_failed_reach_a_local_receiver(receiver, arithmetic_config, monkeypatch):
    alerts = {"url": receiver.url, "on": ["finished", "failed"]}
    config = arithmetic_config({"tasks": {"total_steps": 2}, "monitor": {"alerts": alerts}}, name="ok")
    run(load_config(config))
    (finished,) = receiver.got
    assert {k: finished[k] for k in ("event", "run", "stage", "step", "reason")} == {
        "event": "finished",
        "run": "ok",
        "stage": "main",
        "step": 2,
        "reason": "finished",
    }
    assert finished["run_dir"] == str(run_dir_of(config).resolve())

    crashing = arithmetic_config({"tasks": {"total_steps": 3}, "monitor": {"alerts": alerts}}, name="crash")
    run_crashing_after_step(crashing, 1, monkeypatch)
    failed = receiver.got[-1]
    assert (failed["event"], failed["run"], failed["step"]) == ("failed", "crash", 1)
    assert failed["reason"] == "Crash: simulated crash after step 1"


LENGTHY = """
from trine import register


@register("reward", "pays_for_length")
def pays_for_length(response, task):
    return min(1.0, len(response) / 40)
"""


def test_a_receiver_that_never_answers_or_is_down_costs_at_most_the_timeout(
    tmp_path, arithmetic_config, timed_close, monkeypatch
):
    monkeypatch.setattr(registry, "_extra", {k: dict(v) for k, v in registry._extra.items()})
    plugin = tmp_path / "lengthy.py"
    plugin.write_text(LENGTHY)
    registry.load_plugin(plugin)
    train = {"reward": "pays_for_length", "sampling": {"temperature": 1.0, "max_tokens": 6}}
    alarms = {"window": 1, "truncation": 0.5, "length": 0.5}
    with silent_server() as url:  # alarms go out mid-run, then finished: every POST would hang
        alerts = {"url": url, "timeout_seconds": 2.0, "on": ["alarm", "finished"]}
        config = arithmetic_config(
            {"tasks": {"total_steps": 4, "train": train}, "monitor": {"alarms": alarms, "alerts": alerts}},
            name="silent",
        )
        run(load_config(config))
    status = run_status(run_dir_of(config))
    assert status["state"] == "finished" and status["alarms"], "alarms were raised (and sent) mid-run"
    steps = [
        m["time/step_seconds"]
        for m in jsonl_rows(run_dir_of(config) / "metrics.jsonl")
        if "trainer/loss" in m
    ]
    assert max(steps) < 2.0, f"no step waited for the receiver: {steps}"
    assert timed_close[-1] < 2.0 + 0.5, "the run's end waited at most timeout_seconds"

    down = arithmetic_config(
        {"tasks": {"total_steps": 2}, "monitor": {"alerts": {"url": closed_port(), "on": ["finished"]}}},
        name="down",
    )
    run(load_config(down))
    assert run_status(run_dir_of(down))["state"] == "finished" and timed_close[-1] < 1.0
