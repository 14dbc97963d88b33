"""Environments no one here wrote, played offline: a textarena game and a gymnasium environment.

Scripted replies (no model) play a few real steps of each, through the adapter and through the
step-wise workflow, and the rewards / termination are checked against the games' own rules.
"""

from __future__ import annotations

import asyncio
import random
import re

import pytest

from tests.helpers import ScriptedModel, env_task
from trine.workflows import StepWiseWorkflow
from trine.workflows.envs import TextArenaEnv, make_env_pool


def guesser(observation: str) -> str:
    """A binary search over GuessTheNumber's 1..20, reading the hints in the observation."""
    lo, hi = 1, 20
    for guess, hint in re.findall(
        r"\[Player\] [^\n]*\[(\d+)\]\n\[GAME\] The target number is (higher|lower)", observation
    ):
        lo, hi = (int(guess) + 1, hi) if hint == "higher" else (lo, int(guess) - 1)
    return f"I guess [{(lo + hi) // 2}]"


def test_guess_the_number_plays_to_a_win_with_rewards_only_at_the_end():
    pytest.importorskip("textarena", reason="textarena is not installed (pip install 'trine[envs]')")
    outer = random.getstate()
    env = TextArenaEnv("GuessTheNumber-v0")
    observation, info = env.reset(seed=3)
    assert info == {"game": "GuessTheNumber-v0"} and "Guess The Number" in observation
    assert random.getstate() == outer  # the game's draws leave the process's random module alone
    rewards, done, steps = [], False, 0
    while not done:
        observation, reward, done, truncated, info = env.step(guesser(observation))
        rewards.append(reward)
        steps += 1
        assert not truncated and steps <= 5  # a binary search over 1..20 needs at most 5 guesses
    assert rewards[:-1] == [0.0] * (len(rewards) - 1) and rewards[-1] == 1.0
    assert info["success"] and info["turn_count"] == len(rewards) and "Congratulations" in info["reason"]
    assert random.getstate() == outer


def test_each_game_keeps_its_own_random_state_so_interleaved_games_reproduce():
    """Minesweeper places its mines with the random module at the first move: a game played alone
    and the same game interleaved with another one (and with other users of ``random``) agree."""
    pytest.importorskip("textarena", reason="textarena is not installed (pip install 'trine[envs]')")

    def game(seed: int) -> TextArenaEnv:
        env = TextArenaEnv("Minesweeper-v0-small", history=False)
        env.reset(seed=seed)
        return env

    alone = game(5).step("[2 2]")[0]
    mixed, other = game(5), game(6)
    other.step("[1 1]")
    [random.random() for _ in range(10)]
    assert mixed.step("[2 2]")[0] == alone and "Current Board" in alone


def test_invalid_moves_warn_once_then_end_the_game_without_success():
    pytest.importorskip("textarena", reason="textarena is not installed (pip install 'trine[envs]')")
    env = TextArenaEnv("GuessTheNumber-v0", history=False)
    env.reset(seed=1)
    observation, reward, done, _, _ = env.step("no idea")  # wrapped as [no idea]: not a number
    assert not done and reward == 0.0 and observation.startswith("[GAME] You attempted an invalid move")
    assert "[Player]" not in observation  # history=False: what is new, without the echo of the move
    observation, reward, done, _, info = env.step("still no idea")
    assert done and reward == 0.0 and info["invalid_move"] and not info["success"]
    with pytest.raises(ValueError, match="'Guess-v9' is not a textarena environment id"):
        TextArenaEnv("Guess-v9")


