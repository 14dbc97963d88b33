"""The GPU trainer on a CUDA device: a bf16 step, FSDP2 on one GPU (NCCL), a LoRA step whose merged
weights reach a rollout engine, and the offloaded reference. Skipped without CUDA (``tests/conftest.py``);
the same code paths run on CPU in ``tests/unit/trainer/test_trainer_scale.py``."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from tests.helpers import LORA, shifted_experiences
from trine.algorithms import PRESETS
from trine.config import TrainerConfig
from trine.models import load_model, load_tokenizer
from trine.models.engine import HFEngine
from trine.models.export import rollout_state_dict
from trine.trainer import Trainer
from trine.trainer.policy import prepare_policy, reference_model

pytestmark = pytest.mark.gpu


def _cuda_step(model_dir, model, algo=PRESETS["grpo"], ref=None, **kwargs) -> dict[str, float]:
    tokenizer = load_tokenizer(model_dir)
    settings = TrainerConfig(lr=1e-3, **kwargs)
    trainer = Trainer(model, algo, settings, pad_token_id=tokenizer.pad_token_id, ref_model=ref)
    exps = shifted_experiences(load_model(model_dir), tokenizer, shift=-0.05)
    return trainer.step(exps)


def test_bf16_step_on_cuda_keeps_fp32_master_weights(tiny_model_dir):
    fp32 = _cuda_step(tiny_model_dir, load_model(tiny_model_dir, device="cuda"))
    model = load_model(tiny_model_dir, device="cuda")
    bf16 = _cuda_step(tiny_model_dir, model, precision="bf16")
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert bf16["trainer/grad_norm"] == pytest.approx(fp32["trainer/grad_norm"], rel=0.05)


def _fsdp_cuda_child(model_dir: str, queue) -> None:
    plain = _cuda_step(model_dir, load_model(model_dir, device="cuda"))
    model = prepare_policy(load_model(model_dir, device="cuda"), fsdp=True)
    sharded = _cuda_step(model_dir, model, precision="bf16")
    queue.put(
        (plain["trainer/grad_norm"], sharded["trainer/grad_norm"], type(next(model.parameters())).__name__)
    )


def test_fsdp2_on_one_gpu(tiny_model_dir):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_fsdp_cuda_child, args=(str(tiny_model_dir), queue))
    child.start()
    plain, sharded, kind = queue.get(timeout=300)
    child.join(timeout=60)
    assert child.exitcode == 0 and kind == "DTensor"
    assert sharded == pytest.approx(plain, rel=0.05)


def test_lora_step_and_sync_to_the_engine(tiny_model_dir):
    pytest.importorskip("peft")
    policy = prepare_policy(load_model(tiny_model_dir, device="cuda"), lora=LORA)
    ref = reference_model(policy, lambda m: m, lora=True, offload=False)
    metrics = _cuda_step(tiny_model_dir, policy, algo=PRESETS["grpo"].with_overrides(kl_coef=0.1), ref=ref)
    assert metrics["trainer/grad_norm"] > 0
    tokenizer = load_tokenizer(tiny_model_dir)
    engine = HFEngine(load_model(tiny_model_dir, device="cuda"), tokenizer, max_batch_size=4, seed=0)
    try:
        engine.load_weights(rollout_state_dict(policy), version=1)
        assert engine.policy_version == 1
    finally:
        engine.close()


def test_offloaded_reference_lives_on_the_cpu_between_steps(tiny_model_dir):
    ref = reference_model(load_model(tiny_model_dir, device="cuda"), lambda m: m, lora=False, offload=True)
    assert next(ref.model.parameters()).device.type == "cpu" and ref.device.type == "cuda"
    _cuda_step(
        tiny_model_dir,
        load_model(tiny_model_dir, device="cuda"),
        algo=PRESETS["grpo"].with_overrides(kl_coef=0.1),
        ref=ref,
    )
    assert next(ref.model.parameters()).device.type == "cpu"
