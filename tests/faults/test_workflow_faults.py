"""Faulty workflows and rewards in the real loop: each costs its own task only, is counted, and never
hangs or kills the run; a run where (almost) everything fails stops with the reasons.

Plugin files are written by the tests and loaded as a user would (``registry.load_plugin`` in-process,
``--plugin`` for the ``trine run`` subprocesses). Timeouts are small (``explorer.timeout`` 1 s,
``reward_timeout`` 0.5 s, see conftest.py) so each run takes seconds.
"""

from __future__ import annotations

import math
import textwrap
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers import jsonl_rows, run_dir_of, run_status, step_metrics, trine_run
from trine import registry
from trine.config import load_config
from trine.loop import run

pytestmark = pytest.mark.slow

# One plugin module for every test: the kind of fault depends on the task's row (train/<index>).
PLUGIN = '''
import asyncio
import threading
import time

from trine.blocking import run_blocking
from trine.registry import register
from trine.types import Experience

FAULTS = ["raise", "loop_hang", "thread_hang", "reward_hang", "none", "empty", "not_a_list",
          "not_experience", "str_reward", "nan_reward", "short_mask"]
CALLS = {"hang_first": 0}
LOCK = threading.Lock()


def kind_of(task_id):
    """Every even row behaves; odd rows cycle through the faults."""
    i = int(task_id.rsplit("/", 1)[1])
    return "ok" if i % 2 == 0 else FAULTS[(i // 2) % len(FAULTS)]


@register("reward", "fault_reward")
def fault_reward(response, task):
    if kind_of(task.task_id) == "reward_hang":
        threading.Event().wait()  # hangs in its worker thread forever
    return 1.0 if response.strip() == str(task.answer) else 0.0


@register("reward", "grader")
def grader(response, task, down: bool = False, points: int = 1):
    if down:
        raise ConnectionError("the grading service refused the connection")
    return float(points) if response.strip() == str(task.answer) else 0.0


@register("reward", "hang_first_six")
def hang_first_six(response, task):
    with LOCK:
        CALLS["hang_first"] += 1
        n = CALLS["hang_first"]
    if n <= 6:
        time.sleep(1e9)
    return 1.0


@register("workflow", "fault_workflow")
class FaultWorkflow:
    def __init__(self, reward, always=None):
        self.reward = reward
        self.always = always

    async def run(self, task, model):
        kind = self.always or kind_of(task.task_id)
        if kind == "raise_and_leave_a_thread":
            if not any(t.name == "plugin-stuck-thread" for t in threading.enumerate()):
                threading.Thread(target=time.sleep, args=(1e9,), name="plugin-stuck-thread").start()
            raise RuntimeError("injected fault")
        if kind == "raise":
            raise RuntimeError("injected fault")
        if kind == "loop_hang":
            await asyncio.sleep(1e9)
        if kind == "thread_hang":
            await run_blocking(time.sleep, 1e9)
        if kind == "none":
            return None
        if kind == "empty":
            return []
        if kind == "not_a_list":
            return "done"
        if kind == "not_experience":
            return [{"reward": 1.0}]
        completions = await model.chat(task.messages(), task.sampling.replace(n=task.repeat))
        out = []
        for c in completions:
            reward, _ = await self.reward(c.text, task)
            out.append(Experience(
                tokens=c.prompt_ids + c.response_ids,
                prompt_length=len(c.prompt_ids),
                action_mask=[1] * len(c.response_ids),
                logprobs=list(c.logprobs),
                reward=reward,
                info={"response": c.text},
            ))
        if kind == "str_reward":
            out[0].reward = "1.0"
        if kind == "nan_reward":
            out[-1].reward = float("nan")
        if kind == "short_mask":
            out[0].action_mask = out[0].action_mask + [1]
        return out
'''

EXPECTED = {
    "ok": None,
    "raise": "error",
    "loop_hang": "timeout",
    "thread_hang": "timeout",
    "reward_hang": "reward_timeout",
    "none": "invalid",
    "empty": "empty",
    "not_a_list": "invalid",
    "not_experience": "invalid",
    "str_reward": "invalid",
    "nan_reward": "invalid",
    "short_mask": "invalid",
}


