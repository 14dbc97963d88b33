"""Issue 26 item 6 on the trainer's side of ``trine serve``: a served config needs no taskset
(``tasks.source: serve``), the trainer reports the reward per weights version (and ``trine status`` shows
it), and ``buffer.end_after_idle`` ends ``trine train`` once the buffer stays idle."""

from __future__ import annotations

import json
import os
import socket

import pytest

from tests.helpers import exp, write_config
from trine.buffer import MemoryBuffer
from trine.config import ConfigError, load_config
from trine.inspect.report import run_status
from trine.launch.processes import ProcessSetupError, as_process
from trine.status import REWARD_VERSION, REWARD_VERSION_MEAN, REWARD_VERSION_ROWS, write_status
from trine.trainer.rewards import VersionRewards
from trine.trainer.sources import BufferIdle


def served(tmp_path, tiny_model_dir, **changes) -> dict:
    """A served config (``tasks.source: serve``) as a dict, with ``changes`` (top-level keys) replaced."""
    data = {
        "name": "served",
        "run_dir": str(tmp_path / "run"),
        "mode": "async",
        "launch": "processes",
        "model": {"path": str(tiny_model_dir)},
        "tasks": {"source": "serve", "total_steps": 3},
        "buffer": {"storage": "sql", "whole_groups": True, "end_after_idle": 5},
        "trainer": {"batch_size": 8},
        "monitor": {"sinks": ["jsonl"], "plot": False},
    }
    return {**data, **changes}


def test_a_served_config_needs_no_taskset(tmp_path, tiny_model_dir):
    (cfg,) = load_config(write_config(tmp_path / "c.yaml", served(tmp_path, tiny_model_dir)))
    assert cfg.tasks.train is None and cfg.trainer_batch_rows == 8 and cfg.buffer.end_after_idle == 5
    assert as_process([cfg], "train").launch == "processes"
    with pytest.raises(
        ProcessSetupError, match="tasks.source: serve.*`trine serve CONFIG`.*`trine train CONFIG`"
    ):
        as_process([cfg], "explore")


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"mode": "sync", "launch": "thread"}, "tasks.source: serve .*mode async \\(mode is 'sync'\\)"),
        ({"trainer": {}}, "tasks.source: serve needs trainer.batch_size"),
        ({"launch": "thread"}, "set launch: processes"),
        (
            {"buffer": {"storage": "sql", "end_after_idle": 900}},
            "end_after_idle=900 is not below sync.wait_timeout",
        ),
    ],
)
def test_served_configs_that_cannot_run_are_refused_with_the_fix(changes, words, tmp_path, tiny_model_dir):
    path = write_config(tmp_path / "c.yaml", served(tmp_path, tiny_model_dir, **changes))
    with pytest.raises(ConfigError, match=words):
        load_config(path)


def test_a_served_config_with_a_taskset_says_it_is_not_read(tmp_path, tiny_model_dir):
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "1+1", "answer": "2"}\n')
    tasks = {"source": "serve", "total_steps": 3, "train": {"path": str(rows)}}
    path = write_config(tmp_path / "c.yaml", served(tmp_path, tiny_model_dir, tasks=tasks))
    with pytest.raises(ConfigError, match="tasks.train is not read with tasks.source: serve"):
        load_config(path)


def test_a_config_without_a_taskset_still_says_it_needs_one(tmp_path, tiny_model_dir):
    data = served(tmp_path, tiny_model_dir, tasks={"total_steps": 3})
    with pytest.raises(ConfigError, match="tasks.train is required.*tasks.source: serve when agents"):
        load_config(write_config(tmp_path / "c.yaml", data))


def test_rewards_are_reported_for_the_newest_version_no_longer_sampled():
    rewards = VersionRewards()
    assert rewards.add([exp(0, reward=1.0, version=0), exp(1, reward=0.0, version=0)]) == {}  # none complete
    step = rewards.add([exp(2, reward=1.0, version=0), exp(3, reward=0.5, version=1), exp(4, reward=None)])
    assert step == {REWARD_VERSION: 0.0, REWARD_VERSION_MEAN: pytest.approx(2 / 3), REWARD_VERSION_ROWS: 3.0}
    step = rewards.add([exp(5, reward=1.0, version=1), exp(6, reward=0.0, version=3, kind="sft")])
    assert step == {REWARD_VERSION: 0.0, REWARD_VERSION_MEAN: pytest.approx(2 / 3), REWARD_VERSION_ROWS: 3.0}
    step = rewards.add([exp(7, reward=0.0, version=3)])
    assert step == {REWARD_VERSION: 1.0, REWARD_VERSION_MEAN: 0.75, REWARD_VERSION_ROWS: 2.0}  # 2 skipped


def test_an_idle_buffer_ends_after_its_seconds_and_new_rows_or_rewards_restart_the_count():
    now = [0.0]
    buffer = MemoryBuffer()
    idle = BufferIdle(buffer, 10.0, clock=lambda: now[0])
    assert idle.why() is None
    now[0] = 9.0
    assert idle.why() is None
    buffer.put([exp(0, reward=None)])  # a row arrives (pending): busy again
    now[0] = 15.0
    assert idle.why() is None
    now[0] = 24.0
    assert idle.why() is None
    now[0] = 25.0
    assert "no new row and no reward in the buffer for 10s (buffer.end_after_idle=10)" in idle.why()
    idle.reset()  # a step was trained
    assert idle.why() is None


def test_status_of_a_served_run_shows_the_reward_by_weights_version(tmp_path):
    run = tmp_path / "run"
    (run / "servers" / "0").mkdir(parents=True)
    write_status(run, "running", step=2, pid=os.getpid(), host=socket.gethostname())
    lines = [
        {"step": 1, "trainer/reward_mean": 0.25},
        {
            "step": 2,
            "trainer/reward_mean": 0.5,
            REWARD_VERSION: 0.0,
            REWARD_VERSION_MEAN: 0.3,
            REWARD_VERSION_ROWS: 12.0,
        },
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    report = run_status(run)
    assert report.lines()[1] == "  reward: 0.5 at the last step; weights version 0: 0.3 (12 rows)"
    assert report.as_dict()["reward"] == "0.5 at the last step; weights version 0: 0.3 (12 rows)"
