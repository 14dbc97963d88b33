"""A stop signal is never lost: SIGTERM raised into code that swallows it still stops the run.

A signal handler's exception lands wherever the main thread happens to be. If that place swallows it (a
``__del__``, a library's ``except BaseException``), the run used to go on — or, in one CI run, to end as
if its tasks had run out, ``stopped`` with exit code 0. :func:`trine.status.on_stop_signal` records each
stop signal before raising it, and the loop raises a recorded one again at the next step boundary: the
run ends ``stopped`` (reason ``Terminated``), exit code 143, and the same command resumes it.
"""

from __future__ import annotations

import os
import signal
import textwrap

import pytest

from tests.helpers import jsonl_rows, run_dir_of, run_status, step_metrics, trine_run
from trine.status import Terminated, check_stop, clear_stop, on_stop_signal

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


def test_check_stop_raises_what_the_handler_recorded():
    clear_stop()
    check_stop()  # nothing received: nothing raised
    previous = signal.signal(signal.SIGTERM, on_stop_signal)
    try:
        try:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs at the next bytecode boundary
        except Terminated:
            pass  # swallowed, as a careless library would
        with pytest.raises(Terminated):
            check_stop()
    finally:
        signal.signal(signal.SIGTERM, previous)
        clear_stop()
