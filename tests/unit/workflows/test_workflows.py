"""Workflows: the grid world, the step-wise workflow and single-turn's ReMax greedy baseline."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest

from trine import registry
from trine.models import load_model, load_tokenizer
from trine.models.engine import HFEngine
from trine.tasks import TaskSet
from trine.trainer.inputs import sample_inputs
from trine.types import Completion, SamplingParams, Task
from trine.workflows import WORKFLOWS, GridWorldWorkflow, SingleTurnWorkflow, StepWiseWorkflow
from trine.workflows.envs import BlockingEnvironment, Environment, environment_maker
from trine.workflows.envs.grid_world import (
    GridWorld,
    grid_world_tasks,
    make_layout,
    parse_action,
    reachable,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
EXAMPLE_DATA = Path(__file__).resolve().parents[3] / "examples" / "grid_world" / "data"


# ---------------------------------------------------------------------------------- grid world


def test_layouts_are_deterministic_from_the_seed():
    assert make_layout(3, 1, 0) == ["GFF", "FFF", "SHF"]  # pinned: the example data depends on it
    assert GridWorld(size=4, seed=7).layout == GridWorld(size=4, seed=7).layout
    assert len({tuple(make_layout(4, 2, seed)) for seed in range(20)}) > 15


@pytest.mark.parametrize("size", [2, 3, 4, 6])
def test_every_layout_has_start_goal_holes_and_a_path(size):
    most = size * size - (2 * size - 1)
    for holes in range(most + 1):
        for seed in range(25):
            layout = make_layout(size, holes, seed)
            text = "".join(layout)
            assert len(layout) == size and all(len(row) == size for row in layout)
            assert text.count("S") == 1 and text.count("G") == 1 and text.count("H") == holes
            assert reachable(layout), layout


def test_bad_sizes_and_layouts_are_refused():
    with pytest.raises(ValueError, match="holes=9"):
        make_layout(3, 9, 0)
    with pytest.raises(ValueError, match="size=1"):
        GridWorld(size=1)
    with pytest.raises(ValueError, match="exactly one S"):
        GridWorld(layout=["SF", "FF"])


@pytest.mark.parametrize(
    ("text", "action"),
    [
        ("up", "up"),
        ("I go DOWN", "down"),
        ("left... no, Right!", "right"),
        ("R", "right"),
        ("move u", "up"),
        ("→", "right"),
        ("first ↑ then ←", "left"),
        ("upper downtown", None),
        ("I'd rather not", None),
        ("", None),
        ("%%% 42", None),
    ],
)
def test_parse_action_takes_the_last_valid_action(text, action):
    assert parse_action(text) == action


def test_observation_marks_the_agent_and_lists_actions():
    env = GridWorld(layout=["SFF", "FHF", "FFG"])
    assert env.reset().splitlines()[:3] == ["A F F", "F H F", "F F G"]
    assert "up, down, left, right" in env.observation()
    obs, _, _, _ = env.step("right")
    assert obs.splitlines()[:3] == ["S A F", "F H F", "F F G"]


def test_invalid_actions_and_walls_do_not_move_the_agent():
    env = GridWorld(layout=["SFF", "FHF", "FFG"], max_steps=5)
    env.reset()
    _, reward, done, info = env.step("let me think")
    assert (env.position, reward, done) == ((0, 0), 0.0, False)
    assert info["invalid_action"] and info["invalid_actions"] == 1 and info["action"] is None
    _, _, _, info = env.step("up")
    assert env.position == (0, 0) and info["bumped"] and not info["invalid_action"]
    assert info["invalid_actions"] == 1 and info["steps"] == 2


def test_hole_ends_the_episode_without_reward():
    env = GridWorld(layout=["SFF", "FHF", "FFG"])
    env.reset()
    env.step("down")
    _, reward, done, info = env.step("right")
    assert (reward, done, info["fell"], info["success"]) == (0.0, True, True, False)
    with pytest.raises(RuntimeError, match="reset"):
        env.step("up")


def test_goal_gives_reward_one_and_max_steps_ends_the_episode():
    env = GridWorld(layout=["SFF", "FHF", "FFG"], max_steps=4)
    env.reset()
    results = [env.step(a) for a in ("right", "right", "down", "down")]
    assert [r[1] for r in results] == [0.0, 0.0, 0.0, 1.0]
    assert [r[2] for r in results] == [False, False, False, True] and results[-1][3]["success"]
    env.reset()
    results = [env.step("left") for _ in range(4)]
    assert [r[2] for r in results] == [False, False, False, True]
    assert results[-1][1] == 0.0 and not results[-1][3]["success"]


def test_state_hash_is_equal_for_equal_states_only():
    a, b = (
        GridWorld(layout=["SFF", "FFF", "FFG"], max_steps=9),
        GridWorld(layout=["SFF", "FFF", "FFG"], max_steps=9),
    )
    a.reset(), b.reset()
    start = a.state_hash()
    assert start == b.state_hash()
    a.step("right"), a.step("down")  # different routes to the same cell
    b.step("down"), b.step("nonsense"), b.step("right")
    assert a.position == b.position == (1, 1) and a.state_hash() == b.state_hash() != start
    a.step("left"), a.step("up")
    assert a.position == (0, 0) and a.state_hash() == start  # back at the start: the same anchor state
    other = GridWorld(layout=["SFF", "FHF", "FFG"])
    other.reset()
    assert other.state_hash() != start  # same position, different layout
    assert GridWorld(size=4, seed=5).state_hash() == GridWorld(size=4, seed=5).state_hash()


def test_grid_world_tasks_make_a_taskset_and_the_example_data_loads():
    rows = grid_world_tasks(5, size=3, seed=10, max_steps=4)
    assert [r["seed"] for r in rows] == [10, 11, 12, 13, 14] and all(r["question"] for r in rows)
    tasks = TaskSet.from_rows(rows, workflow="grid_world", answer_key=None, repeat=2)
    assert len(tasks) == 5 and tasks[0].raw["size"] == 3 and tasks[0].workflow == "grid_world"
    assert registry.resolve("workflow", "grid_world") is GridWorldWorkflow
    assert WORKFLOWS["step_wise"] is StepWiseWorkflow
    train = [json.loads(line) for line in (EXAMPLE_DATA / "train.jsonl").read_text().splitlines()]
    evals = [json.loads(line) for line in (EXAMPLE_DATA / "eval.jsonl").read_text().splitlines()]
    assert (len(train), len(evals)) == (32, 16)
    layouts = lambda rows: {tuple(make_layout(r["size"], r["holes"], r["seed"])) for r in rows}  # noqa: E731
    assert not layouts(train) & layouts(evals)
    assert len(TaskSet(EXAMPLE_DATA / "eval.jsonl", workflow="grid_world", answer_key=None)) == 16


# ---------------------------------------------------------------------------------- step-wise workflow


class ScriptedModel:
    """A rollout model whose reply is ``policy(observation)`` (tokenized with a real tokenizer)."""

    def __init__(self, tokenizer, policy) -> None:
        self.tokenizer = tokenizer
        self.policy = policy
        self.prompts: list[list[dict[str, str]]] = []

    async def chat(self, messages, params) -> list[Completion]:
        self.prompts.append(messages)
        await asyncio.sleep(0)  # let concurrent episodes interleave
        text = self.policy(messages[-1]["content"])
        prompt = self.tokenizer(messages[-1]["content"])["input_ids"]
        response = self.tokenizer(text)["input_ids"]
        return [Completion(prompt, response, [-0.5] * len(response), text, "stop")]

    async def generate(self, prompt_ids, params) -> list[Completion]:
        raise NotImplementedError


def grid_task(repeat: int, **raw) -> Task:
    return Task(
        task_id="grid/0",
        question="grid",
        raw={"question": "grid", **raw},
        workflow="grid_world",
        repeat=repeat,
        sampling=SamplingParams(temperature=1.0, max_tokens=6),
    )


def test_step_wise_workflow_on_the_tiny_model_emits_consistent_steps(engine):
    task = grid_task(3, size=3, seed=4, holes=1, max_steps=3)
    exps = asyncio.run(GridWorldWorkflow(reward=None).run(task, engine))
    runs: dict[str, list] = {}
    for e in exps:
        e.check()
        assert e.logprobs is not None and len(e.logprobs) == e.response_length > 0
        assert e.action_mask == [1] * e.response_length and e.reward == e.info["step_reward"]
        assert "A" in engine.tokenizer.decode(e.tokens[: e.prompt_length])
        runs.setdefault(e.run_id, []).append(e)
    assert len(runs) == 3
    for steps in runs.values():
        assert [e.step for e in steps] == list(range(len(steps))) and 1 <= len(steps) <= 3
        total = sum(e.reward for e in steps)
        assert all(e.info["episode_return"] == total for e in steps)
        assert [e.info["last_step"] for e in steps] == [False] * (len(steps) - 1) + [True]
        replay = GridWorld(size=3, seed=4, holes=1, max_steps=3)  # the hashes follow the real states
        replay.reset()
        for e in steps:
            assert e.info["env_state_hash"] == replay.state_hash()
            _, reward, _, _ = replay.step(e.info["response"])
            assert reward == e.reward
    first = {steps[0].info["env_state_hash"] for steps in runs.values()}
    assert len(first) == 1  # every rollout starts from the same anchor state


def test_grid_world_sampling_is_reproducible_for_a_seed(tiny_model_dir):
    """The grid world is ``blocking = False``: its steps run inline, so the engine's batches (and the
    random numbers each row draws) do not depend on when worker threads finish."""
    tasks = [grid_task(8, size=3, seed=s, holes=1, max_steps=6) for s in range(4)]

    def sample() -> list[list[int]]:
        engine = HFEngine(
            load_model(tiny_model_dir, dtype="float32", device="cpu"), load_tokenizer(tiny_model_dir), seed=3
        )
        workflow = GridWorldWorkflow(reward=None)

        async def run_all():
            return await asyncio.gather(*(workflow.run(t, engine) for t in tasks))

        try:
            return [e.tokens for exps in asyncio.run(run_all()) for e in exps]
        finally:
            engine.close()

    assert GridWorld.blocking is False
    assert sample() == sample()


def test_step_wise_rewards_success_and_gigpo_inputs(engine):
    task = grid_task(2, layout=["SF", "FG"], max_steps=5)
    policy = {"A F": "let me go right", "S A": "now D"}  # keyed by the first grid row
    model = ScriptedModel(engine.tokenizer, lambda obs: policy[obs.splitlines()[0]])
    exps = asyncio.run(StepWiseWorkflow(reward=None, system_prompt="Play.").run(task, model))
    assert all(m[0] == {"role": "system", "content": "Play."} for m in model.prompts)
    assert all(len(m) == 2 for m in model.prompts)  # only the current observation, no history
    by_run: dict[str, list] = {}
    for e in exps:
        e.group_id = "g"  # what the explorer does
        by_run.setdefault(e.run_id, []).append(e)
    assert len(by_run) == 2
    for steps in by_run.values():
        assert [e.reward for e in steps] == [0.0, 1.0] and [e.step for e in steps] == [0, 1]
        assert all(e.info["success"] and e.info["episode_return"] == 1.0 for e in steps)
        assert [e.info["env_info"]["action"] for e in steps] == ["right", "down"]
    inputs = sample_inputs(exps, ("run_ids", "step_ids", "state_ids"))
    assert inputs["run_ids"].unique().numel() == 2
    runs = list(by_run.values())
    assert [e.info["env_state_hash"] for e in runs[0]] == [e.info["env_state_hash"] for e in runs[1]]
    assert inputs["state_ids"].unique().numel() == 2  # two anchor states, each seen by both runs


def test_step_wise_hole_ends_with_zero_and_row_overrides_env_args(engine):
    model = ScriptedModel(engine.tokenizer, lambda obs: "down")
    workflow = StepWiseWorkflow(reward=None, env="grid_world", env_args={"layout": ["SF", "FG"]})
    exps = asyncio.run(workflow.run(grid_task(1, layout=["SF", "HG"], max_steps=4), model))
    assert [e.reward for e in exps] == [0.0] and exps[0].info["env_info"]["fell"]
    assert exps[0].info["success"] is False and exps[0].info["episode_return"] == 0.0
    with pytest.raises(ValueError, match="unknown environment 'frozen_pond'"):
        StepWiseWorkflow(env="frozen_pond")
    with pytest.raises(ValueError, match="always uses GridWorld"):
        GridWorldWorkflow(env="grid_world")


def test_step_wise_respects_max_steps_without_progress(engine):
    model = ScriptedModel(engine.tokenizer, lambda obs: "hmm")
    exps = asyncio.run(GridWorldWorkflow(reward=None).run(grid_task(1, size=3, seed=1, max_steps=4), model))
    assert len(exps) == 4 and all(e.info["env_info"]["invalid_action"] for e in exps)
    assert exps[-1].info["env_info"]["invalid_actions"] == 4 and not exps[-1].info["success"]


class SlowEnv:
    """A 2x2 grid world whose ``step`` blocks for ``delay`` seconds, like a slow simulator."""

    def __init__(self, delay: float = 3.0) -> None:
        self.env = GridWorld(layout=["SF", "FG"])
        self.delay = delay

    def reset(self) -> str:
        return self.env.reset()

    def state_hash(self) -> str:
        return self.env.state_hash()

    def step(self, text: str):
        time.sleep(self.delay)
        return self.env.step(text)


def test_a_blocking_environment_step_is_bounded_by_the_task_timeout(engine):
    """Issue 9 item 15: a 3 s ``env.step`` used to block the event loop past a 0.5 s task timeout."""
    from trine.explorer import Explorer

    explorer = Explorer(engine, timeout=0.5, max_retries=0, max_skip_ratio=1.0)
    slow = grid_task(1)
    slow.task_id, slow.workflow, slow.workflow_args = "slow", "step_wise", {"env": f"{__name__}:SlowEnv"}
    fine = Task(task_id="fine", question="hi", repeat=2, sampling=SamplingParams(max_tokens=4))
    start = time.monotonic()
    experiences, metrics = explorer.explore([slow, fine], batch_index=0, version=0)
    elapsed = time.monotonic() - start
    explorer.close()
    assert elapsed < 2.0  # not the 3 s of the step
    assert metrics["explorer/skipped_timeout"] == 1.0 and metrics["explorer/stuck_threads"] == 1.0
    assert [e.task_id for e in experiences] == ["fine", "fine"]  # the loop kept serving other tasks


# ------------------------------------------------------------------------- the environment protocol


class Countdown:
    """A natively async environment: count down by ``stride`` from the row's ``start`` to 0."""

    def __init__(self, stride: int = 1) -> None:
        self.stride, self.value = stride, 0

    async def reset(self, task: Task) -> str:
        self.value = int(task.raw["start"])
        return f"at {self.value}"

    async def step(self, action: str) -> tuple[str, float, bool, dict]:
        self.value -= self.stride if "go" in action else 0
        done = self.value <= 0
        return f"at {self.value}", float(done), done, {"success": done}

    def state_hash(self) -> str:
        return str(self.value)


