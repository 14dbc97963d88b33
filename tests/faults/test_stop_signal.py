"""Ctrl-C and SIGTERM stop a run at a step boundary with a checkpoint of that step, and the same command
resumes from it: no step lost, none trained twice (issue 25 item 9: "stopped (run the same command again to
resume)" once lost 35 steps, because only ``trainer.save_every`` wrote checkpoints).

Real ``trine run`` processes get real signals after a few steps, with checkpoints due only every 1000 steps:
mode sync, mode async with the explorer in a thread, and ``launch: processes`` (the launcher forwards the
signal; the trainer process checkpoints). A stop signal is never lost either: one raised into code that
swallows it (outside the steps, where it is raised at once) still stops the run at the next boundary.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import (
    jsonl_rows,
    run_dir_of,
    run_status,
    step_metrics,
    trine,
    trine_run,
    write_arithmetic_config,
)
from trine.status import (
    Terminated,
    at_step_boundaries,
    check_stop,
    clear_stop,
    on_stop_signal,
    stop_requested,
)
from trine.trainer.checkpoint import list_checkpoints

# A workflow that, at the first task of its second batch, sends SIGTERM to its own process and swallows the
# Terminated the handler raises into it (as careless code would), then answers normally.
PLUGIN = textwrap.dedent(
    """
    import os
    import signal
    import time

    from trine.registry import register
    from trine.workflows.single_turn import SingleTurnWorkflow

    CALLS = []


    @register("workflow", "swallows_sigterm")
    class SwallowsSigterm(SingleTurnWorkflow):
        async def run(self, task, model):
            CALLS.append(task.task_id)
            if len(CALLS) == 9 and not os.environ.get("NO_SIGTERM"):  # the first task of batch 2
                try:
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.2)  # the handler runs here and raises Terminated ...
                except BaseException:  # noqa: BLE001 ... which this swallows
                    pass
            return await super().run(task, model)
    """
)


@pytest.mark.slow
def test_a_swallowed_sigterm_still_stops_the_run_and_it_resumes(fault_config, tmp_path):
    plugin = tmp_path / "plugin.py"
    plugin.write_text(PLUGIN)
    config = fault_config(
        {
            "tasks": {"total_steps": 4, "train": {"workflow": "swallows_sigterm"}},
            "explorer": {"timeout": 30.0},
        }
    )
    run_dir = run_dir_of(config)
    proc, _ = trine_run(config, plugin)
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert "terminated (SIGTERM): stopped" in proc.stderr
    assert run_status(run_dir)["state"] == "stopped" and "Terminated" in run_status(run_dir)["reason"]
    assert len(step_metrics(run_dir)) < 4  # it stopped at the step boundary after the swallowed signal

    os.environ["NO_SIGTERM"] = "1"
    try:
        resumed, _ = trine_run(config, plugin)
    finally:
        del os.environ["NO_SIGTERM"]
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert run_status(run_dir)["state"] == "finished"
    assert [
        m["step"] for m in jsonl_rows(run_dir / "metrics.jsonl", missing_ok=True) if "explorer/tasks" in m
    ] == [1, 2, 3, 4]


@contextlib.contextmanager
def handled(signum: int) -> Iterator[None]:
    """:func:`on_stop_signal` handles ``signum`` inside the block, nothing recorded before or after."""
    clear_stop()
    previous = signal.signal(signum, on_stop_signal)
    try:
        yield
    finally:
        signal.signal(signum, previous)
        clear_stop()


def test_check_stop_raises_what_the_handler_recorded():
    clear_stop()
    check_stop()  # nothing received: nothing raised
    with handled(signal.SIGTERM):
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs at the next bytecode boundary
        except Terminated:
            pass  # swallowed, as a careless library would
        with pytest.raises(Terminated):
            check_stop()


def test_inside_the_steps_a_first_stop_waits_for_the_boundary_and_a_second_one_does_not(monkeypatch):
    import trine.status

    monkeypatch.setattr(trine.status, "REPEAT_SECONDS", 0.2)
    with handled(signal.SIGTERM):
        with at_step_boundaries():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)  # the handler ran: recorded, not raised
            assert stop_requested()
            os.kill(os.getpid(), signal.SIGTERM)  # the same stop delivered again (a launcher forwarding it)
            time.sleep(0.25)
            with pytest.raises(Terminated):  # a second stop: at once
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)
        with pytest.raises(Terminated):
            check_stop()


def test_a_step_that_does_not_end_within_the_grace_is_stopped_at_once(monkeypatch):
    import trine.status

    monkeypatch.setattr(trine.status, "STOP_GRACE_SECONDS", 0.3)
    with handled(signal.SIGINT):
        start = time.monotonic()
        with pytest.raises(KeyboardInterrupt), at_step_boundaries():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)  # a step that never ends
        assert time.monotonic() - start < 5


STEPS = 8
SLOW = textwrap.dedent(
    """
    import asyncio

    from trine.registry import register
    from trine.workflows.single_turn import SingleTurnWorkflow


    @register("workflow", "slow_single_turn")
    class SlowSingleTurn(SingleTurnWorkflow):
        async def run(self, task, model):
            await asyncio.sleep(0.25)  # every step takes a while: a signal after step 2 lands mid-run
            return await super().run(task, model)
    """
)
MODES = {
    "sync": {},
    "async": {"mode": "async", "sync": {"wait_timeout": 60}},
    "processes": {
        "mode": "async",
        "launch": "processes",
        "buffer": {"storage": "sql", "max_staleness": 2},
        "sync": {"wait_timeout": 60},
    },
}


def _config(tmp_path: Path, model: Path, mode: str) -> Path:
    small = {
        "num_threads": 1,
        "tasks": {
            "batch_size": 2,
            "total_steps": STEPS,
            "train": {"repeat": 2, "workflow": "slow_single_turn"},
        },
        "trainer": {"save_every": 1000},  # no checkpoint is due before the end
    }
    return write_arithmetic_config(tmp_path, model, mode, small, MODES[mode])


def _trained_steps(run_dir: Path) -> list[int]:
    return [r["step"] for r in jsonl_rows(run_dir / "metrics.jsonl", missing_ok=True) if "trainer/loss" in r]


def _stop_after(proc: subprocess.Popen, run_dir: Path, step: int, sig: int, limit: float = 240.0) -> str:
    """Send ``sig`` to ``proc`` once the run has logged ``step``; its output once it has exited."""
    deadline = time.monotonic() + limit
    while len(_trained_steps(run_dir)) < step:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the run ended or stalled before step {step}:\n{proc.communicate()[0]}")
        time.sleep(0.02)
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=240)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mode", "sig", "code"),
    [
        ("sync", signal.SIGTERM, 143),
        ("sync", signal.SIGINT, 130),
        ("async", signal.SIGTERM, 143),
        ("async", signal.SIGINT, 130),
        ("processes", signal.SIGTERM, 143),
    ],
)
def test_a_stop_checkpoints_the_step_it_stops_at_and_the_run_resumes_there(
    tmp_path, tiny_model_dir, mode, sig, code
):
    config = _config(tmp_path, tiny_model_dir, mode)
    run_dir = run_dir_of(config)
    plugin = tmp_path / "slow.py"
    plugin.write_text(SLOW)
    proc = trine("run", str(config), "--plugin", str(plugin))
    out = _stop_after(proc, run_dir, 2, sig)
    assert proc.returncode == code, out
    stopped = _trained_steps(run_dir)
    assert 2 <= len(stopped) < STEPS and stopped == list(range(1, len(stopped) + 1)), out
    (checkpoint,) = list_checkpoints(run_dir / "checkpoints")  # save_every: 1000 wrote none
    assert checkpoint.name == f"step_{stopped[-1]}", out  # the step it stopped at
    assert f"stopped at step {stopped[-1]}, checkpoint written" in out
    status = run_status(run_dir)
    assert status["state"] == "stopped" and status["step"] == stopped[-1]
    assert f"at step {stopped[-1]}, checkpoint written" in status["reason"]
    assert "stopped (run the same command again to resume)" in out

    again = trine("run", str(config), "--plugin", str(plugin))
    out, _ = again.communicate(timeout=300)
    assert again.returncode == 0, out
    assert f"resuming from step {stopped[-1]}" in out
    assert _trained_steps(run_dir) == list(range(1, STEPS + 1))  # none lost, none trained twice
    assert not (run_dir / "metrics.jsonl.rewound").exists()  # nothing after the checkpoint was thrown away
    assert run_status(run_dir)["state"] == "finished"
