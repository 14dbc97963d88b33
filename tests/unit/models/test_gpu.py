"""CUDA paths: engine/trainer logprob parity, greedy = HF generate, bf16 training, KV cache on device.

Skipped where torch sees no CUDA device (see ``tests/conftest.py``).
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers import assert_greedy_matches_hf_generate, prompts
from trine.algorithms import PRESETS
from trine.config import TrainerConfig
from trine.models import load_model
from trine.models.batching import collate, forward_logprobs
from trine.models.engine import HFEngine
from trine.trainer import Trainer
from trine.types import Experience, SamplingParams

pytestmark = pytest.mark.gpu


def _experiences(engine, tokenizer, n: int = 4, max_tokens: int = 16) -> list[Experience]:
    requests = [(p, SamplingParams(temperature=1.0, max_tokens=max_tokens, n=n)) for p in prompts(tokenizer)]
    out = []
    for i, completions in enumerate(engine.generate_batch(requests)):
        for j, c in enumerate(completions):
            out.append(
                Experience(
                    tokens=c.prompt_ids + c.response_ids,
                    prompt_length=len(c.prompt_ids),
                    action_mask=[1] * len(c.response_ids),
                    logprobs=c.logprobs,
                    reward=float(j % 2),
                    group_id=str(i),
                )
            )
    return out


def test_cuda_engine_logprobs_match_the_trainers_recomputation(tiny_model_dir, tokenizer):
    model = load_model(tiny_model_dir, dtype="float32", device="cuda")
    assert model.device.type == "cuda"
    engine = HFEngine(model, tokenizer, seed=0)
    try:
        experiences = _experiences(engine, tokenizer)
    finally:
        engine.close()
    batch = collate(experiences, list(range(len(experiences))), tokenizer.pad_token_id, "cuda")
    with torch.no_grad():
        logprobs, _ = forward_logprobs(model, batch)
    mask = batch.action_mask.bool()
    torch.testing.assert_close(logprobs[mask], batch.old_logprobs[mask], atol=2e-4, rtol=0)


def test_cuda_greedy_equals_hf_generate(tiny_model_dir, tokenizer):
    model = load_model(tiny_model_dir, dtype="float32", device="cuda")
    engine = HFEngine(model, tokenizer, seed=0)
    try:
        for prompt in prompts(tokenizer):
            assert_greedy_matches_hf_generate(engine, model, tokenizer, prompt)
    finally:
        engine.close()


def test_cuda_bf16_trainer_step_matches_float32_and_updates(tiny_model_dir, tokenizer):
    """``dtype: auto`` is bf16 on CUDA; one GRPO step there tracks the float32 step closely."""
    bf16 = load_model(tiny_model_dir, dtype="auto", device="cuda")
    assert next(bf16.parameters()).dtype == torch.bfloat16
    engine = HFEngine(bf16, tokenizer, seed=0)
    try:
        experiences = _experiences(engine, tokenizer, n=8)
    finally:
        engine.close()
    fp32 = load_model(tiny_model_dir, dtype="float32", device="cuda")
    stats = {}
    for name, model in (("bf16", bf16), ("fp32", fp32)):
        before = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
        trainer = Trainer(model, PRESETS["grpo"], TrainerConfig(lr=1e-3), pad_token_id=tokenizer.pad_token_id)
        stats[name] = trainer.step(experiences)
        moved = max(float((v.float() - before[k]).abs().max()) for k, v in model.state_dict().items())
        assert moved > 1e-4, f"{name}: the optimizer step changed nothing"
        assert torch.isfinite(torch.tensor(stats[name]["trainer/loss"]))
    assert stats["bf16"]["trainer/loss"] == pytest.approx(stats["fp32"]["trainer/loss"], abs=0.05)
    assert stats["bf16"]["trainer/entropy"] == pytest.approx(stats["fp32"]["trainer/entropy"], rel=0.02)


def test_cuda_batched_sampling_is_seeded_and_concurrent_requests_share_a_batch(tiny_model_dir, tokenizer):
    model = load_model(tiny_model_dir, dtype="float32", device="cuda")
    params = SamplingParams(temperature=1.0, max_tokens=24, n=16, seed=7)
    runs = []
    for _ in range(2):
        engine = HFEngine(model, tokenizer, seed=0, max_batch_size=64)
        try:
            runs.append(
                [
                    [c.response_ids for c in cs]
                    for cs in engine.generate_batch([(p, params) for p in prompts(tokenizer)])
                ]
            )
        finally:
            engine.close()
    assert runs[0] == runs[1]
    assert len({tuple(r) for r in runs[0][1]}) > 1  # 16 samples of one prompt differ