def test_an_async_environment_registered_by_name_gets_the_task_in_reset(engine, monkeypatch):
    monkeypatch.setattr(registry, "_extra", {k: dict(v) for k, v in registry._extra.items()})
    registry.register("environment", "countdown")(Countdown)
    assert isinstance(Countdown(), Environment)
    model = ScriptedModel(engine.tokenizer, lambda obs: "go")
    workflow = StepWiseWorkflow(env="countdown", env_args={"stride": 2})
    exps = asyncio.run(workflow.run(grid_task(2, start=3), model))
    assert [e.reward for e in exps] == [0.0, 1.0, 0.0, 1.0]
    assert [e.info["env_state_hash"] for e in exps] == ["3", "1", "3", "1"]  # the states acted from
    assert [m[-1]["content"] for m in model.prompts[:2]] == ["at 3", "at 3"]
    assert all(e.info["success"] and e.info["episode_length"] == 2 for e in exps)


class ThreadLog:
    """A blocking environment that records the thread each of its calls runs in."""

    calls: list[tuple[str, str]] = []

    def __init__(self, size: int = 2, label: str = "env") -> None:
        self.env, self.label = GridWorld(size=size, holes=0, max_steps=1), label
        self.log("init")

    def log(self, call: str) -> None:
        ThreadLog.calls.append((call, threading.current_thread().name))

    def reset(self) -> str:
        self.log("reset")
        return self.env.reset()

    def step(self, action: str):
        self.log("step")
        return self.env.step(action)

    def state_hash(self) -> str:
        self.log("hash")
        return f"{self.label}:{self.env.state_hash()}"


