"""Delayed rewards in every built-in workflow (``defer_reward``), and the environment defaults that bit
users (issue 26): a registered environment name in ``environment_maker``, textarena's ``history`` under
``multi_turn``."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.helpers import ScriptedModel, env_task
from tests.unit.workflows.test_multi_turn import Conversational, binary_search
from tests.unit.workflows.test_tool_agent import CALL, Scripted, _task, exact
from trine.buffer.memory import MemoryBuffer
from trine.workflows import MultiTurnWorkflow, StepWiseWorkflow, ToolAgentWorkflow
from trine.workflows.envs import GridWorldEnv, TextArenaEnv, environment_maker
from trine.workflows.envs.base import BlockingEnvironment
from trine.workflows.multi_turn import conversation_env_args

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MULTIPLY = "tests.unit.workflows.test_tool_agent:multiply"


def _run(workflow, model, task):
    async def go():
        try:
            return await workflow.run(task, model)
        finally:
            await workflow.aclose()

    return asyncio.run(go())


# ------------------------------------------------------------------------------ environment_maker
def test_environment_maker_takes_a_registered_name_as_docs_workflows_says():
    new_env = environment_maker("grid_world", {"size": 4})
    env = new_env()
    assert isinstance(env, BlockingEnvironment)
    assert env.factory is GridWorldEnv
    observation = asyncio.run(env.reset(env_task("g/0", seed=1)))
    assert "grid" in observation.lower() or observation


def test_environment_maker_takes_textarena_by_name():
    pytest.importorskip("textarena", reason="textarena is not installed (pip install 'trine[envs]')")
    env = environment_maker("textarena", {"game": "GuessTheNumber-v0"})()
    assert asyncio.run(env.reset(env_task("ta/0", seed=3))).startswith("[GAME]")


def test_environment_maker_names_what_it_expected_for_a_wrong_value():
    with pytest.raises(ValueError, match="env=42; expected an environment name"):
        environment_maker(42)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ textarena history
def test_multi_turn_sets_history_false_for_environments_that_take_it():
    assert conversation_env_args(TextArenaEnv, {"game": "x"}) == {"game": "x", "history": False}
    assert conversation_env_args("grid_world", {"size": 4}) == {"size": 4}  # no history parameter


def test_multi_turn_keeps_an_explicit_history_true_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="trine.workflows.multi_turn"):
        assert conversation_env_args(TextArenaEnv, {"history": True}) == {"history": True}
    assert "quadratic" in caplog.text


def test_textarena_under_multi_turn_sends_only_the_new_observation(tokenizer):
    """No ``history`` in env_args: each game message enters the conversation once."""
    pytest.importorskip("textarena", reason="textarena is not installed (pip install 'trine[envs]')")
    wf = MultiTurnWorkflow(env="textarena", env_args={"game": "GuessTheNumber-v0"}, max_steps=8)
    (e,) = _run(wf, Conversational(tokenizer, binary_search), env_task("guess/3", 1, seed=3))
    assert e.info["success"] and e.info["turns"] >= 2
    text = tokenizer.decode(e.tokens)
    assert text.count("You are playing Guess The Number") == 1  # the rules: once, not every turn


# ------------------------------------------------------------------------------ defer_reward
def _pending_ok(exps, answer):
    assert exps and all(e.reward is None for e in exps)
    for e in exps:
        e.check()
        assert e.info["answer"] == answer and e.info["task_id"]
        assert e.info.get("episode_return") is None and e.info.get("success") is None


def test_step_wise_leaves_every_step_pending_and_keeps_the_env_return():
    wf = StepWiseWorkflow(env="grid_world", env_args={"size": 3}, max_steps=4, defer_reward=True)
    exps = _run(wf, ScriptedModel(lambda obs: "right"), env_task("g/0", 2, seed=5, size=3))
    _pending_ok(exps, None)
    assert all(isinstance(e.info["env_return"], float) for e in exps)
    assert {e.run_id for e in exps} and all(e.step is not None for e in exps)


def test_multi_turn_leaves_the_conversation_pending(tokenizer):
    pytest.importorskip("textarena", reason="textarena is not installed (pip install 'trine[envs]')")
    for output in ("trajectory", "turns"):
        wf = MultiTurnWorkflow(
            env="textarena",
            env_args={"game": "GuessTheNumber-v0"},
            max_steps=8,
            output=output,
            defer_reward=True,
        )
        exps = _run(wf, Conversational(tokenizer, binary_search), env_task("guess/3", 2, seed=3))
        _pending_ok(exps, None)
        assert all(e.info["env_return"] == 1.0 for e in exps)  # the env's own verdict, for a grader
        assert all(e.info["step_reward"] is None for e in exps if output == "turns")


def test_tool_agent_does_not_call_the_reward_and_leaves_the_answer_pending(tokenizer):
    calls = []

    async def reward(answer, task):
        calls.append(answer)
        return await exact(answer, task)

    wf = ToolAgentWorkflow(reward, tools=[MULTIPLY], defer_reward=True)
    exps = _run(wf, Scripted(tokenizer, CALL), _task())
    _pending_ok(exps, 408)
    assert calls == [] and all(e.info["response"] == "The answer is 408" for e in exps)
    assert exps[-1].info["counters"] == {"tools/calls": 1.0}  # tool counters are kept


def test_pending_episode_steps_train_once_a_grader_fills_them_by_rollout():
    """A rollout's steps wait in the buffer; ``(task_id, run_id)`` fills all of them at once."""
    wf = StepWiseWorkflow(env="grid_world", env_args={"size": 3}, max_steps=3, defer_reward=True)
    exps = _run(wf, ScriptedModel(lambda obs: "down"), env_task("g/1", 1, seed=2, size=3))
    for e in exps:
        e.group_id = "g"
    buffer = MemoryBuffer()
    buffer.put(exps)
    assert buffer.metrics()["buffer/pending"] == len(exps)
    assert buffer.set_rewards({("g/1", exps[0].run_id): 0.5}) == len(exps)
    got = buffer.get(len(exps), timeout=1)
    assert sorted(e.reward for e in got) == [0.5] * len(exps)


# ------------------------------------------------------------------------------ invalid actions
def test_textarena_marks_each_invalid_move_and_multi_turn_counts_them(tokenizer):
    pytest.importorskip("textarena", reason="textarena is not installed (pip install 'trine[envs]')")
    env = TextArenaEnv("GuessTheNumber-v0", history=False)
    env.reset(seed=1)
    assert env.step("[5]")[4]["invalid_action"] is False
    assert env.step("no idea")[4]["invalid_action"] is True  # warned, the game goes on
    *_, done, _, info = env.step("still none")
    assert done and info["invalid_action"] is True  # the second one ends it

    def sloppy(conversation: str) -> str:  # one invalid move, then bisection
        return "no idea" if conversation.count("<|im_start|>assistant") == 1 else binary_search(conversation)

    wf = MultiTurnWorkflow(env="textarena", env_args={"game": "GuessTheNumber-v0"}, max_steps=8)
    (e,) = _run(wf, Conversational(tokenizer, sloppy), env_task("guess/3", 1, seed=3))
    assert e.info["invalid_actions"] == 1
