"""Explorer with the real HFEngine: failing, hanging and empty workflows are skipped and counted."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time

import numpy
import pytest
import torch

from trine import registry
from trine.explorer import Explorer, SkipRatioError
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
        reward=kwargs.pop("reward", "exact_match"),
        repeat=repeat,
        sampling=sampling,
        **kwargs,
    )


def test_bad_workflows_are_skipped_and_counted_while_good_tasks_come_back(engine, tmp_path):
    explorer = Explorer(
        engine, timeout=0.5, max_retries=1, rollouts_path=tmp_path / "rollouts.jsonl", max_skip_ratio=1.0
    )
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


def test_pending_rewards_are_counted_not_averaged(engine):
    """Deferred rewards (human feedback, an external judge) leave ``reward_mean`` NaN (nothing scored yet)
    and are counted in ``explorer/reward_pending``, which the console shows instead of a NaN reward."""
    explorer = Explorer(engine)
    try:
        _, pending = explorer.explore(
            [task("later", repeat=3, workflow_args={"defer_reward": True})], batch_index=0, version=0
        )
        _, scored = explorer.explore([task("now", repeat=2)], batch_index=1, version=0)
    finally:
        explorer.close()
    assert pending["explorer/reward_pending"] == 3.0 and math.isnan(pending["explorer/reward_mean"])
    assert "explorer/reward_pending" not in scored and 0.0 <= scored["explorer/reward_mean"] <= 1.0


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
    assert set(result) == {"eval/toy/accuracy", "eval/toy/avg@4", "eval/toy/pass@4", "eval/toy/return_mean"}
    assert result["eval/toy/accuracy"] == 0.5  # greedy solves exactly the first task
    assert 0.0 <= result["eval/toy/avg@4"] <= result["eval/toy/pass@4"] <= 0.5
    assert explorer.evaluate(tasks, name="toy", k=4, greedy=True, seed=3) == result  # reproducible
    greedy_only = explorer.evaluate(tasks, name="toy", k=0, greedy=True, seed=3)
    assert set(greedy_only) == {"eval/toy/accuracy", "eval/toy/return_mean"}  # mean reward of the greedy
    assert greedy_only["eval/toy/return_mean"] == 0.5
    explorer.close()


# ------------------------------------------------------------------ garbage, hangs and skip ratios


class GarbageWorkflow:
    """Samples one real completion, then returns what ``task.raw["kind"]`` names."""

    def __init__(self, reward) -> None:
        self.reward = reward

    async def run(self, task: Task, model):
        (c,) = await model.chat(task.messages(), task.sampling.replace(n=1))
        n = len(c.response_ids)

        def exp(**changes) -> Experience:
            fields = dict(
                tokens=c.prompt_ids + c.response_ids,
                prompt_length=len(c.prompt_ids),
                action_mask=[1] * n,
                logprobs=list(c.logprobs),
                reward=1.0,
            )
            return Experience(**{**fields, **changes})

        kind = task.raw["kind"]
        return {
            "good": lambda: [
                exp(reward=numpy.float32(0.5), info={"reward_parts": {"a": numpy.float64(0.5)}})
            ],
            "none": lambda: None,
            "not_a_list": lambda: "done",
            "not_experiences": lambda: [{"tokens": [1, 2]}],
            "str_reward": lambda: [exp(reward="1.0")],
            "nan_reward": lambda: [exp(reward=float("nan"))],
            "inf_reward": lambda: [exp(), exp(reward=float("-inf"))],
            "short_mask": lambda: [exp(action_mask=[1] * (n + 1))],
            "short_logprobs": lambda: [exp(logprobs=[0.0])] if n != 1 else [exp(logprobs=[])],
            "str_tokens": lambda: [exp(tokens=[str(t) for t in c.prompt_ids + c.response_ids])],
            "long_token_rewards": lambda: [exp(token_rewards=[0.0] * (n + 1))],
            "str_part": lambda: [exp(info={"reward_parts": {"a": "high"}})],
            "nan_return": lambda: [exp(info={"last_step": True, "episode_return": float("nan")})],
        }[kind]()


KINDS = [
    "good",
    "none",
    "not_a_list",
    "not_experiences",
    "str_reward",
    "nan_reward",
    "inf_reward",
    "short_mask",
    "short_logprobs",
    "str_tokens",
    "long_token_rewards",
    "str_part",
    "nan_return",
]


def test_the_async_core_runs_in_a_callers_event_loop_like_the_blocking_wrapper(tiny_model_dir):
    """``explore_async`` / ``evaluate_async`` can be awaited from a loop the caller owns (a server, an
    actor); the blocking wrappers give the same results from the same seed."""

    def fresh() -> HFEngine:
        return HFEngine(load_model(tiny_model_dir), load_tokenizer(tiny_model_dir), seed=11)

    sampling = SamplingParams(temperature=1.0, max_tokens=4)
    tasks = [task(f"t{i}", question=q, answer="5", sampling=sampling) for i, q in enumerate(["2+3=", "1+4="])]
    blocking_engine, async_engine = fresh(), fresh()
    blocking = Explorer(blocking_engine, timeout=10.0)
    exps, metrics = blocking.explore(tasks, batch_index=0, version=3)
    evals = blocking.evaluate(tasks, name="x", k=2, greedy=True, seed=5)

    async def in_my_loop():
        explorer = Explorer(async_engine, timeout=10.0)
        got = await explorer.explore_async(tasks, batch_index=0, version=3)
        return got, await explorer.evaluate_async(tasks, name="x", k=2, greedy=True, seed=5)

    (exps2, metrics2), evals2 = asyncio.run(in_my_loop())
    assert [e.tokens for e in exps2] == [e.tokens for e in exps] and evals2 == evals
    assert {e.policy_version for e in exps2} == {3} and metrics2["explorer/experiences"] == len(exps)
    blocking.close()
    for e in (blocking_engine, async_engine):
        e.close()


def test_garbage_results_are_skipped_as_invalid_with_the_cause_and_metrics_stay_finite(engine, caplog):
    explorer = Explorer(engine, timeout=10.0, max_retries=0, max_skip_ratio=1.0)
    tasks = [
        task(f"g-{kind}", workflow=f"{__name__}:GarbageWorkflow", repeat=1, raw={"kind": kind})
        for kind in KINDS
    ]
    with caplog.at_level("WARNING", logger="trine.explorer"):
        experiences, metrics = explorer.explore(tasks, batch_index=0, version=0)
    explorer.close()
    assert [e.task_id for e in experiences] == ["g-good"]
    assert type(experiences[0].reward) is float and experiences[0].reward == 0.5  # numpy -> float
    assert metrics["explorer/skipped"] == len(KINDS) - 1 == metrics["explorer/skipped_invalid"]
    assert all(math.isfinite(v) for v in metrics.values())
    assert metrics["explorer/reward_mean"] == 0.5
    log = caplog.text
    for task_id, needle in [
        ("g-none", "returned None"),
        ("g-not_a_list", "'done' of type str"),
        ("g-not_experiences", "of type dict; expected a trine.Experience"),
        ("g-str_reward", "reward='1.0' of type str"),
        ("g-nan_reward", "reward=nan"),
        ("g-inf_reward", "item 1 of 2"),
        ("g-short_mask", "action_mask has"),
        ("g-short_logprobs", "logprobs has"),
        ("g-str_tokens", "tokens must be a list of Python ints"),
        ("g-long_token_rewards", "token_rewards has"),
        ("g-str_part", "info['reward_parts']['a']='high'"),
        ("g-nan_return", "info['episode_return']=nan"),
    ]:
        assert f"task {task_id} failed (invalid" in log and needle in log, (task_id, needle)


_REWARD_CALLS = {"n": 0}
_RELEASE = threading.Event()


def hang_first_six(response: str, task: Task) -> float:
    """Blocks (until the test ends) on its first 6 calls, then returns 1.0."""
    _REWARD_CALLS["n"] += 1
    if _REWARD_CALLS["n"] <= 6:
        _RELEASE.wait()
    return 1.0


def slow_reward(response: str, task: Task) -> float:
    time.sleep(1.5)
    return 1.0


def test_rewards_that_hang_in_more_threads_than_the_pool_has_do_not_starve_later_steps(engine, caplog):
    """Issue 9 item 2: with asyncio's default pool (6 threads here) every later step had 0 experiences."""
    _REWARD_CALLS["n"] = 0
    explorer = Explorer(
        engine, timeout=10.0, max_retries=0, reward_timeout=0.3, blocking_threads=4, max_skip_ratio=1.0
    )
    try:
        per_step = []
        with caplog.at_level("WARNING"):
            for step in range(3):
                tasks = [
                    task(f"h{step}-{i}", reward=f"{__name__}:hang_first_six", repeat=2) for i in range(4)
                ]
                experiences, metrics = explorer.explore(tasks, batch_index=step, version=0)
                failed = sum(e.status == "reward_error" for e in experiences)
                per_step.append((len(experiences), failed, metrics["explorer/reward_timeouts"]))
        assert per_step[0] == (8, 6, 6.0)  # the 6 hung calls cost their own answers: status reward_error
        assert per_step[1:] == [(8, 0, 0.0), (8, 0, 0.0)]  # fresh workers replaced the 6 stuck ones
        assert metrics["explorer/stuck_threads"] == 6.0 and explorer.pool.abandoned == 6
        assert "worker threads of trine-blocking are stuck" in caplog.text  # 6 >= 4 workers
    finally:
        _RELEASE.set()
        explorer.close()


