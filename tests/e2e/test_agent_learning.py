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
    GRPO on the MCP calculator (a real server subprocess over stdio) lifts success (eval avg@4 on the 64
    held-out products) from 0 to about 60-75% in 20 steps. Measured (grpo.yaml, 2026-11-23): seed 0 with
    an eval at step 10: 0.00 -> 0.53 -> 0.75; seed 1 likewise: 0.00 -> 0.17 -> 0.69; seed 0 as here (no
    eval in between, so other random streams): 0.00 -> 0.56. The tool-call phase change (2 -> ~120
    calls of 128 rollouts per step) comes at steps 6-12. The bar, 0.5, leaves room for that spread. With the default token-mean
    loss aggregation instead, the policy's entropy collapsed after the take-off and seed 0 fell back to
    0.06 by step 20 (examples/tool_use/README.md)."""
    monkeypatch.chdir(ROOT)  # the config starts the server by a path relative to the repository root
    run_dir = tmp_path / "run"
    stages = load_config(
        TOOL_USE / "grpo.yaml",
        [f"run_dir={run_dir}", "tasks.total_steps=20", "eval.every=0", "eval.greedy=false"],
    )
    run(stages)
    (start, before), (end, after) = _evals(run_dir, "eval/multiply/avg@4")
    assert (start, end) == (0, 20)
    assert before <= 0.2 and after >= 0.5, (before, after)
    calls = [v for _, v in _evals(run_dir, "tools/calls")]
    assert max(calls[:2], default=0) <= 16 and min(calls[-4:]) >= 96, calls  # of 128 rollouts per step
