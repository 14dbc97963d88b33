"""The GPU trainer's settings wired through the real loop on CPU: a LoRA + bf16 + packed + checkpointed
run (from the SFT warm-up's weights) whose explorer samples a merged snapshot (``sync.method: copy``), with a KL to the adapter-disabled
base, crashed after a checkpoint and resumed from the saved adapter to the same end."""

from __future__ import annotations

import json

import pytest

from tests.helpers import read_metrics, run_crashing_after_step
from trine.config import load_config
from trine.loop import run
from trine.models import load_model

pytestmark = pytest.mark.slow

VOLATILE = ("time/", "trainer/tokens_per_second", "sync/seconds")
SCALE = {
    "algorithm": {"kl_coef": 0.05},
    "sync": {"method": "copy"},
    "trainer": {
        "lr": 5e-3,
        "save_every": 2,
        "precision": "bf16",
        "packed": True,
        "gradient_checkpointing": True,
        "lora": {"rank": 4, "alpha": 8},
    },
}


def test_lora_bf16_packed_run_learns_its_adapter_and_resumes(
    arithmetic_config, sft_start, tmp_path, monkeypatch
):
    pytest.importorskip("peft", reason="trainer.lora needs the `lora` extra: pip install 'trine[lora]'")
    scale = {**SCALE, "model": {"path": str(sft_start)}}  # answers right often enough for a gradient
    run(load_config(arithmetic_config(scale, name="full")))
    full = read_metrics(tmp_path / "full")
    assert [r["step"] for r in full] == [1, 2, 3, 4, 5, 6]
    assert full[0]["trainer/kl"] == pytest.approx(0.0, abs=1e-6)  # the adapters start at zero (B = 0)
    assert full[-1]["trainer/kl"] > 0  # ... and moved the policy away from the base
    checkpoint = tmp_path / "full" / "checkpoints" / "step_6"
    assert (checkpoint / "adapter" / "adapter_config.json").is_file()
    merged = load_model(checkpoint)  # the checkpoint's weights are a plain model with the adapter merged
    assert not any("lora" in k for k in merged.state_dict())

    crashed = arithmetic_config(scale, name="crashed")
    run_crashing_after_step(crashed, 3, monkeypatch)
    run(load_config(crashed))  # resumes from step_2: base from model.path, adapter from the checkpoint
    resumed = read_metrics(tmp_path / "crashed")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]
    assert json.loads((tmp_path / "crashed" / "status.json").read_text())["state"] == "finished"
    for a, b in zip(full, resumed, strict=True):  # the same run: same samples, same updates
        stable = [k for k, v in a.items() if not k.startswith(VOLATILE) and isinstance(v, (int, float))]
        assert {k: b[k] for k in stable} == pytest.approx({k: a[k] for k in stable}, rel=1e-4, abs=1e-6)


def test_an_fsdp_policy_sampled_by_its_own_engine_trains_like_the_plain_one(
    arithmetic_config, sft_start, tmp_path
):
    """Mode sync with the engine sampling the trainer's FSDP2-sharded policy (in a child process: the
    one-process group lives as long as the process): the same samples and steps as without sharding."""
    import subprocess
    import sys

    over = {
        "model": {"path": str(sft_start)},
        "algorithm": {"kl_coef": 0.05},
        "tasks": {"total_steps": 3},
        # the per-sample forward in both: FSDP runs no shared-prompt forward, and its rounding differs
        "trainer": {"lr": 5e-3, "precision": "bf16", "save_every": 2, "shared_prompt": False},
    }
    plain = arithmetic_config(over, name="plain")
    sharded = arithmetic_config({**over, "trainer": {**over["trainer"], "fsdp": True}}, name="sharded")
    for config in (plain, sharded):
        subprocess.run(
            [sys.executable, "-m", "trine.cli", "run", str(config)], check=True, capture_output=True
        )
    want, got = read_metrics(tmp_path / "plain"), read_metrics(tmp_path / "sharded")
    assert [r["explorer/reward_mean"] for r in got] == [r["explorer/reward_mean"] for r in want]
    assert any(r["trainer/grad_norm"] > 0 for r in got)
    keys = ("trainer/loss", "trainer/grad_norm", "trainer/kl")
    for a, b in zip(got, want, strict=True):
        assert {k: a[k] for k in keys} == pytest.approx({k: b[k] for k in keys}, rel=1e-3, abs=1e-5)
    assert (tmp_path / "sharded" / "checkpoints" / "step_3" / "config.json").is_file()