def test_reward_timeouts_are_counted_and_named_apart_from_workflow_timeouts(engine, caplog):
    explorer = Explorer(engine, timeout=10.0, max_retries=0, reward_timeout=0.3, max_skip_ratio=1.0)
    start = time.monotonic()
    with caplog.at_level("WARNING"):
        experiences, metrics = explorer.explore(
            [task("slow", reward=f"{__name__}:slow_reward", repeat=2), task("ok")], batch_index=0, version=0
        )
    explorer.close()
    assert time.monotonic() - start < 1.4  # the 1.5 s reward calls were not waited for
    assert [(e.task_id, e.status) for e in experiences] == [
        ("slow", "reward_error"),
        ("slow", "reward_error"),
        ("ok", "ok"),
        ("ok", "ok"),
    ]  # a failed reward costs its own answer: kept, marked, out of the loss (trainer.train_statuses)
    assert "did not return within explorer.reward_timeout=0.3s" in experiences[0].info["reward_error"]
    assert metrics["explorer/reward_timeouts"] == 2.0 and metrics["explorer/status_reward_error"] == 2.0
    assert metrics["explorer/skipped"] == 0.0 and "explorer/skipped_timeout" not in metrics
    assert (
        f"reward '{__name__}:slow_reward' did not return within explorer.reward_timeout=0.3s" in caplog.text
    )
    assert "explorer.timeout" not in caplog.text


