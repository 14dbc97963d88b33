"""Top-k / top-p replay (engine and trainer share one truncation) and the rollout correction (TIS / MIS)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import torch

from tests.helpers import shifted_experiences
from trine.algorithms import PRESETS, correction_metrics, rollout_correction
from trine.config import TrainerConfig, validate_dict
from trine.models import load_model, load_tokenizer
from trine.models.batching import collate, forward_logprobs
from trine.models.engine import HFEngine
from trine.models.sampling import kept_set, truncated_logprobs
from trine.trainer import Trainer
from trine.types import Experience, SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_kept_set_per_row_matches_scalar_settings():
    logp = torch.log_softmax(torch.randn(4, 50, generator=torch.Generator().manual_seed(0)), -1)
    ks, ps = torch.tensor([0, 5, 0, 3]), torch.tensor([1.0, 1.0, 0.7, 0.9])
    rows = kept_set(logp, ks, ps)
    for i in range(4):
        assert torch.equal(rows[i], kept_set(logp[i : i + 1], int(ks[i]), float(ps[i]))[0])
    assert rows[0].all() and int(rows[1].sum()) == 5 and int(rows[3].sum()) <= 3


def test_truncated_logprobs_renormalise_and_stay_finite_outside_the_set():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).requires_grad_()
    inside = truncated_logprobs(logits, torch.tensor([1]), 0, 0.7)  # kept: 0.5, 0.3
    assert math.isclose(float(inside[0]), math.log(0.3 / 0.8), rel_tol=1e-5)
    outside = truncated_logprobs(logits, torch.tensor([3]), 0, 0.7)  # normaliser {0, 1, 3}
    assert math.isclose(float(outside[0]), math.log(0.05 / 0.85), rel_tol=1e-5)
    outside.sum().backward()
    assert torch.isfinite(logits.grad).all() and float(logits.grad[0, 2]) == 0.0  # dropped token: no gradient


@pytest.mark.parametrize("sampling", [{"top_p": 0.8}, {"top_k": 5}, {"top_k": 8, "top_p": 0.9}])
def test_trainer_replays_the_engine_truncation(tiny_model_dir, sampling):
    """The engine reports log π_trunc; forward_logprobs on an experience carrying the explorer's
    ``info`` top_k / top_p gives the same numbers (and the untruncated ones without it)."""
    model, tokenizer = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    engine = HFEngine(model, tokenizer, max_batch_size=4, seed=0)
    params = SamplingParams(temperature=1.3, max_tokens=12, n=3, **sampling)
    try:
        completions = asyncio.run(engine.generate(tokenizer("What is 3+4?")["input_ids"], params))
    finally:
        engine.close()
    exps = [
        Experience(
            tokens=c.prompt_ids + c.response_ids,
            prompt_length=len(c.prompt_ids),
            action_mask=[1] * len(c.response_ids),
            logprobs=list(c.logprobs),
            info={"temperature": 1.3, "top_k": params.top_k, "top_p": params.top_p},
        )
        for c in completions
    ]
    batch = collate(exps, list(range(3)), tokenizer.pad_token_id, "cpu")
    with torch.no_grad():
        replayed, _ = forward_logprobs(model, batch)
        for e in exps:
            e.info.pop("top_k"), e.info.pop("top_p")
        plain, _ = forward_logprobs(model, collate(exps, list(range(3)), tokenizer.pad_token_id, "cpu"))
    mask = batch.action_mask > 0
    assert (replayed - batch.old_logprobs)[mask].abs().max() < 1e-4
    assert ((replayed - plain)[mask] >= -1e-5).all()  # renormalising over a subset raises logprobs
    assert (replayed - plain)[mask].mean() > 1e-3


def test_rollout_correction_by_hand():
    old = torch.tensor([[0.0, 0.0, 0.0], [-1.0, -1.0, 0.0]])
    rollout = torch.tensor([[-2.0, 0.5, 0.0], [-1.0, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    w, keep, sums = rollout_correction(old, rollout, mask, level="token", cap=2.0)
    assert torch.allclose(w[0], torch.tensor([2.0, math.exp(-0.5), 1.0]))  # e^2 capped at 2
    assert torch.equal(w[1], torch.tensor([1.0, 1.0, 0.0])) and keep.flatten().tolist() == [1.0, 1.0]
    assert sums["capped"] == 1 and sums["tokens"] == 5
    seq, _, _ = rollout_correction(old, rollout, mask, level="sequence", cap=10.0)
    assert torch.allclose(seq[0], torch.full((3,), math.exp(1.5)))
    _, keep, sums = rollout_correction(old, rollout, mask, level="off", mask_threshold=1.5)
    assert keep.flatten().tolist() == [0.0, 1.0]  # row 0: geometric mean e^0.5 > 1.5
    metrics = correction_metrics(sums)
    k3 = (math.exp(2) - 1 - 2) + (math.exp(-0.5) - 1 + 0.5)
    assert math.isclose(metrics["rollout_kl"], k3 / 5, rel_tol=1e-5) and metrics["rollout_masked_frac"] == 0.5


def _step(tiny_model_dir, tokenizer, shift: float, **algo) -> dict[str, float]:
    model = load_model(tiny_model_dir)
    exps = shifted_experiences(model, tokenizer, shift)
    trainer = Trainer(
        model,
        PRESETS["grpo"].with_overrides(**algo),
        TrainerConfig(grad_clip=0.0, recompute_logprobs=True),
        pad_token_id=tokenizer.pad_token_id,
    )
    return trainer.step(exps)


def test_trainer_reports_the_mismatch_and_applies_the_weights(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    same = _step(tiny_model_dir, tokenizer, 0.0)
    assert same["trainer/rollout_kl"] < 1e-6 and same["trainer/rollout_is_weight"] == pytest.approx(
        1.0, abs=1e-4
    )
    shifted = _step(tiny_model_dir, tokenizer, 1.0)  # ρ = e on every token
    assert shifted["trainer/rollout_kl"] == pytest.approx(math.e - 2, rel=1e-3)
    assert shifted["trainer/grad_norm"] == pytest.approx(
        same["trainer/grad_norm"], rel=1e-4
    )  # rollout_is off
    tis = _step(
        tiny_model_dir, tokenizer, 1.0, rollout_is="token", rollout_is_cap=2.0
    )  # weights min(e, 2) = 2
    assert tis["trainer/rollout_is_capped_frac"] == 1.0
    assert tis["trainer/grad_norm"] == pytest.approx(2 * same["trainer/grad_norm"], rel=1e-3)
    masked = _step(tiny_model_dir, tokenizer, 1.0, rollout_mask_threshold=2.0)  # e > 2: every row dropped
    assert masked["trainer/rollout_masked_frac"] == 1.0 and masked["trainer/grad_norm"] == 0.0


def test_rollout_correction_config_errors(tiny_model_dir):
    data = Path(__file__).parents[3] / "examples" / "arithmetic" / "data" / "train.jsonl"
    base = {"model": {"path": str(tiny_model_dir)}, "tasks": {"total_steps": 2, "train": {"path": str(data)}}}
    _, errors = validate_dict({**base, "algorithm": {"rollout_is": "token"}})
    assert any("trainer.recompute_logprobs: true" in e for e in errors), errors
    sft = {**base, "mode": "train", "algorithm": {"name": "sft", "rollout_mask_threshold": 2.0}}
    _, errors = validate_dict({**sft, "trainer": {"recompute_logprobs": True}})
    assert any("has no advantages" in e for e in errors), errors
    _, errors = validate_dict({**base, "algorithm": {"rollout_mask_threshold": 0.5}})
    assert errors == ["algorithm.rollout_mask_threshold: 0.5 is out of range; expected a number > 1"]
