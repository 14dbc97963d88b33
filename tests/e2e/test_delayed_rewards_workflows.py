"""Delayed rewards in an environment workflow (issue 26 item 5): ``multi_turn`` with ``defer_reward`` leaves each
episode's reward pending, the stand-alone grader process of the single-turn test (tests/e2e/grader.py) fills
them seconds later through ``trine buffer reward``, and training waits for them and trains on the grader's
rewards. That delayed rewards *teach* is shown once, on single-turn (tests/e2e/test_delayed_rewards.py): the
rows and the trainer's path after the grader are the same for every workflow."""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import read_metrics
from trine.buffer.inspect import read_rows
from trine.config import load_config
from trine.loop import run
from trine.types import Task

pytestmark = pytest.mark.slow

STEPS = 6


class QuestionEnv:
    """An episode of one turn: the task's question is the first observation, the reply ends it. Its own
    reward is 0: the grader decides (the conversation renders exactly as a single-turn prompt, so the
    single-turn eval measures what the multi-turn training taught)."""

    async def reset(self, task: Task) -> str:
        return str(task.question)

    async def step(self, action: str) -> tuple[str, float, bool, dict]:
        return "", 0.0, True, {}

    def state_hash(self) -> str:
        return "question"


def test_multi_turn_episodes_graded_by_another_process_after_the_episode_train(
    sft_start, arithmetic_config, tmp_path
):
    workflow_args = {"env": f"{__name__}:QuestionEnv", "max_steps": 1, "defer_reward": True}
    cfg = arithmetic_config(
        {
            "model": {"path": str(sft_start)},
            "buffer": {"storage": "sql", "get_timeout": 120},
            "tasks": {
                "batch_size": 8,
                "total_steps": STEPS,
                "eval": [],
                "train": {
                    "repeat": 8,
                    "sampling": {"max_tokens": 6},
                    "workflow": "multi_turn",
                    "workflow_args": workflow_args,
                },
            },
            "trainer": {"lr": 1e-3},
            "eval": {"every": 0, "at_start": False},
        },
        name="delayed_multi_turn",
    )
    run_dir, stop = tmp_path / "delayed_multi_turn", tmp_path / "stop"
    grader = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("grader.py")), str(run_dir), "0.3", str(stop)]
    )
    try:
        run(load_config(cfg))
    finally:
        stop.touch()
        grader.wait(timeout=30)
    rows = read_metrics(run_dir)
    steps = [r for r in rows if "trainer/loss" in r]
    assert len(steps) == STEPS
    assert all(r["explorer/reward_pending"] == 8 * 8 for r in steps)  # no episode was scored when played
    assert all(r["explorer/turns_mean"] == 1.0 for r in steps)
    stored = read_rows(run_dir)
    assert len(stored) == STEPS * 8 * 8
    assert all(status == "trained" and e.reward is not None for e, status in stored)  # graded, then trained
    assert all(e.info["turns"] == 1 and e.info["env_return"] == 0.0 for e, _ in stored)
    # the grader's verdict (the reply is the answer), not the environment's 0, is what was trained
    assert all(e.reward == float(e.info["response"].strip() == str(e.info["answer"])) for e, _ in stored)
    graded = statistics.fmean(float(e.reward) for e, _ in stored)
    trained = statistics.fmean(r["trainer/reward_mean"] for r in steps)
    assert 0.0 < graded < 1.0 and trained == pytest.approx(graded), (trained, graded)
    assert all(r["trainer/advantages_abs_mean"] > 0 for r in steps)  # groups with right and wrong answers