class InlineThreadLog(ThreadLog):
    blocking = False


@pytest.mark.parametrize("env_class", [ThreadLog, InlineThreadLog])
def test_the_adapter_runs_a_blocking_environment_in_worker_threads_unless_it_says_otherwise(env_class):
    ThreadLog.calls = []
    env = environment_maker(env_class, {"size": 5, "label": "x"})()
    assert isinstance(env, BlockingEnvironment) and isinstance(env, Environment)

    async def episode():
        observation = await env.reset(grid_task(1, size=3, holes=1))  # the row's size overrides env_args
        first = env.state_hash()
        return observation, first, await env.step("right")

    observation, first, (_, _, done, _) = asyncio.run(episode())
    assert env.env is not None and env.env.env.size == 3 and first.startswith("x:") and done
    assert [call for call, _ in ThreadLog.calls] == ["init", "reset", "hash", "step"]  # no hash once done
    threads = {name for _, name in ThreadLog.calls}
    if env_class is InlineThreadLog:
        assert threads == {threading.current_thread().name}
    else:
        assert threading.current_thread().name not in threads
        assert all(name.startswith("trine-blocking") for name in threads)
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.state_hash()


def test_validate_checks_a_step_wise_environment_name(tmp_path):
    from trine.config import validate_dict

    (tmp_path / "data.jsonl").write_text('{"question": "grid", "answer": "-"}\n')
    (tmp_path / "model").mkdir()
    train = {"path": "data.jsonl", "workflow": "step_wise", "workflow_args": {"env": "grid_wrld"}}
    data = {"model": {"path": "model"}, "tasks": {"train": train, "total_steps": 1}}
    (error,) = validate_dict(data, base_dir=tmp_path)[1]
    assert "train.workflow_args['env']: unknown environment 'grid_wrld'. Did you mean 'grid_world'?" in error
    assert "@trine.register('environment', 'grid_wrld')" in error
    for env in ("grid_world", f"{__name__}:SlowEnv"):
        train["workflow_args"] = {"env": env}
        assert validate_dict(data, base_dir=tmp_path)[1] == []


