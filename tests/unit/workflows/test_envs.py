"""Environments on the Gymnasium-style API, the environment pool, and environment faults (issue 12).

The environments here are real classes played for real (no mocked calls); the "model" is a scripted
policy returning real :class:`Completion` objects, since what is under test is the environment side.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.helpers import FaultyEnv, ScriptedModel, arm_faulty_env, env_task
from trine.explorer import Explorer
from trine.workflows import GridWorldWorkflow, StepWiseWorkflow
from trine.workflows.envs import (
    EnvFailure,
    EnvPool,
    GridWorld,
    GridWorldEnv,
    environment_maker,
    episode_seed,
    make_env_pool,
)


class HigherLower:
    """A Gymnasium-style text game: find a secret in [0, 99] drawn from the reset seed."""

    built = 0
    closed = 0

    def __init__(self, limit: int = 8) -> None:
        type(self).built += 1
        self.limit, self.secret, self.turns = limit, 0, 0

    def reset(self, *, seed=None, options=None):
        self.secret = seed % 100 if seed is not None else 50
        self.turns = 0
        return "Guess a number from 0 to 99.", {"options": options}

    def step(self, action: str):
        self.turns += 1
        digits = "".join(ch for ch in action if ch.isdigit())
        guess = int(digits) if digits else -1
        won = guess == self.secret
        hint = "correct" if won else ("higher" if guess < self.secret else "lower")
        info = {"success": won, "secret": self.secret}
        return f"{guess}: {hint}", float(won), won, self.turns >= self.limit and not won, info

    def close(self) -> None:
        type(self).closed += 1


def bisect_policy():
    """A binary search on HigherLower's hints (kept per observation history by the test)."""
    bounds = {"lo": 0, "hi": 99}

    def policy(observation: str) -> str:
        if observation.endswith("higher"):
            bounds["lo"] = int(observation.split(":")[0]) + 1
        elif observation.endswith("lower"):
            bounds["hi"] = int(observation.split(":")[0]) - 1
        return str((bounds["lo"] + bounds["hi"]) // 2)

    return policy


def test_a_gymnasium_style_class_plugs_in_by_import_path_and_is_seeded_by_the_task():
    model = ScriptedModel(bisect_policy())
    workflow = StepWiseWorkflow(env=f"{__name__}:HigherLower", env_args={"limit": 10}, option_keys=["level"])
    exps = asyncio.run(workflow.run(env_task(seed=42, level=3), model))
    assert model.observations[0] == "Guess a number from 0 to 99."
    assert [e.info["response"] for e in exps] == ["49", "24", "36", "42"]  # the secret is the row's seed
    assert [e.reward for e in exps] == [0.0, 0.0, 0.0, 1.0] and exps[-1].info["last_step"]
    assert all(e.status == "ok" and e.info["success"] and e.info["episode_return"] == 1.0 for e in exps)
    assert exps[-1].info["env_info"] == {
        "success": True,
        "secret": 42,
        "terminated": True,
        "truncated": False,
    }
    hashes = [e.info["env_state_hash"] for e in exps]  # no state_hash(): the observation text's hash
    assert len(set(hashes)) == 4 and all(len(h) == 16 for h in hashes)


def test_episode_seeds_come_from_the_row_or_the_task_id_and_are_stable():
    assert episode_seed(env_task(seed=7)) == 7 == episode_seed(env_task(seed=7), rollout=3)
    a, b = episode_seed(env_task("set/1")), episode_seed(env_task("set/2"))
    assert a != b and a == episode_seed(env_task("set/1")) == 914184342  # the same in any process
    per = {episode_seed(env_task(seed=7), rollout=i, per_rollout=True) for i in range(4)}
    assert len(per) == 4 and 7 not in per

    def secrets(**workflow_args) -> list[int]:
        model = ScriptedModel(lambda observation: "0")
        workflow = StepWiseWorkflow(env=HigherLower, env_args={"limit": 1}, **workflow_args)
        exps = asyncio.run(workflow.run(env_task("set/1", repeat=4), model))
        return [int(e.info["env_info"]["secret"]) for e in exps]

    assert secrets() == [914184342 % 100] * 4  # no row seed: the task id's, shared by the group
    assert len(set(secrets(seed_per_rollout=True))) > 1


def test_the_grid_world_on_the_gym_api_matches_the_classic_game_step_for_step():
    env = GridWorldEnv(view="compact")
    rng = __import__("random").Random(0)
    for seed in range(12):
        observation, info = env.reset(seed=seed, options={"size": 3, "holes": 1, "max_steps": 6})
        game = GridWorld(size=3, holes=1, seed=seed, max_steps=6, view="compact")
        assert observation == game.reset() and info["layout"] == game.layout
        assert env.state_hash() == game.state_hash()
        done = False
        while not done:
            action = rng.choice(["up", "down", "left", "right", "??"])
            obs, reward, terminated, truncated, info = env.step(action)
            expected = game.step(action)
            done = terminated or truncated
            assert (obs, reward, done, info) == expected
            assert terminated == (info["success"] or info["fell"]) and not (terminated and truncated)
            assert env.state_hash() == game.state_hash()
    with pytest.raises(ValueError, match="not grid-world options"):
        env.reset(seed=0, options={"colour": "blue"})


def test_the_grid_world_workflow_reuses_pooled_environments_with_identical_rollouts():
    rows = [{"size": 3, "seed": s, "holes": 1, "max_steps": 5} for s in range(3)]
    moves = ["right", "down", "left", "up", "?"]

    def policy(observation: str) -> str:  # a function of the state only
        return moves[sum(map(ord, observation)) % len(moves)]

    def play(pool_size: int):
        workflow = GridWorldWorkflow(pool_size=pool_size)
        model = ScriptedModel(policy)
        exps = [
            e
            for i, row in enumerate(rows)
            for e in asyncio.run(workflow.run(env_task(f"g/{i}", 2, **row), model))
        ]
        return workflow, [(e.info["env_state_hash"], e.reward, e.info["response"]) for e in exps]

    fresh, fresh_steps = play(0)
    pooled, pooled_steps = play(1)
    assert fresh_steps == pooled_steps and len(fresh_steps) > 6
    assert fresh.envs.built == 6 and pooled.envs.built == 1 and pooled.envs.reused == 5


def test_a_non_text_observation_needs_text_of_and_actions_may_be_mapped():
    class Counter:
        """Observations are ints; actions are ints."""

        def reset(self, *, seed=None, options=None):
            self.value = 0
            return self.value, {}

        def step(self, action: int):
            self.value += action
            return self.value, float(self.value >= 3), self.value >= 3, False, {}

    model = ScriptedModel(lambda observation: "plus two")
    with pytest.raises(EnvFailure, match=r"reset\(\) returned an observation of type int .*text_of="):
        asyncio.run(StepWiseWorkflow(env=Counter).run(env_task(), model))
    workflow = StepWiseWorkflow(
        env=Counter, text_of=lambda obs, info: f"at {obs}", action_of=lambda text: 2 if "two" in text else 1
    )
    exps = asyncio.run(workflow.run(env_task(), model))
    assert model.observations[-2:] == ["at 0", "at 2"] and [e.reward for e in exps] == [0.0, 1.0]
    with pytest.raises(ValueError, match="text_of='nowhere:render' could not be imported"):
        StepWiseWorkflow(env=Counter, text_of="nowhere:render")


# ------------------------------------------------------------------------------------------- the pool


def test_n_episodes_with_pool_size_k_build_at_most_k_environments():
    HigherLower.built = HigherLower.closed = 0
    workflow = StepWiseWorkflow(env=HigherLower, env_args={"limit": 3}, pool_size=2)
    model = ScriptedModel(lambda observation: "50")

    async def many():
        return await asyncio.gather(*(workflow.run(env_task(f"t/{i}", 3, seed=i), model) for i in range(4)))

    results = asyncio.run(many())
    assert sum(len(r) for r in results) == 12 * 3  # 12 episodes of 3 steps (50 is no secret here)
    assert HigherLower.built == 2 and workflow.envs.built == 2 and workflow.envs.reused == 10
    assert workflow.envs.idle == 2 and HigherLower.closed == 0
    workflow.close()  # the explorer's close: the pooled environments are closed
    assert HigherLower.closed == 2 and workflow.envs.idle == 0

    HigherLower.built = HigherLower.closed = 0
    unpooled = StepWiseWorkflow(env=HigherLower, env_args={"limit": 3})
    asyncio.run(unpooled.run(env_task(repeat=3, seed=1), model))
    assert HigherLower.built == 3 and HigherLower.closed == 3  # one per episode, closed after it


def test_a_full_pool_makes_episodes_wait_and_a_cancelled_wait_frees_its_turn():
    pool = EnvPool(environment_maker(GridWorldEnv), size=1)
    order: list[str] = []

    async def hold(name: str, seconds: float) -> None:
        async with pool.lease() as env:
            order.append(f"{name}+")
            await env.reset(env_task(seed=1))
            await asyncio.sleep(seconds)
            order.append(f"{name}-")

    async def scenario():
        first = asyncio.ensure_future(hold("a", 0.05))
        await asyncio.sleep(0)
        cancelled = asyncio.ensure_future(hold("b", 0))
        third = asyncio.ensure_future(hold("c", 0))
        await asyncio.sleep(0.01)
        cancelled.cancel()
        await asyncio.gather(first, third, return_exceptions=True)

    asyncio.run(scenario())
    assert order == ["a+", "a-", "c+", "c-"] and pool.built == 1 and pool.reused == 1
    with pytest.raises(ValueError, match="pool_size=-1"):
        EnvPool(environment_maker(GridWorldEnv), size=-1)
    with pytest.raises(ValueError, match="env_timeout=0"):
        make_env_pool("grid_world", timeout=0)


# ------------------------------------------------------------------------------------------- faults
# (FaultyEnv raises or hangs where arm_faulty_env says: tests/helpers.py)


def test_a_step_that_raises_ends_the_episode_with_its_steps_and_the_env_is_not_reused():
    arm_faulty_env(call="step", at=2)
    workflow = StepWiseWorkflow(env=FaultyEnv, pool_size=1)
    model = ScriptedModel(lambda observation: "act")

    async def two_tasks():
        broken = await workflow.run(env_task(), model)
        healthy = await workflow.run(env_task(), model)
        await workflow.aclose()
        return broken, healthy

    broken, healthy = asyncio.run(two_tasks())
    assert [e.reward for e in broken] == [0.5, 0.5] and broken[-1].info["last_step"]
    assert {e.status for e in broken} == {"env_error"}
    assert "step raised ConnectionError: simulator lost during step" in broken[0].info["status_reason"]
    assert len(healthy) == 4 and {e.status for e in healthy} == {"ok"}
    assert FaultyEnv.built == 2  # the faulty env was discarded and a new one built
    assert workflow.envs.discarded == 1 and workflow.envs.built == 2 and workflow.envs.reused == 0
    assert FaultyEnv.closed == 2  # the faulty one when discarded, the healthy one by aclose()


def test_a_hanging_step_times_out_with_status_timeout_without_stalling_the_episode():
    arm_faulty_env(call="step", at=1, mode="hang", seconds=3.0)
    workflow = StepWiseWorkflow(env=FaultyEnv, pool_size=2, env_timeout=0.3)
    start = time.monotonic()
    exps = asyncio.run(workflow.run(env_task(), ScriptedModel(lambda observation: "act")))
    assert time.monotonic() - start < 2.0
    assert len(exps) == 1 and exps[0].status == "timeout" and exps[0].reward == 0.5
    assert "did not return within 0.3s" in exps[0].info["status_reason"]
    assert workflow.envs.discarded == 1 and workflow.envs.idle == 0


def test_a_timeout_error_raised_by_the_env_itself_is_an_env_error_not_the_bound():
    arm_faulty_env(call="step", at=1, mode="own_timeout")
    exps = asyncio.run(
        StepWiseWorkflow(env=FaultyEnv).run(env_task(), ScriptedModel(lambda observation: "act"))
    )
    assert len(exps) == 1 and exps[0].status == "env_error"
    assert "step raised TimeoutError: the simulator's own clock ran out" in exps[0].info["status_reason"]


@pytest.mark.parametrize(("call", "at"), [("reset", 0), ("step", 0)])
def test_a_failure_before_any_step_raises_so_the_explorer_counts_it(call, at):
    arm_faulty_env(call=call, at=at)
    workflow = StepWiseWorkflow(env=FaultyEnv)

    async def failing():
        try:
            await workflow.run(env_task(repeat=3), ScriptedModel(lambda observation: "act"))
        finally:
            await workflow.aclose()

    with pytest.raises(EnvFailure, match=f"{call} raised ConnectionError") as info:
        asyncio.run(failing())
    assert info.value.status == "env_error" and info.value.call == call
    assert FaultyEnv.built == FaultyEnv.closed  # the failed env and the other episodes' envs were closed

    arm_faulty_env(call=call, at=at)  # in the explorer: the first attempt fails, the retry succeeds
    explorer = Explorer(ScriptedModel(lambda observation: "act"), timeout=5.0, max_retries=1)
    task = env_task(repeat=2)
    task.workflow_args = {"env": "tests.helpers:FaultyEnv"}
    try:
        exps, metrics = explorer.explore([task], batch_index=0, version=0)
    finally:
        explorer.close()
    assert metrics["explorer/retries"] == 1.0 and len(exps) == 8
    assert {e.status for e in exps} == {"ok"}


def test_a_hanging_reset_is_bounded_and_raises_a_timeout_failure():
    arm_faulty_env(call="reset", at=0, mode="hang", seconds=2.0)
    workflow = StepWiseWorkflow(env=FaultyEnv, env_timeout=0.2)
    start = time.monotonic()
    with pytest.raises(EnvFailure, match="reset did not return within 0.2s") as info:
        asyncio.run(workflow.run(env_task(), ScriptedModel(lambda observation: "act")))
    assert info.value.status == "timeout" and time.monotonic() - start < 1.5
    assert not isinstance(info.value, TimeoutError)  # never taken for the explorer's own timeout


def test_an_episode_cancelled_by_the_explorer_timeout_discards_its_pooled_env():
    arm_faulty_env(call="step", at=0, mode="hang", seconds=2.0)  # no env_timeout: the task timeout bounds it
    explorer = Explorer(
        ScriptedModel(lambda observation: "act"), timeout=0.3, max_retries=0, max_skip_ratio=1.0
    )
    task = env_task()
    task.workflow_args = {"env": "tests.helpers:FaultyEnv", "pool_size": 1, "env_timeout": None}
    try:
        _, first = explorer.explore([task], batch_index=0, version=0)
        exps, second = explorer.explore([task], batch_index=1, version=0)
        (workflow,) = explorer._workflows.values()
    finally:
        explorer.close()
    assert first["explorer/skipped_timeout"] == 1.0 and second["explorer/skipped"] == 0.0
    assert len(exps) == 4 and workflow.envs.discarded == 1 and workflow.envs.built == 2
