"""Explorer with the real HFEngine: failing, hanging and empty workflows are skipped and counted."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
import torch

from trine import registry
from trine.explorer import Explorer
from trine.models import load_model, load_tokenizer
from trine.models.engine import HFEngine
from trine.types import Experience, SamplingParams, Task

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class RaisingWorkflow:
    attempts = 0

    def __init__(self, reward) -> None:
        self.reward = reward

    async def run(self, task: Task, model) -> list[Experience]:
        type(self).attempts += 1
        raise RuntimeError("environment crashed")


class HangingWorkflow:
    def __init__(self, reward) -> None:
        self.reward = reward

    async def run(self, task: Task, model) -> list[Experience]:
        await asyncio.sleep(100)
        return []


class EmptyWorkflow:
    """Resolved by import path (``module:attr``), not registered."""

    def __init__(self, reward, note: str = "") -> None:
        self.reward = reward
        self.note = note

    async def run(self, task: Task, model) -> list[Experience]:
        return []


@pytest.fixture(scope="module", autouse=True)
def plugins():
    registry.register("workflow", "test_raising")(RaisingWorkflow)
    registry.register("workflow", "test_hanging")(HangingWorkflow)
    yield
    for name in ("test_raising", "test_hanging"):
        registry._extra.get("workflow", {}).pop(name, None)


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    engine = HFEngine(load_model(tiny_model_dir), load_tokenizer(tiny_model_dir), seed=0)
    yield engine
    engine.close()


def task(
    task_id: str,
    *,
    workflow: str = "single_turn",
    question: str = "What is 2+3?",
    answer: str = "5",
    repeat: int = 2,
    **kwargs,
) -> Task:
    sampling = kwargs.pop("sampling", SamplingParams(temperature=1.0, max_tokens=6))
    return Task(
        task_id=task_id,
        question=question,
        answer=answer,
        workflow=workflow,
        reward="exact_match",
        repeat=repeat,
        sampling=sampling,
        **kwargs,
    )


def test_bad_workflows_are_skipped_and_counted_while_good_tasks_come_back(engine, tmp_path):
    explorer = Explorer(engine, timeout=0.5, max_retries=1, rollouts_path=tmp_path / "rollouts.jsonl")
    RaisingWorkflow.attempts = 0
    tasks = [
        task("good-1", repeat=3),
        task("raises", workflow="test_raising"),
        task("hangs", workflow="test_hanging"),
        task("empty", workflow=f"{__name__}:EmptyWorkflow", workflow_args={"note": "x"}),
        task("good-2", question="hi", repeat=2),
    ]
    start = time.monotonic()
    experiences, metrics = explorer.explore(tasks, batch_index=4, version=7)
    elapsed = time.monotonic() - start
    explorer.close()

    assert 0.95 <= elapsed < 10.0  # two 0.5 s attempts of the hanging task, nothing waits 100 s
    assert RaisingWorkflow.attempts == 2  # first try + one retry
    assert [e.task_id for e in experiences] == ["good-1"] * 3 + ["good-2"] * 2
    assert [e.group_id for e in experiences] == ["good-1@4"] * 3 + ["good-2@4"] * 2
    assert len({e.run_id for e in experiences}) == 5
    for e in experiences:
        e.check()
        assert e.policy_version == 7 and e.info["batch"] == 4
        assert e.reward in (0.0, 1.0) and 1 <= e.response_length <= 6
        assert e.info["temperature"] == 1.0 and len(e.logprobs) == e.response_length
    assert metrics["explorer/tasks"] == 5.0 and metrics["explorer/experiences"] == 5.0
    assert metrics["explorer/skipped"] == 3.0
    assert metrics["explorer/skipped_error"] == 1.0
    assert metrics["explorer/skipped_timeout"] == 1.0
    assert metrics["explorer/skipped_empty"] == 1.0
    assert metrics["explorer/retries"] == 3.0  # each skipped task used its one retry
    assert 0.0 <= metrics["explorer/reward_mean"] <= 1.0

    rows = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    assert [(r["task_id"], r["skipped"], len(r["responses"])) for r in rows] == [
        ("good-1", None, 3),
        ("raises", "error", 0),
        ("hangs", "timeout", 0),
        ("empty", "empty", 0),
        ("good-2", None, 2),
    ]


def test_a_retry_that_succeeds_is_not_skipped(engine):
    class FlakyWorkflow:
        calls = 0

        def __init__(self, reward) -> None:
            self.reward = reward

        async def run(self, task: Task, model) -> list[Experience]:
            type(self).calls += 1
            if type(self).calls == 1:
                raise ConnectionError("first call fails")
            (completion,) = await model.chat(task.messages(), task.sampling)
            reward, _ = await self.reward(completion.text, task)
            return [
                Experience(
                    tokens=completion.prompt_ids + completion.response_ids,
                    prompt_length=len(completion.prompt_ids),
                    action_mask=[1] * len(completion.response_ids),
                    logprobs=completion.logprobs,
                    reward=reward,
                )
            ]

    registry.register("workflow", "test_flaky")(FlakyWorkflow)
    try:
        explorer = Explorer(engine, timeout=5.0, max_retries=2)
        experiences, metrics = explorer.explore(
            [task("flaky", workflow="test_flaky")], batch_index=0, version=1
        )
        explorer.close()
    finally:
        registry._extra["workflow"].pop("test_flaky")
    assert len(experiences) == 1 and FlakyWorkflow.calls == 2
    assert metrics["explorer/skipped"] == 0.0 and metrics["explorer/retries"] == 1.0
    assert experiences[0].group_id == "flaky@0"


def _greedy_text(engine, question: str) -> str:
    prompt = engine.encode_chat([{"role": "user", "content": question}])
    (completion,) = engine.generate_batch([(prompt, SamplingParams(temperature=0.0, max_tokens=6))])[0]
    return completion.text


def test_evaluate_reports_accuracy_avg_and_pass_at_k_without_touching_the_generator(engine):
    candidates = ["def f(x):", "What is 2+3?", "hi", "abc", "Once upon a time"]
    solvable = next((q for q in candidates if _greedy_text(engine, q).strip()), None)
    assert solvable is not None, "no candidate question has a non-blank greedy answer"
    sampling = SamplingParams(temperature=1.0, max_tokens=6)
    tasks = [
        task("solvable", question=solvable, answer=_greedy_text(engine, solvable).strip(), sampling=sampling),
        task("unsolvable", question="hi", answer="no such answer", sampling=sampling),
    ]
    explorer = Explorer(engine, timeout=10.0)
    before = engine.generator.get_state()
    result = explorer.evaluate(tasks, name="toy", k=4, greedy=True, seed=3)
    assert torch.equal(engine.generator.get_state(), before)
    assert set(result) == {"eval/toy/accuracy", "eval/toy/avg@4", "eval/toy/pass@4"}
    assert result["eval/toy/accuracy"] == 0.5  # greedy solves exactly the first task
    assert 0.0 <= result["eval/toy/avg@4"] <= result["eval/toy/pass@4"] <= 0.5
    assert explorer.evaluate(tasks, name="toy", k=4, greedy=True, seed=3) == result  # reproducible
    assert set(explorer.evaluate(tasks, name="toy", k=0, greedy=True, seed=3)) == {"eval/toy/accuracy"}
    explorer.close()
