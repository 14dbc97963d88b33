"""Agents learn (issue 12 item 5): the tiny model learns to call a calculator served by the example MCP
server, and to play a multi-turn game from its feedback. Both run the examples' configs as users do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trine.config import load_config
from trine.loop import run

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TOOL_USE = ROOT / "examples" / "tool_use"


def _evals(run_dir: Path, key: str) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    return [(r["step"], r[key]) for r in rows if key in r]


def test_grpo_teaches_the_tiny_model_to_call_the_calculator(tmp_path, monkeypatch):
    """From the warm start the example's two SFT stages leave (it rarely calls the tool: success 0.4%),
    GRPO on the MCP calculator (a real server subprocess over stdio) makes the model call it and lifts
    success. Measured (2026-11-23, 64 products x 4 samples, grpo.yaml): seed 0: 0.0 -> 0.64 at step 10
    (tool calls 2 -> 113 of 128 per step at steps 5-6), then entropy collapses (0.03) and success
    decays (0.06 at step 20); seed 1: 0.0 -> 0.45 (step 10) -> 0.56 (step 20). Here (seed 0, 32 products):
    0.0 -> 0.63 (step 7) and 0.61 (step 14). The bar, 0.4 at the better of the two evals, holds for
    both seeds; the issue's 60% is not yet reached reliably (see examples/tool_use/README.md)."""
    monkeypatch.chdir(ROOT)  # the config starts the server by a path relative to the repository root
    run_dir = tmp_path / "run"
    stages = load_config(
        TOOL_USE / "grpo.yaml",
        [
            f"run_dir={run_dir}",
            "tasks.total_steps=14",
            "eval.every=7",
            "eval.greedy=false",
            "tasks.eval.0.limit=32",
        ],
    )
    run(stages)
    (start, before), *evals = _evals(run_dir, "eval/multiply/avg@4")
    assert start == 0 and [step for step, _ in evals] == [7, 14]
    assert before <= 0.2 and max(v for _, v in evals) >= 0.4, (before, evals)
    calls = [v for _, v in _evals(run_dir, "tools/calls")]
    assert max(calls[:2], default=0) <= 16 and min(calls[-4:]) >= 96, calls  # of 128 rollouts per step