def test_too_many_skips_stop_with_the_reasons_and_one_bad_batch_only_warns(engine, caplog):
    explorer = Explorer(engine, timeout=0.3, max_retries=0, max_skip_ratio=0.5, warn_skip_ratio=0.2)
    good = lambda b: [task(f"ok{b}-{i}", repeat=2) for i in range(4)]  # noqa: E731
    bad = lambda b: [  # noqa: E731
        task(f"raise{b}", workflow="test_raising"),
        task(f"hang{b}", workflow="test_hanging"),
        task(f"empty{b}-0", workflow=f"{__name__}:EmptyWorkflow"),
        task(f"empty{b}-1", workflow=f"{__name__}:EmptyWorkflow"),
    ]
    # evaluation never counts, however badly it goes
    assert explorer.evaluate(bad("e"), name="x", k=1, greedy=False, seed=0) == {
        "eval/x/avg@1": 0.0,
        "eval/x/pass@1": 0.0,
    }
    with caplog.at_level("WARNING", logger="trine.explorer"):
        explorer.explore(good(0), batch_index=0, version=0)
        _, metrics = explorer.explore(bad(1), batch_index=1, version=0)  # 8 of 16 answers: not more than half
    assert metrics["explorer/skipped"] == 4.0
    assert "batch 1: 8 of 8 answers failed (4 of 4 tasks skipped: empty 2, error 1, timeout 1)" in caplog.text
    with pytest.raises(SkipRatioError) as info:
        explorer.explore(bad(2), batch_index=2, version=0)  # 16 of 24
    explorer.close()
    message = str(info.value)
    assert "16 of 24 answers of the last 3 batch(es) failed" in message
    assert "explorer.max_skip_ratio=0.5" in message
    assert "8 of 12 tasks were skipped" in message
    assert "empty: 4 (e.g. task empty2-1: the workflow returned no experiences)" in message
    assert "error: 2 (e.g. task raise2: RuntimeError: environment crashed)" in message
    assert "timeout: 2 (e.g. task hang2: the workflow timed out after explorer.timeout=0.3s)" in message


