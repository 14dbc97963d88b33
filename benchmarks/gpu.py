"""GPU throughput: trainer tokens/s and MFU, engine tokens/s (run only where a CUDA GPU exists).

Model: a randomly initialised Qwen2-0.5B-shaped causal LM (hidden 896, 24 layers, 14 heads / 2 KV
heads, MLP 4864, vocab 151936, tied embeddings) in bfloat16 — no download; the tokenizer is Trine's
tiny byte-level BPE (ids beyond its vocabulary decode to nothing, which does not affect timing).

- trainer: GRPO steps on 64 sequences of 512 tokens (256 prompt + 256 response); tokens/s and
  MFU = 6 · params · tokens/s / peak bf16 FLOP/s (``--peak-tflops``, default 989 for H100/H200 SXM dense).
- engine: batches of 64 and 256 prompts of 128 tokens, 256 new tokens each, eos ignored.

Usage: python benchmarks/gpu.py [--peak-tflops 989] [--no-write]
"""

from __future__ import annotations

import argparse
import random
import time

import torch
from common import markdown_table, report, tiny_model


def build_model(dtype: torch.dtype = torch.bfloat16):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(device="cuda", dtype=dtype)
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/gpu.py needs a CUDA GPU; nothing to measure on this machine.")
        return
    from trine.algorithms import PRESETS
    from trine.config import TrainerConfig
    from trine.models import load_tokenizer
    from trine.models.engine import HFEngine
    from trine.trainer import Trainer
    from trine.types import Experience, SamplingParams

    tokenizer = load_tokenizer(tiny_model("tiny-1m"))
    model = build_model()
    params = sum(p.numel() for p in model.parameters())
    rng = random.Random(0)
    vocab = model.config.vocab_size
    batch = [
        Experience(
            tokens=[rng.randrange(3, vocab) for _ in range(512)],
            prompt_length=256,
            action_mask=[1] * 256,
            logprobs=[-1.0] * 256,
            reward=float(i % 2),
            group_id=str(i // 8),
        )
        for i in range(64)
    ]
    trainer = Trainer(
        model, PRESETS["grpo"], TrainerConfig(lr=1e-6, micro_batch_tokens=16384), pad_token_id=0
    )
    trainer.step(batch)  # warm-up
    torch.cuda.synchronize()
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        trainer.step(batch)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    step = sorted(times)[len(times) // 2]
    tokens_per_s = 64 * 512 / step
    mfu = 6 * params * tokens_per_s / (args.peak_tflops * 1e12)
    rows = [["trainer (GRPO step, 64 x 512 tokens)", f"{tokens_per_s:,.0f}", f"{100 * mfu:.1f}%"]]

    engine = HFEngine(model, tokenizer, max_batch_size=256, seed=0)
    sampling = SamplingParams(temperature=1.0, max_tokens=256, ignore_eos=True)
    for size in (64, 256):
        prompts = [[rng.randrange(3, vocab) for _ in range(128)] for _ in range(size)]
        engine.generate_batch([(p, sampling) for p in prompts[:8]])
        torch.cuda.synchronize()
        start = time.perf_counter()
        engine.generate_batch([(p, sampling) for p in prompts])
        torch.cuda.synchronize()
        rows.append(
            [
                f"engine, batch {size} x 256 new tokens",
                f"{size * 256 / (time.perf_counter() - start):,.0f}",
                "-",
            ]
        )
    table = markdown_table(["workload", "tokens/s", "MFU"], rows)
    report(
        f"GPU throughput (Qwen2-0.5B-shaped, {params / 1e6:.0f}M params, bf16, {torch.cuda.get_device_name(0)})",
        table,
        f"Median of {args.steps} trainer steps; MFU against {args.peak_tflops} TFLOP/s.",
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