# ---------------------------------------------------------------------------------- ReMax baseline


async def exact_match(text: str, task: Task) -> tuple[float, dict[str, float]]:
    return float(text.strip() == str(task.answer).strip()), {}


def test_greedy_baseline_stores_the_greedy_completions_reward(engine):
    task = Task(
        task_id="t/0",
        question="What is 2+3?",
        repeat=4,
        sampling=SamplingParams(temperature=1.0, max_tokens=6),
    )
    greedy = engine.generate_batch(
        [(engine.encode_chat(task.messages()), task.sampling.replace(temperature=0.0))]
    )
    task.answer = greedy[0][0].text  # the greedy reply is "correct", so the baseline reward must be 1
    exps = asyncio.run(SingleTurnWorkflow(exact_match, greedy_baseline=True).run(task, engine))
    assert len(exps) == 4
    for e in exps:
        e.check()
        assert e.info["baseline_reward"] == 1.0 and e.info["baseline_response"] == greedy[0][0].text
        assert e.reward == float(e.info["response"].strip() == task.answer.strip())
    assert sample_inputs(exps, ("baseline_rewards",))["baseline_rewards"].tolist() == [1.0] * 4
    plain = asyncio.run(SingleTurnWorkflow(exact_match).run(task, engine))
    assert len(plain) == 4 and all("baseline_reward" not in e.info for e in plain)
