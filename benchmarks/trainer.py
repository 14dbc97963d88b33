"""Trainer overhead: Trine's trainer step vs a raw forward/backward/AdamW loop, and padding waste.

The batch: 64 sequences (8-token prompt + response) with total lengths drawn uniformly from 16-256.
- raw (same micro-batches): a hand-written loop over exactly the micro-batches Trine plans
  (padded batch, forward, token-mean NLL on the response, backward, AdamW) — measures the framework's
  own overhead. Target: Trine >= 0.9x its real-tokens/s.
- raw (naive): fixed-size micro-batches in arrival order, padded to their longest row — what the
  bucketing saves.
- padding waste = pad tokens / all tokens processed, with Trine's length bucketing. Target <= 15%.

Usage: python benchmarks/trainer.py [--preset tiny-5m] [--rounds 5] [--no-write]
"""

from __future__ import annotations

import argparse
import random

import torch
from common import alternate, markdown_table, median, report, threads, timed, tiny_model

from trine.algorithms import PRESETS
from trine.config import TrainerConfig
from trine.models import load_model
from trine.trainer import Trainer, plan_micro_batches
from trine.types import Experience


def make_batch(n: int, seed: int, vocab: int) -> list[Experience]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        total = rng.randint(16, 256)
        tokens = [rng.randrange(3, vocab) for _ in range(total)]
        r = total - 8
        out.append(
            Experience(
                tokens=tokens,
                prompt_length=8,
                action_mask=[1] * r,
                logprobs=[-1.0] * r,
                reward=float(i % 2),
                group_id=str(i // 8),
                info={"temperature": 1.0},
            )
        )
    return out


def raw_step(model, optimizer, batches: list[list[Experience]]) -> int:
    """Padded forward/backward/AdamW over the given micro-batches; returns real tokens."""
    total_resp = sum(e.response_length for b in batches for e in b)
    real = 0
    for rows in batches:
        width = max(len(e.tokens) for e in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        attn = torch.zeros_like(ids)
        labels = torch.full_like(ids, -100)
        for i, e in enumerate(rows):
            ids[i, : len(e.tokens)] = torch.tensor(e.tokens)
            attn[i, : len(e.tokens)] = 1
            labels[i, e.prompt_length : len(e.tokens)] = torch.tensor(e.response_tokens)
            real += len(e.tokens)
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        loss = (
            torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]),
                labels[:, 1:].reshape(-1),
                ignore_index=-100,
                reduction="sum",
            )
            / total_resp
        )
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return real


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="tiny-5m")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--budget", type=int, default=4096, help="padded tokens per micro-batch")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    threads(2)
    path = tiny_model(args.preset)
    exps = make_batch(args.batch, seed=0, vocab=load_model(path).config.vocab_size)
    real_tokens = sum(len(e.tokens) for e in exps)

    trine_model, raw_model, naive_model = (load_model(path) for _ in range(3))
    trainer = Trainer(
        trine_model, PRESETS["grpo"], TrainerConfig(lr=1e-5, micro_batch_tokens=args.budget), pad_token_id=0
    )
    plan = plan_micro_batches([len(e.tokens) for e in exps], args.budget)
    same = [[exps[i] for i in p] for p in plan]
    per = max(1, len(exps) // len(plan))
    naive = [exps[i : i + per] for i in range(0, len(exps), per)]
    raw_opt = torch.optim.AdamW(raw_model.parameters(), lr=1e-5)
    naive_opt = torch.optim.AdamW(naive_model.parameters(), lr=1e-5)
    raw_model.train()
    naive_model.train()
    waste = {}

    def trine_side() -> float:
        m = trainer.step(exps)
        waste["trine"] = m["trainer/padding_fraction"]
        return real_tokens / m["time/train_seconds"]

    times = alternate(
        {
            "trine": trine_side,
            "raw": lambda: real_tokens / timed(lambda: raw_step(raw_model, raw_opt, same)),
            "naive": lambda: real_tokens / timed(lambda: raw_step(naive_model, naive_opt, naive)),
        },
        rounds=args.rounds,
    )
    trine, raw, nai = (median(times[k]) for k in ("trine", "raw", "naive"))

    def pad_fraction(batches) -> float:
        padded = sum(len(b) * max(len(e.tokens) for e in b) for b in batches)
        return 1 - real_tokens / padded

    rows = [
        ["raw loop, same micro-batches", f"{raw:.0f}", f"{trine:.0f}", f"{trine / raw:.2f}x", "≥ 0.9x"],
        ["raw loop, naive micro-batches", f"{nai:.0f}", f"{trine:.0f}", f"{trine / nai:.2f}x", "-"],
        ["padding waste: trine bucketing", "-", f"{100 * waste['trine']:.1f}%", "-", "≤ 15%"],
        ["padding waste: naive", "-", f"{100 * pad_fraction(naive):.1f}%", "-", "-"],
    ]
    table = markdown_table(["comparison", "reference real tok/s", "trine", "ratio", "target"], rows)
    report(
        f"Trainer overhead ({args.preset}, {args.batch} sequences of 16-256 tokens, budget {args.budget}, CPU)",
        table,
        f"{len(plan)} micro-batches; Trine's step is a GRPO/PPO-clip step with the entropy metric on. "
        "Medians of alternating rounds.",
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
