"""What rollouts came to (issue 26 item 3): mean return, success rate, invalid actions and turns per batch,
per taskset and per eval taskset; one evaluation of the same weights at a stage boundary."""

from __future__ import annotations

import pytest

from tests.helpers import exp
from trine.explorer import Evaluator, Explorer
from trine.explorer.outcomes import batch_metrics, outcomes
from trine.tasks import TaskSet
from trine.types import SamplingParams, Task
from trine.workflows.envs import grid_world_tasks

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _rollouts():
    """A batch of two tasksets: ``game`` (two 2-step episodes, returns 0.5 and 0; 1 and 2 invalid moves)
    and ``math`` (two single-turn answers, rewards 1 and 0)."""
    steps = []
    for run, (ret, invalid) in enumerate([(0.5, 1), (0.0, 2)]):
        for t in range(2):
            info = {"taskset": "game", "last_step": t == 1, "episode_return": ret, "episode_length": 2}
            steps.append(exp(run, reward=ret if t else 0.0, info={**info, "invalid_actions": invalid}))
    answers = [exp(9, reward=r, info={"taskset": "math"}) for r in (1.0, 0.0)]
    return steps + answers


def test_one_outcome_per_rollout_with_its_return_turns_and_invalid_actions():
    done = outcomes(_rollouts())
    assert [(o.taskset, o.value, o.turns, o.invalid) for o in done] == [
        ("game", 0.5, 2.0, 1.0),
        ("game", 0.0, 2.0, 2.0),
        ("math", 1.0, None, None),
        ("math", 0.0, None, None),
    ]
    assert outcomes([exp(0, reward=None)])[0].value is None  # pending: no return yet


def test_a_batch_of_two_tasksets_reports_each_at_the_success_threshold():
    m = batch_metrics(_rollouts(), threshold=0.5)
    assert m["explorer/success_rate"] == 0.5 and m["explorer/invalid_actions"] == 1.5
    assert m["explorer/game/return_mean"] == 0.25 and m["explorer/game/success_rate"] == 0.5
    assert m["explorer/game/invalid_actions"] == 1.5 and m["explorer/game/turns_mean"] == 2.0
    assert m["explorer/math/return_mean"] == 0.5 and m["explorer/math/success_rate"] == 0.5
    assert "explorer/math/turns_mean" not in m  # single-turn answers count no turns
    one = batch_metrics(_rollouts()[4:], threshold=1.0)  # one taskset: no per-taskset keys
    assert one == {"explorer/success_rate": 0.5}


def test_eval_of_a_game_reports_return_invalid_actions_and_turns(engine):
    """The tiny model's replies are mostly not moves: most steps of the grid world are invalid actions."""
    rows = grid_world_tasks(3, size=3, max_steps=2)
    tasks = [
        Task(
            f"grid/{i}",
            row["question"],
            raw=row,
            workflow="grid_world",
            sampling=SamplingParams(temperature=1.0, max_tokens=4),
        )
        for i, row in enumerate(rows)
    ]
    explorer = Explorer(engine, timeout=30.0)
    try:
        m = explorer.evaluate(tasks, name="grid", k=2, greedy=True, seed=1)
    finally:
        explorer.close()
    assert m["eval/grid/accuracy"] == m["eval/grid/avg@2"] == 0.0
    assert m["eval/grid/return_mean"] <= 0.0
    assert 1.0 <= m["eval/grid/turns_mean"] <= 2.0  # max_steps=2; a step into a hole ends the game
    assert 0.5 <= m["eval/grid/invalid_actions"] <= m["eval/grid/turns_mean"]  # mostly no move at all


def test_the_next_stage_reuses_the_evaluation_of_the_same_weights_and_tasks(tmp_path):
    data = tmp_path / "eval.jsonl"
    data.write_text('{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": "4"}\n')
    tasksets = [TaskSet(str(data), name="add")]
    evaluator = Evaluator(explorer=None, tasksets=tasksets, k=2)  # type: ignore[arg-type]
    result = {"eval/add/accuracy": 0.5}
    stages = {"sft": {"eval_end": result, "eval_key": evaluator.key(10)}, "rl": {}}
    assert evaluator.seen(10, stages) == result
    assert evaluator.seen(11, stages) is None  # other weights
    other = Evaluator(explorer=None, tasksets=tasksets, k=4)  # type: ignore[arg-type]
    assert other.seen(10, stages) is None  # another evaluation of the same weights
    assert Evaluator(None, tasksets, k=2, success_threshold=0.5).seen(10, stages) is None  # type: ignore[arg-type]
