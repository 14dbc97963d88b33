"""The trainer's scale settings side by side: tokens/s and peak memory of one GRPO step per setting.

Settings (``trainer:``): the model's own dtype (fp32), ``precision: bf16`` (autocast over fp32 master
weights), + ``gradient_checkpointing``, + ``packed``, ``lora`` (rank 16) and ``fsdp`` (one process). The
batch is ragged (responses of 32-256 tokens after 128-token prompts) so packing has padding to skip.
Each setting runs alone on the device (a warm-up step, then the median of ``--steps``), so its peak
memory is its own; ratios are against fp32 in the same run.

On a CUDA GPU the model is Qwen2-0.5B-shaped (random weights, no download); elsewhere it is the
``tiny-5m`` preset, which checks the script and the settings rather than measuring speed.

Usage: python benchmarks/gpu_trainer.py [--steps 3] [--no-write]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
from common import markdown_table, report, tiny_model

SETTINGS = {
    "fp32": {},
    "bf16": {"precision": "bf16"},
    "bf16 + checkpointing": {"precision": "bf16", "gradient_checkpointing": True},
    "bf16 + checkpointing + packed": {"precision": "bf16", "gradient_checkpointing": True, "packed": True},
    "bf16 + LoRA r16": {"precision": "bf16", "lora": {"rank": 16, "alpha": 32.0, "dropout": 0.0, "target_modules": "all-linear"}},
    "bf16 + FSDP2 (1 process)": {"precision": "bf16", "fsdp": True},
}  # fmt: skip


def build_model(on_gpu: bool):
    """The Qwen2-0.5B-shaped model of ``gpu.py`` in float32 (master weights) on a GPU, else tiny-5m."""
    from gpu import build_model as qwen_shaped

    from trine.models import load_model

    return qwen_shaped(torch.float32) if on_gpu else load_model(tiny_model("tiny-5m"))


def batch(vocab: int, rows: int, rng: random.Random):
    from trine.types import Experience

    out = []
    for i in range(rows):
        response = rng.choice([32, 64, 128, 256])
        out.append(
            Experience(
                tokens=[rng.randrange(3, vocab) for _ in range(128 + response)],
                prompt_length=128,
                action_mask=[1] * response,
                logprobs=[-1.0] * response,
                reward=float(i % 2),
                group_id=str(i // 8),
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    from trine.algorithms import PRESETS
    from trine.config import TrainerConfig
    from trine.trainer import Trainer
    from trine.trainer.policy import prepare_policy

    on_gpu = torch.cuda.is_available()
    experiences = None
    rows, base = [], None
    for name, s in SETTINGS.items():  # one setting on the device at a time: its own peak memory
        model = prepare_policy(
            build_model(on_gpu),
            lora=s.get("lora"),
            gradient_checkpointing=s.get("gradient_checkpointing", False),
            fsdp=s.get("fsdp", False),
        )
        settings = TrainerConfig(
            lr=1e-6,
            micro_batch_tokens=16384 if on_gpu else 2048,
            precision=s.get("precision", "fp32"),
            packed=s.get("packed", False),
        )
        trainer = Trainer(model, PRESETS["grpo"], settings, pad_token_id=0)
        if experiences is None:
            experiences = batch(model.config.vocab_size, args.rows, random.Random(0))
        tokens = sum(len(e.tokens) for e in experiences)
        trainer.step(experiences)  # warm-up
        if on_gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(args.steps):
            start = time.perf_counter()
            trainer.step(experiences)
            if on_gpu:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        rate = tokens / statistics.median(times)
        base = base or rate
        peak = f"{torch.cuda.max_memory_allocated() / 2**30:.1f}" if on_gpu else "-"
        trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
        rows.append([name, f"{trained / 1e6:.1f}M", f"{rate:,.0f}", f"{rate / base:.2f}x", peak])
        del trainer, model
        if on_gpu:
            torch.cuda.empty_cache()
    where = torch.cuda.get_device_name(0) if on_gpu else "CPU (tiny-5m: checks the settings, not their speed)"
    report(
        f"Trainer settings side by side ({where})",
        markdown_table(["setting", "trained params", "tokens/s", "vs fp32", "peak GiB"], rows),
        f"GRPO step on {args.rows} rows ({tokens} tokens, responses 32-256 after 128-token prompts); median of "
        f"{args.steps} steps after a warm-up, one setting at a time. Command: `python benchmarks/gpu_trainer.py`.",
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