def failing_reward(response: str, task: Task) -> float:
    raise ConnectionError(f"grader unreachable for {task.task_id}")


def test_answers_whose_reward_fails_count_as_failures_and_stop_the_run(engine, caplog):
    """Issue 25 item 7: every reward call raised, every answer was ``reward_error``, and the run went on to
    finish. Failed answers count with skipped tasks against ``max_skip_ratio``; the error names them."""
    explorer = Explorer(engine, timeout=10.0, max_retries=0, max_skip_ratio=0.5, warn_skip_ratio=0.1)
    mixed = [task("fine", repeat=2), task("broken", reward=f"{__name__}:failing_reward", repeat=2)]
    with caplog.at_level("WARNING", logger="trine.explorer"):
        experiences, metrics = explorer.explore(mixed, batch_index=0, version=0)  # 2 of 4: not more than half
    assert metrics["explorer/status_reward_error"] == 2.0 and metrics["explorer/skipped"] == 0.0
    assert "batch 0: 2 of 4 answers failed (reward_error 2)" in caplog.text
    broken = [task(f"b{i}", reward=f"{__name__}:failing_reward", repeat=2) for i in range(2)]
    with pytest.raises(SkipRatioError) as info:
        explorer.explore(broken, batch_index=1, version=0)  # 6 of 8
    explorer.close()
    message = str(info.value)
    assert "6 of 8 answers of the last 2 batch(es) failed" in message
    assert (
        "answers with status reward_error: 6 (e.g. task b1: ConnectionError: grader unreachable for b1)"
        in message
    )
    assert "explorer.max_skip_ratio=0.5" in message and "fix the workflow or reward" in message


def test_linear_time_built_in_rewards_run_on_the_event_loop_and_others_in_a_worker_thread(engine):
    """``INLINE_REWARDS`` (exact_match, numeric_match) skip the hand-off to a worker thread; any other
    reward runs in one, under ``explorer.reward_timeout``."""
    import asyncio
    import threading

    from trine.rewards import INLINE_REWARDS, exact_match

    explorer = Explorer(engine)
    seen: list[str] = []

    def recording(response, task):
        seen.append(threading.current_thread().name)
        return exact_match(response, task)

    registry.register("reward", "test_recording")(recording)
    task = Task(task_id="t", question="1+1?", answer="2")

    async def both():
        inline = await explorer._score_fn("exact_match", {})("2", task)
        threaded = await explorer._score_fn("test_recording", {})("3", task)
        return inline, threaded, threading.current_thread().name

    inline, threaded, loop_thread = asyncio.run(both())
    assert exact_match in INLINE_REWARDS and inline == (1.0, {}) and threaded == (0.0, {})
    assert seen and seen[0] != loop_thread and seen[0].startswith("trine-blocking")
    explorer.close()


def test_close_cancels_what_still_runs_on_the_loop(engine, caplog):
    """A run stopped mid-batch leaves coroutines on the explorer's loop (workflows, the engine's batching
    task): close() cancels them and lets them end, so none is destroyed pending at exit."""
    explorer = Explorer(engine)
    started = asyncio.Event()
    cleaned = []

    async def left_running() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            cleaned.append(True)  # its finally ran: it ended, it was not dropped

    running = explorer.loop.create_task(left_running())
    explorer.loop.run_until_complete(started.wait())
    start = time.monotonic()
    explorer.close()
    assert running.cancelled() and cleaned == [True] and time.monotonic() - start < 5
    assert explorer.loop.is_closed() and "Task was destroyed" not in caplog.text
