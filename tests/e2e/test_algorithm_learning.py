"""The algorithm library learns: each RL preset lifts arithmetic accuracy from a shared SFT start,
DPO widens the preference margin, SFT lowers the NLL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import EXAMPLE, read_metrics
from trine.config import load_config
from trine.loop import run

pytestmark = pytest.mark.slow

KEY = "eval/addition/avg@8"


def _config(arithmetic_config, start, name: str, steps: int, seed: int, threads: int, **algorithm):
    """The RL run of preset ``name`` from ``start`` (run directory ``<name>`` or ``<name>-seed<seed>``)."""
    eval_set = {
        "name": "addition",
        "path": str(EXAMPLE / "data" / "eval.jsonl"),
        "sampling": {"temperature": 1.0, "max_tokens": 6},
    }
    return arithmetic_config(
        {
            "seed": seed,
            "num_threads": threads,
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
        name=name if seed == 0 else f"{name}-seed{seed}",
    )


def _lift(run_dir: Path) -> tuple[float, float]:
    """(avg@8 at the start, best avg@8 after it) of a finished run."""
    rows = [r[KEY] for r in read_metrics(run_dir) if KEY in r]
    return rows[0], max(rows[1:])


def _rl(arithmetic_config, tmp_path, start, name: str, steps: int = 60, seed: int = 0, **algorithm):
    """One run in this process (one torch thread); returns ``_lift`` of it."""
    run(load_config(_config(arithmetic_config, start, name, steps, seed, 1, **algorithm)))
    return _lift(tmp_path / (name if seed == 0 else f"{name}-seed{seed}"))


def _rl_seeds(arithmetic_config, start, name: str, seeds: tuple[int, ...], steps: int = 60) -> list[float]:
    """The runs of ``seeds`` at once, each a ``trine run`` process on one torch thread (independent
    runs on a two-core machine: about twice as fast as one after the other); returns their lifts."""
    configs = [_config(arithmetic_config, start, name, steps, seed, 1) for seed in seeds]
    logs = [cfg.with_suffix(".log") for cfg in configs]
    procs = []
    try:
        for cfg, log in zip(configs, logs):
            with log.open("w") as out:  # a file, not a pipe: neither run can block on a full pipe
                command = [sys.executable, "-m", "trine.cli", "run", str(cfg)]
                procs.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT))
        for proc, log in zip(procs, logs):
            assert proc.wait(timeout=900) == 0, log.read_text()[-3000:]
    finally:
        for proc in procs:  # a failed or timed-out wait leaves no run behind
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    lifts = []
    for cfg in configs:
        before, best = _lift(Path(yaml.safe_load(cfg.read_text())["run_dir"]))
        lifts.append(best - before)
    return lifts


SEEDS = (0, 1)
LIFT = 0.08
"""Mean avg@8 lift over ``SEEDS`` each RL preset must reach in 60 steps.

Measured (issue 10, 60 steps from the shared SFT start, seeds 0-2, two torch threads, with and without
fused AdamW — a numerics-preserving change that moves single trajectories): single-run lifts ranged
0.06-0.27, so the old one-seed bar of 0.15 failed 6 of 24 runs; the mean over seeds 0 and 1 was at least
0.11 for every preset in both variants (dapo 0.13, gspo 0.18, rloo 0.12, opmd 0.11 at their lowest).
Re-measured on one torch thread per run (another such change: the seeds now run as two processes at
once): dapo 0.214/0.199, gspo 0.202/0.201, rloo 0.183/0.094 (means 0.21, 0.20, 0.14).
"""


@pytest.mark.parametrize("name", ["dapo", "gspo", "rloo"])  # opmd (0.11 lowest mean) left out for suite time
def test_rl_preset_lifts_accuracy_averaged_over_seeds(name, sft_start, arithmetic_config):
    lifts = _rl_seeds(arithmetic_config, sft_start, name, SEEDS)
    print(f"{name}: avg@8 lifts {[round(x, 3) for x in lifts]}")
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
