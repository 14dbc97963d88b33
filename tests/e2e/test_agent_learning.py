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


def test_grpo_makes_the_guess_the_number_player_win_more(tmp_path):
    """From the warm start of the example's SFT stage (a player that uses the hints now and then), GRPO on
    whole games (multi_turn, the higher_lower environment of examples/guess_number/game.py, grpo.yaml's 40
    steps) raises the held-out success rate (64 games x 16 samples at temperature 1), averaged over three
    seeds. Not the training reward: each step's 16 secret numbers differ in difficulty (one run's steps range
    0.22-0.61), and its rise over a run is within that noise (a CI run: 0.36 -> 0.39). Nor the number of
    turns: it fell on eight runs of nine, rose on one (3.22 -> 3.29). Measured, one torch thread
    (2026-11-27), eval avg@16 rise after 40 steps: +0.17, +0.08, +0.09, +0.10, +0.05, +0.07 (seeds 0, 2, 5-8;
    mean +0.09, sd 0.04); after 30 steps the rise was smaller and less sure (+0.12, +0.02, +0.14, +0.06 on
    seeds 1-4, and in CI runs +0.10 and -0.04 on seeds 0 and 1, which failed a two-seed bar of +0.04). The
    bar, +0.03 on the mean of three seeds at 40 steps, is over two standard deviations of that mean below
    what was measured."""
    registry.load_plugin(GUESS / "game.py")
    rises = []
    for seed in (0, 1, 2):
        run_dir = tmp_path / f"run{seed}"
        stages = load_config(
            GUESS / "grpo.yaml",
            [f"run_dir={run_dir}", f"seed={seed}", "eval.every=0", "eval.greedy=false", "eval.k=16"],
        )
        run(stages)
        (start, before), (end, after) = _evals(run_dir, "eval/guess/avg@16")
        assert (start, end) == (0, 40)
        rises.append(after - before)
    assert statistics.fmean(rises) >= 0.03, rises
