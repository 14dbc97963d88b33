"""The GPU trainer's settings, checked on CPU where they run: bf16 autocast with float32 master weights,
gradient checkpointing, packed micro-batches, FSDP2 (a one-process gloo group), LoRA (peft) with the
reference as the adapter-disabled policy and merged rollout weights, and the offloaded reference."""

from __future__ import annotations

import importlib.util
import multiprocessing as mp

import pytest
import torch

from tests.helpers import LORA, shifted_experiences
from trine.algorithms import PRESETS
from trine.config import TrainerConfig
from trine.models import load_model, load_tokenizer
from trine.models.batching import collate, forward_logprobs
from trine.models.export import has_lora, plain_copy, rollout_state_dict, save_model
from trine.trainer import Trainer
from trine.trainer.policy import AdapterDisabled, Offloaded, own_weights, prepare_policy, reference_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _step(model_dir, algo="grpo", policy=None, ref=None, **kwargs) -> tuple[dict[str, float], Trainer]:
    tokenizer = load_tokenizer(model_dir)
    model = policy if policy is not None else load_model(model_dir)
    trainer = Trainer(
        model,
        PRESETS[algo] if isinstance(algo, str) else algo,
        TrainerConfig(lr=1e-3, grad_clip=0.0, **kwargs),
        pad_token_id=tokenizer.pad_token_id,
        ref_model=ref,
    )
    # rollout-like experiences whose behaviour logprobs are near the policy's (0.05 above), not at them
    return trainer.step(shifted_experiences(load_model(model_dir), tokenizer, shift=-0.05)), trainer


def test_bf16_autocast_keeps_float32_weights_and_tracks_fp32(tiny_model_dir):
    fp32, _ = _step(tiny_model_dir)
    bf16, trainer = _step(tiny_model_dir, precision="bf16")
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert all(s["exp_avg"].dtype == torch.float32 for s in trainer.optimizer.state.values())
    assert bf16["trainer/grad_norm"] == pytest.approx(fp32["trainer/grad_norm"], rel=0.05)
    assert bf16["trainer/grad_norm"] != fp32["trainer/grad_norm"]  # the forward really ran in bf16


def test_gradient_checkpointing_and_packing_keep_the_step(tiny_model_dir):
    base, _ = _step(tiny_model_dir)
    model = prepare_policy(load_model(tiny_model_dir), gradient_checkpointing=True)
    assert model.is_gradient_checkpointing
    checkpointed, _ = _step(tiny_model_dir, policy=model)
    packed, _ = _step(tiny_model_dir, packed=True)
    for other in (checkpointed, packed):
        assert other["trainer/grad_norm"] == pytest.approx(base["trainer/grad_norm"], rel=1e-4)
        assert other["trainer/loss"] == pytest.approx(base["trainer/loss"], rel=1e-4, abs=1e-6)


def _fsdp_child(model_dir: str, queue) -> None:
    torch.set_num_threads(1)
    plain, _ = _step(model_dir)
    model = prepare_policy(load_model(model_dir), fsdp=True)
    sharded = type(next(model.parameters())).__name__
    metrics, trainer = _step(model_dir, policy=model)
    reference = load_model(model_dir)
    _step(model_dir, policy=reference)
    weights = rollout_state_dict(trainer.model)
    diff = max(float((weights[k] - v).abs().max()) for k, v in reference.state_dict().items())
    copy_ok = type(next(plain_copy(trainer.model).parameters())).__name__
    lora_diff = None
    if importlib.util.find_spec("peft") is not None:  # LoRA adapters on a sharded model: the same step
        _, both = _step(model_dir, policy=prepare_policy(load_model(model_dir), lora=LORA, fsdp=True))
        _, only = _step(model_dir, policy=prepare_policy(load_model(model_dir), lora=LORA))
        merged, expected = rollout_state_dict(both.model), rollout_state_dict(only.model)
        lora_diff = max(float((merged[k] - v).abs().max()) for k, v in expected.items())
    queue.put((sharded, plain["trainer/grad_norm"], metrics["trainer/grad_norm"], diff, copy_ok, lora_diff))


