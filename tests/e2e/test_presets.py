"""Every algorithm preset runs end to end (3 steps) on a tiny model with the data it needs."""

from __future__ import annotations

import json

import pytest

from tests.helpers import EXAMPLE, read_metrics
from trine.algorithms import PRESETS
from trine.config import load_config
from trine.loop import run

pytestmark = pytest.mark.slow

ROLLOUT = [
    "grpo",
    "dr_grpo",
    "dapo",
    "gspo",
    "cispo",
    "sapo",
    "rloo",
    "reinforce_pp",
    "remax",
    "opmd",
    "opmd_pairwise",
    "asymre",
    "ppo",
    "mix",
    "distill",
]
MULTI_STEP = ["multi_step_grpo", "gigpo"]


def _preference_file(tmp_path):
    rows = [json.loads(line) for line in (EXAMPLE / "data" / "train.jsonl").read_text().splitlines()[:16]]
    path = tmp_path / "pairs.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {"question": r["question"], "chosen": r["answer"], "rejected": str(int(r["answer"]) + 1)}
            )
            + "\n"
            for r in rows
        )
    )
    return path


def _overrides(name: str, tmp_path, tiny_model_dir) -> dict:
    over: dict = {"algorithm": {"name": name}, "tasks": {"total_steps": 3, "batch_size": 2}}
    if name == "mix":
        over["tasks"]["expert"] = {"path": str(EXAMPLE / "data" / "train.jsonl"), "name": "expert"}
    if name == "distill":
        over["explorer"] = {"teacher": str(tiny_model_dir)}
    if name == "sft":
        over["mode"] = "train"
    if name == "dpo":
        over["mode"] = "train"
        over["tasks"]["train"] = {"path": str(_preference_file(tmp_path)), "answer_key": None}
    if name in MULTI_STEP:
        over["tasks"]["train"] = {
            "path": str(EXAMPLE.parent / "grid_world" / "data" / "train.jsonl"),
            "workflow": "grid_world",
            "answer_key": None,
            "repeat": 4,
            "sampling": {"max_tokens": 4},
        }
    return over


def test_every_preset_is_covered():
    assert set(ROLLOUT + MULTI_STEP + ["sft", "dpo"]) == set(PRESETS)


@pytest.mark.parametrize("name", ROLLOUT + MULTI_STEP + ["sft", "dpo"])
def test_preset_runs_three_steps(name, arithmetic_config, tmp_path, tiny_model_dir):
    cfg = arithmetic_config(_overrides(name, tmp_path, tiny_model_dir), name=name)
    run(load_config(cfg))
    rows = read_metrics(tmp_path / name)
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        if r.get("trainer/empty_batch"):  # DAPO on an untrained model: every group dropped
            assert name == "dapo" and r["dapo/kept_groups"] == 0 and r["dapo/extra_draws"] > 0
            continue
        assert r["trainer/loss"] == r["trainer/loss"]  # not NaN
        assert r["trainer/grad_norm"] >= 0
    if name == "ppo":
        assert all("trainer/value_loss" in r for r in rows)
    if name == "dapo":
        assert all("dapo/kept_groups" in r for r in rows)
    if name == "dpo":
        assert all("trainer/reward_margin" in r for r in rows)
    if name == "mix":
        assert all(r["trainer/batch_size"] > 8 for r in rows)  # rollouts + expert rows


def test_an_algorithm_from_a_user_file(arithmetic_config, tmp_path):
    """The docs' plugin example: a user file registers an advantage and an algorithm; it runs by name."""
    import subprocess
    import sys

    plugin = EXAMPLE.parent / "plugins" / "median_baseline.py"
    cfg = arithmetic_config({"tasks": {"total_steps": 2, "batch_size": 2}}, name="plugin")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trine.cli",
            "run",
            str(cfg),
            "--plugin",
            str(plugin),
            "algorithm.name=median_pg",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = read_metrics(tmp_path / "plugin")
    assert [r["step"] for r in rows] == [1, 2]
    assert all("trainer/advantages_abs_mean" in r for r in rows)
