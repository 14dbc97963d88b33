"""Agents learn (issue 12 item 5): the tiny model learns to call a calculator served by the example MCP
server, and to play a multi-turn game from its feedback. Both run the examples' configs as users do."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from trine import registry
from trine.config import load_config
from trine.loop import run

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TOOL_USE = ROOT / "examples" / "tool_use"
GUESS = ROOT / "examples" / "guess_number"


def _steps(run_dir: Path, key: str) -> list[float]:
    return [v for _, v in _evals(run_dir, key)]


def _evals(run_dir: Path, key: str) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return [(r["step"], r[key]) for r in rows if key in r]


def test_grpo_teaches_the_tiny_model_to_call_the_calculator(tmp_path, monkeypatch):
    """From the warm start the example's two SFT stages leave (it rarely calls the tool: success 0.4%),
    GRPO on the MCP calculator (a real server subprocess over stdio) lifts success (eval avg@4 on the 64
    held-out products) from 0 to 60-75%. The test runs the example at half its learning rate (5e-4) for 24
    steps: at 1e-3, one CI run's seed 1 took off at step 12 and collapsed two steps later (reward 0 and
    2-7 tool calls of 128 from step 14 on; with every reward equal GRPO has no gradient to climb back).
    Measured at 5e-4, one torch thread (2026-11-27): 20 steps, seeds 0-5: 0.73, 0.63, 0.65, 0.68, 0.69,
    0.65, the tool-call phase change (~2 -> ~125 calls of 128 rollouts per step) at steps 9-16; 24 steps,
    seeds 6-9: 0.70, 0.75, 0.64, 0.60. At 1e-3, seeds 0-5: 0.70, 0.59, 0.73, 0.69, 0.55, 0.66. The bar,
    0.5 on the mean of seeds 0 and 1, leaves room for that spread. With the default token-mean loss
    aggregation, an earlier version saw the policy's entropy collapse after the take-off
    (examples/tool_use/README.md)."""
    monkeypatch.chdir(ROOT)  # the config starts the server by a path relative to the repository root
    afters = []
    for seed in (0, 1):  # one trajectory's take-off step varies with rounding and threads: average two
        run_dir = tmp_path / f"run{seed}"
        stages = load_config(
            TOOL_USE / "grpo.yaml",
            [
                f"run_dir={run_dir}",
                f"seed={seed}",
                "tasks.total_steps=24",
                "trainer.lr=5e-4",
                "eval.every=0",
                "eval.greedy=false",
            ],
        )
        run(stages)
        (start, before), (end, after) = _evals(run_dir, "eval/multiply/avg@4")
        assert (start, end) == (0, 24)
        assert before <= 0.2, before
        afters.append(after)
        calls = [v for _, v in _evals(run_dir, "tools/calls")]
        assert max(calls[:2], default=0) <= 16 and min(calls[-4:]) >= 96, calls  # of 128 rollouts per step
    assert statistics.fmean(afters) >= 0.5, afters


def test_grpo_makes_the_guess_the_number_player_win_more_in_fewer_turns(tmp_path):
    """From the warm start of the example's SFT stage (a player that uses the hints now and then), GRPO on
    whole games (multi_turn, the higher_lower environment of examples/guess_number/game.py) raises the
    success rate and shortens the games. The claim is the evaluation (64 held-out games x 16 samples at
    temperature 1, standard error ~0.015), averaged over two seeds: the training reward is not, as each
    step's 16 secret numbers differ in difficulty (steps of one run range 0.22-0.61) and its rise over 30
    steps is within that noise (a CI run, seed 0: first 5 steps 0.36, last 10 0.39). Measured, 30 steps,
    one torch thread (2026-11-27), eval avg@16 before -> after and turns (first 5 -> last 10 steps):
    seed 1: 0.48 -> 0.61, 3.23 -> 3.11; seed 2: 0.52 -> 0.54, 3.23 -> 3.09; seed 3: 0.48 -> 0.62,
    3.17 -> 3.01; seed 4: 0.49 -> 0.55, 3.14 -> 3.09 (seed 0 on 2026-11-23: 0.49 -> 0.64, 3.31 -> 3.01).
    Mean rise +0.09 (two-seed means +0.04 to +0.14); the bar is +0.04 on the mean of seeds 0 and 1 and a
    turn shorter on average by 0.03."""
    registry.load_plugin(GUESS / "game.py")
    rises, shorter = [], []
    for seed in (0, 1):
        run_dir = tmp_path / f"run{seed}"
        stages = load_config(
            GUESS / "grpo.yaml",
            [
                f"run_dir={run_dir}",
                f"seed={seed}",
                "tasks.total_steps=30",
                "eval.every=0",
                "eval.greedy=false",
                "eval.k=16",
            ],
        )
        run(stages)
        (start, before), (end, after) = _evals(run_dir, "eval/guess/avg@16")
        assert (start, end) == (0, 30)
        turns = _steps(run_dir, "explorer/turns_mean")
        assert len(turns) == 30
        rises.append(after - before)
        shorter.append(statistics.fmean(turns[:5]) - statistics.fmean(turns[-10:]))
    assert statistics.fmean(rises) >= 0.04, rises
    assert statistics.fmean(shorter) >= 0.03, shorter
