"""Scaling curve: GRPO step time vs group size and vs response length (tiny-1m and tiny-5m, CPU).

Each point runs the real loop (4 prompts per step, fixed-length responses: eos ignored) and
reports the median ``time/step_seconds`` (explore + train) of the steps after the first, plus its
split into exploring and training, so users can see how cost grows with work.

Usage: python benchmarks/scaling.py [--steps 4] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from common import ROOT, markdown_table, median, report, threads, tiny_model

from trine.config import validate_dict
from trine.loop import run


def step_time(preset: str, group: int, length: int, steps: int) -> tuple[float, float, float]:
    run_dir = Path(tempfile.mkdtemp(prefix="trine-scaling-"))
    cfg = {
        "name": "scaling",
        "run_dir": str(run_dir),
        "seed": 0,
        "num_threads": 2,
        "resume": False,
        "model": {"path": str(tiny_model(preset))},
        "tasks": {
            "batch_size": 4,
            "total_steps": steps,
            "train": {
                "path": str(ROOT / "examples/arithmetic/data/train.jsonl"),
                "repeat": group,
                "sampling": {"temperature": 1.0, "max_tokens": length, "ignore_eos": True},
            },
        },
        "trainer": {"lr": 1e-5, "keep_checkpoints": 1},
        "eval": {"at_start": False},
        "monitor": {"sinks": ["jsonl"], "plot": False},
    }
    stages, errors = validate_dict(cfg)
    assert not errors, errors
    run(stages)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()][1:]
    return tuple(
        median([r[k] for r in rows])
        for k in ("time/step_seconds", "time/explore_seconds", "time/train_seconds")
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--presets", default="tiny-1m,tiny-5m")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    threads(2)
    rows = []
    for preset in args.presets.split(","):
        for group in (4, 8, 16, 32, 64):
            total, explore, train = step_time(preset, group, 32, args.steps)
            rows.append([preset, group, 32, 4 * group * 32, f"{total:.3f}", f"{explore:.3f}", f"{train:.3f}"])
        for length in (16, 64, 128, 256):
            total, explore, train = step_time(preset, 8, length, args.steps)
            rows.append([preset, 8, length, 4 * 8 * length, f"{total:.3f}", f"{explore:.3f}", f"{train:.3f}"])
    table = markdown_table(
        ["preset", "group size", "response tokens", "tokens/step", "s/step", "explore s", "train s"], rows
    )
    report(
        "Scaling: GRPO step time vs group size and response length (4 prompts/step, CPU)",
        table,
        f"Median of steps 2..{args.steps} of the real loop; responses run to the length limit (eos ignored).",
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