@pytest.fixture(scope="module")
def plugin(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plugins") / "faults.py"
    path.write_text(textwrap.dedent(PLUGIN))
    registry.load_plugin(path)
    return path


def kind_of(task_id: str) -> str:
    faults = list(EXPECTED)[1:]
    i = int(task_id.rsplit("/", 1)[1])
    return "ok" if i % 2 == 0 else faults[(i // 2) % len(faults)]


def test_every_kind_of_fault_costs_only_its_own_task(fault_config, plugin):
    """Half the tasks raise, hang (in the event loop, in a workflow's thread, in a reward's thread) or
    return garbage; the run finishes, trains on the rest, and counts each fault under its reason."""
    config = fault_config(
        {
            "tasks": {
                "total_steps": 3,
                "train": {"workflow": "fault_workflow", "reward": "fault_reward"},
            },
            "explorer": {"max_skip_ratio": 0.9, "dump_rollouts": True},
        }
    )
    start = time.monotonic()
    run(load_config(config))
    elapsed = time.monotonic() - start
    run_dir = run_dir_of(config)
    assert run_status(run_dir)["state"] == "finished"
    assert elapsed < 60  # three 1 s task timeouts, nothing waits for a hang

    rows = jsonl_rows(run_dir / "rollouts.jsonl", missing_ok=True)
    assert len(rows) == 24
    assert {kind_of(r["task_id"]) for r in rows} >= {"ok", "raise", "loop_hang"}
    for r in rows:
        assert r["skipped"] == EXPECTED[kind_of(r["task_id"])], r
        assert len(r["responses"]) == (2 if r["skipped"] is None else 0)

    metrics = step_metrics(run_dir)
    assert len(metrics) == 3
    stuck = 0
    for batch, m in enumerate(metrics):
        mine = [r for r in rows if r["batch"] == batch]
        reasons = Counter(r["skipped"] for r in mine if r["skipped"])
        assert m["explorer/skipped"] == sum(reasons.values())
        assert {k: v for k, v in m.items() if k.startswith("explorer/skipped_")} == {
            f"explorer/skipped_{reason}": float(n) for reason, n in reasons.items()
        }
        kinds = Counter(kind_of(r["task_id"]) for r in mine)
        assert m["explorer/reward_timeouts"] == kinds["reward_hang"]
        stuck += kinds["reward_hang"] + kinds["thread_hang"]  # their threads stay stuck: abandoned
        assert m["explorer/stuck_threads"] == stuck
        assert m["explorer/experiences"] == 2 * kinds["ok"]
        assert all(math.isfinite(v) for k, v in m.items() if isinstance(v, float))


def test_rewards_hanging_in_more_threads_than_the_pool_has_do_not_starve_later_steps(fault_config, plugin):
    """A reward sleeps forever on its first 6 calls (3x the pool's 2 threads), then returns 1.0: those 6
    answers get status reward_error, the stuck workers are replaced, the next step gets every
    experience, and ``trine run`` still exits."""
    config = fault_config(
        {
            "tasks": {"train": {"reward": "hang_first_six"}},
            "explorer": {"timeout": 10.0, "blocking_threads": 2, "max_skip_ratio": 0.8},
        }
    )
    proc, seconds = trine_run(config, plugin)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert seconds < 120  # before: the process never exited (6 stuck non-daemon pool threads)
    run_dir = run_dir_of(config)
    assert run_status(run_dir)["state"] == "finished"
    first, second = step_metrics(run_dir)
    assert first["explorer/reward_timeouts"] == 6.0
    assert first["explorer/status_reward_error"] == 6.0  # their answers are kept, marked, not trained
    assert first["trainer/excluded_status"] == 6.0
    assert first["explorer/stuck_threads"] == 6.0
    # before: 0 experiences (every reward call queued behind the stuck threads and timed out)
    assert second["explorer/experiences"] == 16.0 and second["explorer/reward_timeouts"] == 0.0
    assert second["explorer/reward_mean"] == 1.0


def test_a_run_where_every_task_fails_stops_with_the_reasons_and_exits_nonzero(fault_config, plugin):
    """Every task raises (and the plugin leaves a non-daemon thread running): the run fails at its
    first batch with the reasons and counts, status.json says so, and the process exits with 1
    within seconds although that thread would keep it alive."""
    config = fault_config(
        {
            "tasks": {
                "total_steps": 3,
                "train": {
                    "workflow": "fault_workflow",
                    "workflow_args": {"always": "raise_and_leave_a_thread"},
                },
            }
        }
    )
    proc, seconds = trine_run(config, plugin)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert seconds < 120
    assert "SkipRatioError: 16 of 16 answers of the last 1 batch(es) failed" in proc.stderr
    assert "8 of 8 tasks were skipped" in proc.stderr
    assert "error: 8 (e.g. task train/" in proc.stderr and "RuntimeError: injected fault" in proc.stderr
    assert "would keep the process alive: plugin-stuck-thread" in proc.stderr
    run_dir = run_dir_of(config)
    record = run_status(run_dir)
    assert record["state"] == "failed" and "explorer.max_skip_ratio=0.5" in record["error"]
    assert step_metrics(run_dir) == []  # not a single step was trained


def test_a_reward_that_raises_on_every_call_stops_the_run_failed(fault_config, plugin):
    """Issue 25 item 7: with a reward argument that makes every call raise, each step had 16/16 answers
    ``reward_error`` and the run ended ``finished``, exit 0. Now failed answers count against
    ``explorer.max_skip_ratio``: the run fails at its first batch, naming reward_error and an example."""
    config = fault_config(
        {"tasks": {"total_steps": 3, "train": {"reward": "grader", "reward_args": {"down": True}}}}
    )
    proc, seconds = trine_run(config, plugin)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert seconds < 120
    assert "SkipRatioError: 16 of 16 answers of the last 1 batch(es) failed" in proc.stderr
    assert "answers with status reward_error: 16 (e.g. task train/" in proc.stderr
    assert "ConnectionError: the grading service refused the connection" in proc.stderr
    run_dir = run_dir_of(config)
    record = run_status(run_dir)
    assert record["state"] == "failed" and "reward_error" in record["error"]
    assert "explorer.max_skip_ratio=0.5" in record["error"]
    assert step_metrics(run_dir) == []  # not a single step was trained


def test_reward_args_of_the_wrong_type_fail_validate_all_at_once(fault_config, plugin):
    """A reward argument of the wrong type (a quoted number, a string for a bool) and a misspelt one are
    config errors of ``trine validate``, all in one run, before anything is written."""
    from typer.testing import CliRunner

    from trine.cli import app

    args = {"down": "no", "points": "2", "pionts": 3}
    config = fault_config({"tasks": {"train": {"reward": "grader", "reward_args": args}}})
    result = CliRunner().invoke(app, ["validate", str(config), "--plugin", str(plugin)])
    assert result.exit_code == 2, result.output
    text = " ".join(result.stderr.split())
    assert "train.reward_args['pionts'] is not an argument of reward 'grader'" in text
    assert "train.reward_args['down']='no' (str) does not fit reward 'grader': expected bool" in text
    assert "train.reward_args['points']='2' (str) does not fit reward 'grader': expected int" in text
    assert "write it without quotes (2)" in text
    assert not run_dir_of(config).exists()
