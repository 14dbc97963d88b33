"""The algorithm library learns: each RL preset lifts arithmetic accuracy from a shared SFT start,
DPO widens the preference margin, SFT lowers the NLL."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import EXAMPLE, read_metrics
from trine.config import load_config
from trine.loop import run

pytestmark = pytest.mark.slow

KEY = "eval/addition/avg@8"


def _rl(
    arithmetic_config, tmp_path, start, name: str, steps: int = 60, seed: int = 0, **algorithm
) -> tuple[float, float]:
    eval_set = {
        "name": "addition",
        "path": str(EXAMPLE / "data" / "eval.jsonl"),
        "sampling": {"temperature": 1.0, "max_tokens": 6},
    }
    run_name = name if seed == 0 else f"{name}-seed{seed}"
    cfg = arithmetic_config(
        {
            "seed": seed,
            "model": {"path": str(start)},
            "algorithm": {"name": name, **algorithm},
            "tasks": {
                "batch_size": 16,
                "total_steps": steps,
                "eval": [eval_set],
                "train": {"repeat": 8, "sampling": {"max_tokens": 6}},
            },
            "trainer": {"lr": 1e-3},
            "eval": {"every": 30, "k": 8, "at_start": True},
        },
        name=run_name,
    )
    run(load_config(cfg))
    rows = [r for r in read_metrics(tmp_path / run_name) if KEY in r]
    return rows[0][KEY], max(r[KEY] for r in rows[1:])


SEEDS = (0, 1)
LIFT = 0.08
"""Mean avg@8 lift over ``SEEDS`` each RL preset must reach in 60 steps.

Measured (issue 10, 60 steps from the shared SFT start, seeds 0-2, with and without fused AdamW —
a numerics-preserving change that moves single trajectories): single-run lifts ranged 0.06-0.27,
so the old one-seed bar of 0.15 failed 6 of 24 runs; the mean over seeds 0 and 1 was at least 0.11
for every preset in both variants (dapo 0.13, gspo 0.18, rloo 0.12, opmd 0.11 at their lowest).
"""


@pytest.mark.parametrize("name", ["dapo", "gspo", "rloo"])  # opmd (0.11 lowest mean) left out for suite time
def test_rl_preset_lifts_accuracy_averaged_over_seeds(name, sft_start, arithmetic_config, tmp_path):
    lifts = []
    for seed in SEEDS:
        before, best = _rl(arithmetic_config, tmp_path, sft_start, name, seed=seed)
        lifts.append(best - before)
    assert sum(lifts) / len(lifts) >= LIFT, f"{name}: avg@8 lifts {[round(x, 3) for x in lifts]}"


def test_ppo_with_a_critic_improves(sft_start, arithmetic_config, tmp_path):
    before, best = _rl(arithmetic_config, tmp_path, sft_start, "ppo")
    assert best > before + 0.05, f"ppo: avg@8 {before:.2f} -> best {best:.2f}"
    rows = [r for r in read_metrics(tmp_path / "ppo") if "trainer/value_loss" in r][-10:]
    # the critic beats the zero-initialised one: ½E[(V-R)²] below ½E[R²] = ½ × mean reward (R ∈ {0, 1})
    value_loss = sum(r["trainer/value_loss"] for r in rows) / len(rows)
    zero_critic = 0.5 * sum(r["explorer/reward_mean"] for r in rows) / len(rows)
    assert value_loss < 0.8 * zero_critic, (value_loss, zero_critic)


def test_dpo_widens_the_preference_margin(arithmetic_config, tmp_path, tiny_model_dir):
    import json

    rows = [json.loads(line) for line in (EXAMPLE / "data" / "train.jsonl").read_text().splitlines()]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "".join(
            json.dumps(
                {
                    "question": r["question"],
                    "chosen": r["answer"],
                    "rejected": str((int(r["answer"]) + 3) % 19),
                }
            )
            + "\n"
            for r in rows
        )
    )
    cfg = arithmetic_config(
        {
            "mode": "train",
            "algorithm": {"name": "dpo", "loss_args": {"beta": 0.5}},
            "tasks": {"batch_size": 16, "total_steps": 50, "train": {"path": str(pairs), "answer_key": None}},
            "trainer": {"lr": 1e-3},
        },
        name="dpo",
    )
    run(load_config(cfg))
    margins = [r["trainer/reward_margin"] for r in read_metrics(tmp_path / "dpo")]
    assert abs(margins[0]) < 1e-4  # the policy starts as its own reference
    assert sum(margins[-5:]) / 5 > 0.4, margins
    accuracy = [r["trainer/reward_accuracy"] for r in read_metrics(tmp_path / "dpo")]
    assert sum(accuracy[-5:]) / 5 > 0.75 and sum(accuracy[-5:]) > sum(accuracy[:5]) + 1.0, accuracy


def test_sft_lowers_the_nll(arithmetic_config, tmp_path):
    cfg = arithmetic_config(
        {
            "mode": "train",
            "algorithm": {"name": "sft"},
            "tasks": {"batch_size": 16, "total_steps": 30},
            "trainer": {"lr": 3e-3},
        },
        name="sft",
    )
    run(load_config(cfg))
    nll = [r["trainer/nll"] for r in read_metrics(tmp_path / "sft")]
    assert sum(nll[-5:]) / 5 < 0.5 * sum(nll[:5]) / 5
