"""The ``reasoning_gym`` reward: reasoning-gym's ``score_answer`` on the final answer and the task's entry."""

from __future__ import annotations

import pytest

from trine.rewards import REWARDS, evaluate_reward
from trine.rewards.reasoning_gym import final_answer
from trine.tasks import TaskSet
from trine.types import Task

rg = pytest.importorskip("reasoning_gym", reason='reasoning-gym is not installed (pip install -e ".[envs]")')


@pytest.fixture(scope="module")
def legs() -> Task:
    return TaskSet(
        generator="reasoning_gym", generator_args={"dataset": "leg_counting", "size": 1, "seed": 3}
    )[0]


def score(response: str, task: Task, **args) -> tuple[float, dict[str, float]]:
    return evaluate_reward(REWARDS["reasoning_gym"], response, task, args)


def test_final_answer_extraction():
    assert final_answer("<think>2+2</think>\n<answer> 4 </answer><|im_end|>") == "4"
    assert final_answer("<answer>3</answer> then <answer>4</answer>") == "4"
    assert final_answer("4") is None and final_answer("<answer>4") is None
    assert final_answer("so\n\nthe answer is\n 4 \n", "last_line") == "4"
    assert final_answer("", "last_line") == "" and final_answer(" 4 </s>", "whole") == "4"


def test_reward_is_score_answer_on_the_entry(legs):
    scorer = rg.get_score_answer_fn("leg_counting")
    for response, extract in [(f"<answer>{legs.answer}</answer>", "answer_tag"), (legs.answer, "whole")]:
        assert score(response, legs, extract=extract) == (1.0, {"score": 1.0, "_exact": 1.0})
        assert scorer(legs.answer, legs.raw) == 1.0
    wrong = str(int(legs.answer) + 1)
    assert score(f"<answer>{wrong}</answer>", legs)[0] == scorer(wrong, legs.raw) == 0.0
    assert score(legs.answer, legs)[0] == 0.0  # answer_tag: no tag, nothing to score


def test_partial_credit_is_kept_or_dropped():
    task = Task(
        task_id="t", question="q", answer="abc", raw={"question": "q", "answer": "abc", "metadata": {}}
    )
    padded = "<answer>abc and more</answer>"  # the default scorer: len(oracle) / len(answer) for containment
    total, parts = score(padded, task, dataset="leg_counting")
    assert 0 < total < 1 and parts["_exact"] == 0.0
    assert score(padded, task, dataset="leg_counting", partial_credit=False) == (
        0.0,
        {"score": 0.0, "_exact": 0.0},
    )


@pytest.mark.parametrize(
    "garbage", ["", "\ufffd" * 50, "<answer></answer>", "x" * 100_000, "<answer>NaN</answer>"]
)
def test_garbage_scores_zero(legs, garbage):
    assert score(garbage, legs)[0] == 0.0


@pytest.mark.parametrize(
    "answer",
    [None, "", 17, 2.5, "\ufffd", 10**5000],
    ids=["none", "empty", "int", "float", "replacement", "huge"],
)
def test_garbage_answers_in_the_entry_score_zero(legs, answer):
    raw = {**legs.raw, "answer": answer}
    task = Task(task_id="t", question="q", answer=answer, raw=raw)
    assert score("<answer>The answer is 3</answer>", task)[0] == 0.0


def test_configuration_errors_are_named(legs):
    bare = Task(task_id="t/0", question="q", answer="1", raw={"question": "q", "answer": "1"})
    with pytest.raises(ValueError, match="task 't/0'.*metadata.source_dataset.*reward_args: {dataset"):
        score("<answer>1</answer>", bare)
    with pytest.raises(ValueError, match="no generator 'leg_countin'"):
        score("<answer>1</answer>", bare, dataset="leg_countin")
    with pytest.raises(ValueError, match="extract='tag'; expected one of"):
        score("<answer>1</answer>", legs, extract="tag")
