"""Engine overhead: Trine's rollout engine vs a raw ``model.generate`` call, and batching across workflows.

1. Same batch, same sampling (temperature 1, top-k off, fixed length: eos ignored on both sides):
   tokens/s of ``HFEngine.generate_batch`` vs ``model.generate(do_sample=True)``. Target >= 0.95x.
2. 64 concurrent workflows each awaiting one completion vs one batched request of 64 prompts.
   Target >= 0.8x of the batched tokens/s.

Usage: python benchmarks/engine.py [--preset tiny-5m] [--rounds 7] [--device cpu|cuda] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio

import torch
from common import alternate, markdown_table, median, report, threads, timed, tiny_model

from trine.models import load_model, load_tokenizer
from trine.models.engine import HFEngine
from trine.types import SamplingParams


def prompts(tokenizer, engine: HFEngine, n: int) -> list[list[int]]:
    return [engine.encode_chat([{"role": "user", "content": f"{i % 10}+{(i * 7) % 10}="}]) for i in range(n)]


def raw_generate(model, tokenizer, batch: list[list[int]], max_tokens: int) -> None:
    from transformers import GenerationConfig

    width = max(len(p) for p in batch)
    ids = torch.full((len(batch), width), tokenizer.pad_token_id, device=model.device)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(batch):
        ids[i, width - len(p) :] = torch.tensor(p, device=model.device)
        mask[i, width - len(p) :] = 1
    config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_tokens,
        min_new_tokens=max_tokens,
        eos_token_id=None,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    assert out.shape[1] - width == max_tokens


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="tiny-5m")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda on a GPU machine (float32 both sides)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    threads(2)
    path = tiny_model(args.preset)
    model, tokenizer = load_model(path, device=args.device), load_tokenizer(path)
    engine = HFEngine(model, tokenizer, seed=0)
    T = args.max_tokens
    params = SamplingParams(temperature=1.0, top_k=0, max_tokens=T, ignore_eos=True)

    rows = []
    for batch_size, T in ((8, args.max_tokens), (32, args.max_tokens), (64, args.max_tokens), (32, 256)):
        params = SamplingParams(temperature=1.0, top_k=0, max_tokens=T, ignore_eos=True)
        batch = prompts(tokenizer, engine, batch_size)
        times = alternate(
            {
                # on the engine's worker thread, where Trine's sampling runs (HFEngine.call)
                "raw": lambda b=batch, n=T: timed(lambda: engine.call(raw_generate, model, tokenizer, b, n)),
                "trine": lambda b=batch, s=params: timed(lambda: engine.generate_batch([(p, s) for p in b])),
            },
            rounds=args.rounds,
        )
        raw, trine = (batch_size * T / median(times[k]) for k in ("raw", "trine"))
        rows.append(
            [
                f"batch {batch_size} x {T} tokens",
                f"{raw:.0f}",
                f"{trine:.0f}",
                f"{trine / raw:.2f}x",
                "≥ 0.95x",
            ]
        )

    T = args.max_tokens
    params = SamplingParams(temperature=1.0, top_k=0, max_tokens=T, ignore_eos=True)
    batch = prompts(tokenizer, engine, 64)

    async def concurrent() -> None:
        await asyncio.gather(*(engine.generate(p, params) for p in batch))

    times = alternate(
        {
            "batched": lambda: timed(lambda: engine.generate_batch([(p, params) for p in batch])),
            "concurrent": lambda: timed(lambda: asyncio.run(concurrent())),
        },
        rounds=args.rounds,
    )
    one, many = (64 * T / median(times[k]) for k in ("batched", "concurrent"))
    rows.append(
        ["64 workflows x 1 vs 1 request x 64", f"{one:.0f}", f"{many:.0f}", f"{many / one:.2f}x", "≥ 0.8x"]
    )
    table = markdown_table(["workload", "reference tok/s", "trine tok/s", "ratio", "target"], rows)
    report(
        f"Engine overhead ({args.preset}, {args.device})",
        table,
        "Reference: raw `model.generate(do_sample=True, top_k=0)` for rows 1-3; one batched request for row 4. "
        "Medians of alternating rounds.",
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