def test_fsdp2_on_one_process_matches_the_plain_step(tiny_model_dir):
    """FSDP2 over a one-process gloo group (in a child process: the group is process-wide): the same
    step as unsharded, the rollout weights gathered into plain tensors; with LoRA adapters too."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_fsdp_child, args=(str(tiny_model_dir), queue))
    child.start()
    sharded, plain_norm, fsdp_norm, diff, copy_type, lora_diff = queue.get(timeout=120)
    child.join(timeout=30)
    assert child.exitcode == 0
    assert sharded == "DTensor" and copy_type == "Parameter"
    assert fsdp_norm == pytest.approx(plain_norm, rel=1e-5)
    assert diff < 1e-6
    assert lora_diff is None or lora_diff < 1e-6  # None: no peft (the `lora` extra) here


def test_lora_trains_adapters_only_and_hands_out_merged_weights(tiny_model_dir, tmp_path):
    pytest.importorskip("peft", reason="trainer.lora needs the `lora` extra: pip install 'trine[lora]'")
    base = load_model(tiny_model_dir)
    start = {k: v.clone() for k, v in base.state_dict().items()}
    policy = prepare_policy(load_model(tiny_model_dir), lora=LORA)
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    ref = reference_model(policy, lambda m: m, lora=True, offload=False)
    assert isinstance(ref, AdapterDisabled) and own_weights(ref) is None
    metrics, trainer = _step(tiny_model_dir, algo="grpo", policy=policy)
    assert metrics["trainer/grad_norm"] > 0
    merged = rollout_state_dict(trainer.model)
    assert set(merged) == set(start)  # the base architecture's names, adapters merged away
    moved = [k for k in start if not torch.equal(merged[k], start[k])]
    assert moved and all(k.endswith(".weight") for k in moved)
    # merged weights = what peft's own merge gives, and the adapter-disabled policy is the base
    tokenizer = load_tokenizer(tiny_model_dir)
    batch = collate(
        shifted_experiences(base, tokenizer, shift=-0.05), [0, 1, 2], tokenizer.pad_token_id, "cpu"
    )
    with torch.no_grad():
        lora_lp, _ = forward_logprobs(policy, batch)
        merged_model = plain_copy(policy)
        merged_lp, _ = forward_logprobs(merged_model, batch)
        ref_lp, _ = forward_logprobs(ref, batch)
        base_lp, _ = forward_logprobs(base, batch)
    assert (lora_lp - merged_lp).abs().max() < 1e-5 and (lora_lp - base_lp).abs().max() > 1e-6
    assert torch.equal(ref_lp, base_lp) or (ref_lp - base_lp).abs().max() < 1e-6
    # a checkpoint: plain merged weights any loader takes, plus the peft adapter
    save_model(policy, tmp_path / "ckpt")
    reloaded = load_model(tmp_path / "ckpt")
    assert not has_lora(reloaded) and (tmp_path / "ckpt" / "adapter" / "adapter_config.json").is_file()
    with torch.no_grad():
        assert (forward_logprobs(reloaded, batch)[0] - lora_lp).abs().max() < 1e-5
    resumed = prepare_policy(
        load_model(tiny_model_dir), lora=LORA, adapter_dir=str(tmp_path / "ckpt" / "adapter")
    )
    with torch.no_grad():
        assert (forward_logprobs(resumed, batch)[0] - lora_lp).abs().max() < 1e-5


def test_offloaded_reference_scores_like_the_copy(tiny_model_dir):
    def earlier_weights():  # a reference that differs from the policy, so the KL term is not zero
        model = load_model(tiny_model_dir)
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=gen))
        return model

    copy = earlier_weights()
    offloaded = reference_model(earlier_weights(), lambda m: m, lora=False, offload=True)
    assert isinstance(offloaded, Offloaded) and own_weights(offloaded) is offloaded.model
    kl = PRESETS["grpo"].with_overrides(kl_coef=0.5)
    with_copy, _ = _step(tiny_model_dir, algo=kl, ref=copy)
    with_offload, _ = _step(tiny_model_dir, algo=kl, ref=offloaded)
    assert with_copy["trainer/kl"] > 0
    assert with_offload["trainer/grad_norm"] == pytest.approx(with_copy["trainer/grad_norm"], rel=1e-6)