def test_reward_win_pays_only_a_win_where_the_game_pays_a_near_miss():
    """GuessTheNumber pays a game lost at the turn limit 1 - distance / 19; ``reward="win"`` pays it 0 and
    keeps the game's own reward in ``info["game_reward"]``; a win pays 1 either way."""
    pytest.importorskip("textarena", reason="textarena is not installed (pip install 'trine[envs]')")
    ends = {}
    for reward in ("game", "win"):
        env = TextArenaEnv("GuessTheNumber-v0", {"max_turns": 2}, history=False, reward=reward)
        env.reset(seed=3)
        guesses = iter(range(1, 10))  # the secret of seed 3 is higher: lost at the turn limit
        while not (end := env.step(f"[{next(guesses)}]"))[2]:
            pass
        ends[reward] = end
    (_, game_pays, done, _, info), (_, win_pays, win_done, _, win_info) = ends["game"], ends["win"]
    assert done and win_done and not info["success"] and not win_info["success"]
    assert 0.0 < game_pays < 1.0 and win_pays == 0.0 and win_info["game_reward"] == game_pays
    env = TextArenaEnv("GuessTheNumber-v0", reward="win")
    observation, _ = env.reset(seed=3)
    done = False
    while not done:
        observation, paid, done, _, info = env.step(guesser(observation))
    assert info["success"] and paid == 1.0
    with pytest.raises(ValueError, match="textarena reward='wins'; expected 'game'"):
        TextArenaEnv("GuessTheNumber-v0", reward="wins")


def test_a_textarena_game_runs_in_the_step_wise_workflow_with_a_reused_pool():
    pytest.importorskip("textarena", reason="textarena is not installed (pip install 'trine[envs]')")
    workflow = StepWiseWorkflow(
        env="textarena", env_args={"game": "GuessTheNumber-v0"}, pool_size=2, max_steps=6
    )

    async def play():
        runs = [
            await workflow.run(env_task(f"guess/{i}", 2, seed=i), ScriptedModel(guesser)) for i in range(3)
        ]
        await workflow.aclose()
        return runs

    runs = asyncio.run(play())
    for exps in runs:
        first = [e for e in exps if e.info["rollout_index"] == 0]
        second = [e for e in exps if e.info["rollout_index"] == 1]
        assert [e.info["response"] for e in first] == [
            e.info["response"] for e in second
        ]  # one game per task
        assert first[-1].reward == 1.0 and all(e.reward == 0.0 for e in first[:-1])
        assert all(e.info["success"] and e.status == "ok" and e.info["episode_return"] == 1.0 for e in exps)
        assert first[0].info["env_state_hash"] == second[0].info["env_state_hash"]
    assert [e.info["response"] for e in runs[0]] != [e.info["response"] for e in runs[1]]  # seeds differ
    assert workflow.envs.built == 2 and workflow.envs.reused == 4


def frozen_lake_text(observation, info) -> str:
    """FrozenLake's observation (a cell index on the 4x4 map) as text."""
    row, col = divmod(int(observation), 4)
    return f"You are at row {row}, column {col}. Reply left, down, right or up."


def frozen_lake_action(text: str) -> int:
    """A reply as FrozenLake's action (0 left, 1 down, 2 right, 3 up)."""
    words = ("left", "down", "right", "up")
    return next((i for i, word in enumerate(words) if word in text), 0)


def test_a_gymnasium_make_id_runs_with_text_of_and_action_of_import_paths():
    pytest.importorskip("gymnasium", reason="gymnasium is not installed (pip install 'trine[envs]')")
    route = iter(["down", "down", "right", "right", "down", "right"])  # S to G around the holes
    workflow = StepWiseWorkflow(
        env="gym",
        env_args={"env_id": "FrozenLake-v1", "is_slippery": False},
        text_of=f"{__name__}:frozen_lake_text",
        action_of=f"{__name__}:frozen_lake_action",
        env_timeout=10.0,
    )
    model = ScriptedModel(lambda observation: next(route))
    exps = asyncio.run(workflow.run(env_task(seed=0), model))
    assert model.observations[0] == "You are at row 0, column 0. Reply left, down, right or up."
    assert [e.reward for e in exps] == [0.0] * 5 + [1.0] and exps[-1].info["env_info"]["terminated"]
    assert exps[-1].info["success"] and {e.status for e in exps} == {"ok"}
    with pytest.raises(ValueError, match="'Frozen-v0' is not a registered gymnasium environment id"):
        asyncio.run(make_env_pool("gym", {"env_id": "Frozen-v0"}).make().reset(env_task()))
