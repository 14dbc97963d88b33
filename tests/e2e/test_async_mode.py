"""Mode ``async`` in one process: explorer and trainer run concurrently, meet at the buffer and at weight
sync; the staleness bound holds; the run ends when the tasks run out; explorer failures surface."""

from __future__ import annotations

import importlib

import pytest

from tests.helpers import EXAMPLE, read_metrics, write_arithmetic_config
from trine.config import load_config, validate_dict
from trine.loop import run

HERE = "tests.e2e.test_async_mode"
"""This module's import path: runs import its workflow classes by it (pytest imports the file under another
name, so class attributes are set on that module)."""


def _config(tmp_path, model_dir, name="async", **extra):
    base = {"mode": "async", "tasks": {"total_steps": 6}, "buffer": {"max_staleness": 1}}
    return write_arithmetic_config(tmp_path, model_dir, name, base, extra)


@pytest.mark.parametrize("storage", ["memory", "sql"])
def test_async_trains_every_step_within_the_staleness_bound(storage, tmp_path, tiny_model_dir):
    run(load_config(_config(tmp_path, tiny_model_dir, buffer={"storage": storage})))
    rows = [r for r in read_metrics(tmp_path / "async") if "trainer/loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert [r["trainer/version"] for r in rows] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert all(r["trainer/batch_size"] == 16 for r in rows)  # tasks.batch_size (4) x repeat (4)
    assert all(r["buffer/staleness_max"] <= 1 for r in rows)  # the explorer runs ahead, never too far
    reported = [
        r for r in rows if "explorer/batches" in r
    ]  # a step line reports the batches put since the last
    assert sum(r["explorer/batches"] for r in reported) >= 6 and all(
        "explorer/paced_seconds" in r for r in reported
    )
    assert any(r["buffer/staleness_max"] == 1 for r in rows)  # ...but it does run ahead


def test_async_with_no_staleness_bound_a_trainer_batch_of_its_own_and_oversampling(tmp_path, tiny_model_dir):
    cfg = _config(
        tmp_path,
        tiny_model_dir,
        buffer={"max_staleness": None},
        trainer={"batch_size": 8},
        explorer={"oversample": 2.0},
    )
    run(load_config(cfg))
    rows = [r for r in read_metrics(tmp_path / "async") if "trainer/loss" in r]
    assert len(rows) == 6 and all(r["trainer/batch_size"] == 8 for r in rows)
    reported = [r for r in rows if "explorer/batches" in r]
    assert reported and all(
        r["explorer/version_spread"] >= 0 and "explorer/version_min" in r for r in reported
    )


def test_async_ends_when_the_tasks_run_out(tmp_path, tiny_model_dir):
    data = tmp_path / "eight.jsonl"
    data.write_text("".join(f'{{"question": "{i} + 1 =", "answer": "{i + 1}"}}\n' for i in range(8)))
    cfg = _config(
        tmp_path,
        tiny_model_dir,
        tasks={"total_steps": None, "train": {"path": str(data)}, "epochs": 1},
    )
    run(load_config(cfg))  # 8 tasks x 4 samples = 2 steps of 16; then the explorer has nothing left
    rows = [r for r in read_metrics(tmp_path / "async") if "trainer/loss" in r]
    assert len(rows) == 2


def test_an_explorer_failure_stops_the_run_with_its_error(tmp_path, tiny_model_dir, monkeypatch):
    from trine.modes import asynchronous

    def broken(*args, **kwargs):
        raise RuntimeError("explorer broke")

    monkeypatch.setattr(asynchronous, "stream", broken)
    with pytest.raises(RuntimeError, match="explorer broke"):
        run(load_config(_config(tmp_path, tiny_model_dir)))


def test_async_settings_are_checked_at_validate_time(tmp_path, tiny_model_dir):
    def errors(**data):
        raw = {
            "model": {"path": str(tiny_model_dir)},
            "tasks": {"total_steps": 1, "train": {"path": str(EXAMPLE / "data" / "train.jsonl")}},
            **data,
        }
        return " ".join(validate_dict(raw)[1])

    assert "trainer.batch_size=8: mode 'sync' trains on one explored batch" in errors(
        trainer={"batch_size": 8}
    )
    assert "sync.sync_offset=1 is for mode sync" in errors(mode="async", sync={"sync_offset": 1})
    assert "sync.method 'shared' with mode async" in errors(mode="async", sync={"method": "shared"})
    both = errors(explorer={"tail_seconds": 5, "partial_rollout": True})
    assert "explorer.tail_seconds=5.0 is read by mode async only" in both
    assert "explorer.partial_rollout=True is read by mode async only" in both
    recompute = errors(mode="async", explorer={"partial_rollout": True}, trainer={"recompute_logprobs": True})
    assert "trainer.recompute_logprobs=true would replace them" in recompute
    streams = errors(mode="async", launch="processes", buffer={"storage": "sql"}, explorer={"oversample": 2})
    assert streams == ""  # explorer processes stream too
    processes = errors(
        mode="async", launch="processes", buffer={"storage": "sql"}, explorer={"partial_rollout": True}
    )
    assert "explorer processes load new weights between generations" in processes
    (cfg,), problems = validate_dict(
        {
            "mode": "async",
            "model": {"path": str(tiny_model_dir)},
            "tasks": {"total_steps": 1, "train": {"path": str(EXAMPLE / "data" / "train.jsonl")}},
        }
    )
    assert not problems and cfg.sync_method == "copy"


def test_a_stopped_async_run_resumes_with_the_tasks_it_had_in_flight(tmp_path, tiny_model_dir):
    import torch

    from trine.trainer.checkpoint import list_checkpoints

    slow = importlib.import_module(HERE).SlowForOneTask  # the class the run imports by its path
    slow.started, slow.delay = (
        0,
        60.0,
    )  # its first task is still running at step 3, whatever the machine's load
    over = {"trainer": {"save_every": 2}, "explorer": {"oversample": 2.0}, "buffer": {"max_staleness": None}}
    train = {"workflow": f"{HERE}:SlowForOneTask"}
    cfg = _config(tmp_path, tiny_model_dir, tasks={"total_steps": 6, "train": train}, **over)  # unpaced
    try:
        run(load_config(cfg, ["stop_after_steps=3"]))  # stops at step 3, the slow task in flight
    finally:
        slow.delay = 3.0
    (checkpoint,) = list_checkpoints(tmp_path / "async" / "checkpoints")[-1:]
    state = torch.load(checkpoint / "loop_state.pt", weights_only=False)["explorer"]
    assert state["unfinished"] and all(
        hasattr(t, "task_id") for t in state["unfinished"]
    )  # run first on resume
    run(load_config(cfg))
    rows = [r for r in read_metrics(tmp_path / "async") if "trainer/loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]


class SlowForOneTask:
    """Single-turn, but the first task it runs takes 3 s more (a long tail)."""

    started = 0
    delay = 3.0

    def __init__(self, reward=None, **kwargs):
        from trine.workflows import SingleTurnWorkflow

        self.inner = SingleTurnWorkflow(reward, **kwargs)

    async def run(self, task, model):
        import asyncio

        SlowForOneTask.started += 1
        if SlowForOneTask.started == 1:
            await asyncio.sleep(SlowForOneTask.delay)
        return await self.inner.run(task, model)


def test_tail_batch_defers_a_slow_task_instead_of_holding_batches(tmp_path, tiny_model_dir):
    importlib.import_module(HERE).SlowForOneTask.started = 0  # the class the run imports by its path
    train = {"workflow": f"{HERE}:SlowForOneTask"}
    over = {"tasks": {"total_steps": 4, "train": train}, "buffer": {"max_staleness": None}}
    cfg = _config(tmp_path, tiny_model_dir, name="tail", explorer={"tail_seconds": 0.3}, **over)
    run(load_config(cfg))
    rows = [r for r in read_metrics(tmp_path / "tail") if "trainer/loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert sum(r.get("explorer/tail_deferred", 0) for r in rows) > 0  # (a mean over the batches reported)
    # the slow task's batch was put after batches of tasks started later: the first put held no wait of 3 s
    first_put = next(r for r in rows if "explorer/batches" in r)
    assert first_put["time/explore_seconds"] < 2.5


def test_partial_rollout_samples_span_versions_and_keep_their_logprobs(tmp_path, tiny_model_dir):
    from trine.buffer.inspect import read_rows

    over = {
        "tasks": {"total_steps": 6, "train": {"sampling": {"max_tokens": 48, "ignore_eos": True}}},
        "buffer": {"storage": "sql", "max_staleness": 2},
    }
    cfg = _config(tmp_path, tiny_model_dir, name="partial", explorer={"partial_rollout": True}, **over)
    run(load_config(cfg))
    rows = [r for r in read_metrics(tmp_path / "partial") if "trainer/loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    reported = [r for r in rows if "explorer/partial_samples" in r]
    assert sum(r["explorer/partial_samples"] for r in reported) > 0
    assert max(r["explorer/version_spread"] for r in reported) >= 1
    spanning = [e for e, _ in read_rows(tmp_path / "partial") if "token_versions" in e.info]
    assert spanning
    for e in spanning:
        versions = e.info["token_versions"]
        assert len(versions) == e.response_length == len(e.logprobs)
        assert versions == sorted(versions) and versions[0] == e.policy_version
        assert e.info["version_spread"] == versions[-1] - versions[0] >= 1


def test_multi_taskset_weights_keep_working_in_async(tmp_path, tiny_model_dir):
    import collections
    import json

    from trine.buffer.inspect import read_rows

    other = tmp_path / "other.jsonl"
    other.write_text(
        "".join(json.dumps({"question": f"{i} * 1 =", "answer": str(i)}) + "\n" for i in range(40))
    )
    train = {"name": "add", "weight": 3.0}
    over = {
        "tasks": {
            "total_steps": 6,
            "train": train,
            "mix": [{"name": "mul", "path": str(other), "weight": 1.0}],
        },
        "buffer": {"storage": "sql", "max_staleness": 2},
        "explorer": {"oversample": 2.0},
    }
    run(load_config(_config(tmp_path, tiny_model_dir, name="mixed", **over)))
    rows = [r for r in read_metrics(tmp_path / "mixed") if "trainer/loss" in r]
    assert len(rows) == 6
    per_taskset = collections.Counter(e.task_id.split("/")[0] for e, _ in read_rows(tmp_path / "mixed"))
    assert set(per_taskset) == {"add", "mul"}
    assert per_taskset["add"] > per_taskset["mul"]  # weights 3 : 1 (by tasks drawn, not exactly)


def test_a_task_dropped_as_stale_is_explored_again_with_newer_weights(tmp_path, tiny_model_dir):
    """The first task takes 1 s: with a tail batch the others go on without it and the trainer moves past
    ``max_staleness`` (0), so its rows are dropped as stale when they arrive; the explorer explores it again
    (``buffer.stale_retries``) with newer weights and those rows are trained."""
    import sqlite3

    slow = importlib.import_module(HERE).SlowForOneTask
    slow.started, slow.delay = 0, 1.0  # a few trainer steps: the tiny model's take ~0.05 s
    train = {"workflow": f"{HERE}:SlowForOneTask"}
    over = {"tasks": {"total_steps": 30, "train": train}, "buffer": {"storage": "sql", "max_staleness": 0}}
    cfg = _config(tmp_path, tiny_model_dir, name="retry", explorer={"tail_seconds": 0.2}, **over)
    try:
        run(load_config(cfg))
    finally:
        slow.delay = 3.0
    rows = [r for r in read_metrics(tmp_path / "retry") if "trainer/loss" in r]
    assert [r["step"] for r in rows] == list(range(1, 31))
    assert sum(r.get("explorer/tasks_retried", 0) * r.get("explorer/batches", 1) for r in rows) >= 1
    db = sqlite3.connect(tmp_path / "retry" / "buffer.db")
    dropped = db.execute(
        "SELECT task_id, MAX(task_seq) FROM experiences WHERE reward_status = 'dropped' GROUP BY task_id"
    ).fetchall()
    assert dropped, "the slow task's rows should have been dropped as stale"
    (task, seq), *_ = dropped
    again = db.execute(
        "SELECT MIN(policy_version) FROM experiences WHERE task_id = ? AND consumed_at IS NOT NULL AND task_seq > ?",
        (task, seq),
    ).fetchone()[0]
    assert again is not None and again >= 1, "the slow task, explored again, should have been trained"
