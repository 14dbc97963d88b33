"""The multi_turn workflow: a conversation with an environment, token-in token-out, faults as statuses."""

from __future__ import annotations

import asyncio
import re

import pytest

from tests.helpers import FaultyEnv, arm_faulty_env, env_task
from trine.models import load_model
from trine.models.engine import HFEngine
from trine.types import Completion, SamplingParams
from trine.workflows import WORKFLOWS, MultiTurnWorkflow

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Conversational:
    """A scripted rollout model over a real tokenizer: its reply is ``policy(conversation text)``."""

    def __init__(self, tokenizer, policy, delay: float = 0.0) -> None:
        self.tokenizer, self.policy, self.delay, self.policy_version = tokenizer, policy, delay, 0

    async def generate(self, prompt_ids, params: SamplingParams) -> list[Completion]:
        await asyncio.sleep(self.delay)
        reply = self.policy(self.tokenizer.decode(prompt_ids))
        ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
        ids = (ids + [self.tokenizer.convert_tokens_to_ids("<|im_end|>")])[: params.max_tokens]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        return [Completion(list(prompt_ids), ids, [-0.2] * len(ids), text, "stop")]


def binary_search(conversation: str) -> str:
    """Guess-the-number over 1..20 from the hints in the conversation so far."""
    lo, hi = 1, 20
    for guess, hint in re.findall(
        r"\[(\d+)\]<\|im_end\|>\n<\|im_start\|>user\n\[GAME\] The target number is (higher|lower)",
        conversation,
    ):
        lo, hi = (int(guess) + 1, hi) if hint == "higher" else (lo, int(guess) - 1)
    return f"[{(lo + hi) // 2}]"


def _play(workflow, model, task):
    async def go():
        try:
            return await workflow.run(task, model)
        finally:
            await workflow.aclose()

    return asyncio.run(go())


def test_guess_the_number_is_one_conversation_with_the_hints_masked(tokenizer):
    pytest.importorskip("textarena", reason="textarena is not installed (pip install 'trine[envs]')")
    assert WORKFLOWS["multi_turn"] is MultiTurnWorkflow
    wf = MultiTurnWorkflow(
        env="textarena", env_args={"game": "GuessTheNumber-v0", "history": False}, max_steps=8
    )
    exps = _play(wf, Conversational(tokenizer, binary_search), env_task("guess/3", 2, seed=3))
    assert len(exps) == 2  # one experience per episode
    for e in exps:
        e.check()
        assert e.status == "ok" and e.info["success"] and e.reward == e.info["episode_return"] == 1.0
        assert 1 <= e.info["turns"] <= 5 and e.info["turn_rewards"][-1] == 1.0
        hints = [t for t, m in zip(e.response_tokens, e.action_mask) if m == 0]
        assert "The target number is" in tokenizer.decode(hints)  # observations: in context, not trained
        guesses = [t for t, m in zip(e.response_tokens, e.action_mask) if m == 1]
        assert "[GAME]" not in tokenizer.decode(guesses)


def test_one_experience_per_turn_carries_step_rewards_and_states_for_gigpo(tokenizer):
    pytest.importorskip("textarena", reason="textarena is not installed (pip install 'trine[envs]')")
    wf = MultiTurnWorkflow(
        env="textarena", env_args={"game": "GuessTheNumber-v0", "history": False}, max_steps=8, output="turns"
    )
    exps = _play(wf, Conversational(tokenizer, binary_search), env_task("guess/5", 1, seed=5))
    assert [e.step for e in exps] == list(range(len(exps))) and len({e.run_id for e in exps}) == 1
    assert [e.reward for e in exps] == [0.0] * (len(exps) - 1) + [1.0]
    assert all(e.info["env_state_hash"] and e.info["episode_return"] == 1.0 for e in exps)
    for earlier, later in zip(exps, exps[1:]):
        assert later.tokens[: len(earlier.tokens)] == earlier.tokens  # each turn extends the conversation


def test_a_real_engine_plays_the_grid_world_as_a_conversation(tiny_model_dir, tokenizer):
    engine = HFEngine(load_model(tiny_model_dir), tokenizer, seed=0)
    wf = MultiTurnWorkflow(env="grid_world", max_steps=4, max_tokens=400)
    task = env_task("grid/0", 2, size=3, seed=1, holes=1, max_steps=4)
    task.sampling = SamplingParams(temperature=1.0, max_tokens=6)
    exps = _play(wf, engine, task)
    engine.close()
    assert len(exps) == 2
    for e in exps:
        e.check()
        assert e.status in ("ok", "truncated") and len(e.tokens) <= 400
        assert sum(e.action_mask) < e.response_length or e.info["turns"] == 1  # observations masked


def test_an_environment_that_fails_mid_episode_ends_it_with_the_status(tokenizer):
    arm_faulty_env(call="step", at=2)
    wf = MultiTurnWorkflow(env=FaultyEnv, pool_size=1)
    (exp,) = _play(wf, Conversational(tokenizer, lambda text: "act"), env_task())
    assert exp.status == "env_error" and "raised ConnectionError" in exp.info["status_reason"]
    assert exp.info["turns"] == 2  # the turn the environment never answered is not kept
    arm_faulty_env(call="step", at=0)
    with pytest.raises(Exception, match="raised ConnectionError"):  # no step at all: the explorer retries
        _play(MultiTurnWorkflow(env=FaultyEnv), Conversational(tokenizer, lambda text: "act"), env_task())


def test_budget_and_turn_timeout_end_the_episode_without_raising(tokenizer):
    pytest.importorskip("textarena", reason="textarena is not installed (pip install 'trine[envs]')")
    args = {"env": "textarena", "env_args": {"game": "GuessTheNumber-v0", "history": False}}
    wf = MultiTurnWorkflow(**args, max_steps=8, max_tokens=420)
    (exp,) = _play(wf, Conversational(tokenizer, lambda text: "[1]"), env_task("guess/7", 1, seed=7))
    assert exp.status == "truncated" and len(exp.tokens) <= 420 and exp.info["turns"] >= 1
    slow = MultiTurnWorkflow(**args, turn_timeout=0.2)
    with pytest.raises(RuntimeError, match="before its first turn: timeout"):
        _play(slow, Conversational(tokenizer, binary_search, delay=3.0), env_task("guess/7", 1, seed=7))
    with pytest.raises(ValueError, match="output='steps'"):
        MultiTurnWorkflow(**args, output="steps")
