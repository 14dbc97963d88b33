"""Sync modes on a long-tailed environment: the shape of the Trinity-RFT report's Table 1, on CPU.

A simulated environment makes every task wait a log-normal time before the model answers
(median ``--latency`` seconds, shape ``--sigma``): most tasks are quick, a few are very slow, and
a batch is as slow as its slowest task. Rows: ``sync_interval`` 1, 2, 10 (colocated: the interval's
batches are explored concurrently, one long tail instead of one per batch) and ``sync_offset=1``
(the explorer runs one batch ahead in a thread from a weight snapshot). For each: wall time of
``--steps`` steps, speedup vs sync_interval=1, and the fraction of the wall time the explorer and the
trainer were idle. Modes alternate over ``--rounds`` rounds; medians are reported. The environment
latencies are identical across modes (seeded per task and visit).

Usage: python benchmarks/modes.py [--steps 30] [--latency 0.2] [--sigma 1.0] [--rounds 2] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import tempfile
import time
from pathlib import Path

from common import ROOT, markdown_table, median, report, threads, tiny_model

from trine.config import validate_dict
from trine.loop import run
from trine.registry import register
from trine.workflows import SingleTurnWorkflow


@register("workflow", "slow_env")
class SlowEnvironment(SingleTurnWorkflow):
    """Single-turn workflow behind an environment with log-normal latency."""

    def __init__(self, reward, latency: float = 0.2, sigma: float = 1.0) -> None:
        super().__init__(reward)
        self.mu, self.sigma = math.log(latency), sigma
        self.visits: dict[str, int] = {}

    async def run(self, task, model):
        visit = self.visits[task.task_id] = self.visits.get(task.task_id, 0) + 1
        delay = random.Random(f"{task.task_id}/{visit}").lognormvariate(self.mu, self.sigma)
        await asyncio.sleep(delay)
        return await super().run(task, model)


def config(run_dir: Path, steps: int, interval: int, offset: int, latency: float, sigma: float) -> dict:
    return {
        "name": "modes",
        "run_dir": str(run_dir),
        "seed": 0,
        "num_threads": 2,
        "resume": False,
        "model": {"path": str(tiny_model("tiny-1m"))},
        "tasks": {
            "batch_size": 8,
            "total_steps": steps,
            "train": {
                "path": str(ROOT / "examples/arithmetic/data/train.jsonl"),
                "repeat": 8,
                "workflow": "slow_env",
                "workflow_args": {"latency": latency, "sigma": sigma},
                "sampling": {"temperature": 1.0, "max_tokens": 8},
            },
        },
        "trainer": {"lr": 1e-4, "keep_checkpoints": 1},
        "sync": {"sync_interval": interval, "sync_offset": offset},
        "eval": {"at_start": False},
        "monitor": {"sinks": ["jsonl"], "plot": False},
    }


def measure(steps: int, interval: int, offset: int, latency: float, sigma: float) -> dict[str, float]:
    run_dir = Path(tempfile.mkdtemp(prefix="trine-modes-"))
    stages, errors = validate_dict(config(run_dir, steps, interval, offset, latency, sigma))
    assert not errors, errors
    start = time.perf_counter()
    run(stages)
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    explore = sum(r.get("time/explore_seconds", 0.0) for r in rows)
    train = sum(r.get("time/train_seconds", 0.0) for r in rows)
    return {
        "wall": wall,
        "explorer_idle": max(0.0, 1 - explore / wall),
        "trainer_idle": max(0.0, 1 - train / wall),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--latency", type=float, default=0.2, help="median environment latency (s)")
    parser.add_argument("--sigma", type=float, default=1.0, help="log-normal shape: larger = longer tail")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    threads(2)
    modes = {
        "sync_interval=1": (1, 0),
        "sync_interval=2": (2, 0),
        "sync_interval=10": (10, 0),
        "sync_offset=1": (1, 1),
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in modes}
    for _ in range(args.rounds):
        for name, (k, m) in modes.items():
            results[name].append(measure(args.steps, k, m, args.latency, args.sigma))
    base = median([r["wall"] for r in results["sync_interval=1"]])
    rows = []
    for name, runs in results.items():
        wall = median([r["wall"] for r in runs])
        rows.append(
            [
                name,
                f"{wall:.1f}",
                f"{base / wall:.2f}x",
                f"{100 * median([r['explorer_idle'] for r in runs]):.0f}%",
                f"{100 * median([r['trainer_idle'] for r in runs]):.0f}%",
            ]
        )
    table = markdown_table(
        ["mode", f"wall s ({args.steps} steps)", "speedup", "explorer idle", "trainer idle"], rows
    )
    report(
        f"Sync modes, long-tailed environment (tiny-1m, 8 tasks x 8 samples, latency median {args.latency}s, sigma {args.sigma})",
        table,
        f"Medians of {args.rounds} alternating rounds. Idle = 1 - busy time / wall time.",
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
