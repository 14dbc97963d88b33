"""Modes on a long-tailed environment: the shape of the Trinity-RFT report's Table 1, on CPU.

A simulated environment (``benchmarks/slow_env.py``) makes every task wait a log-normal time before the
model answers (median ``--latency`` seconds, shape ``--sigma``): most tasks are quick, a few are very
slow, and a batch explored as a whole is as slow as its slowest task. Rows, all training ``--steps``
steps on the same tasks:

- ``sync_interval`` 1 and 10 (colocated; the interval's batches are explored concurrently);
- ``sync_offset=1`` (an explorer thread one batch ahead, from a weight snapshot);
- ``async`` in one process (an explorer thread streams: ``explorer.oversample`` × batch tasks in flight,
  a batch is the first ``tasks.batch_size`` to finish), ``buffer.max_staleness`` ``--staleness``;
- ``async`` as processes (``trine run`` with ``launch: processes``: ``trine train`` + ``trine explore``,
  each role on its own cores), with one and with two explorers, streaming like the one-process explorer;
- ``async`` on Ray (a local one-node cluster: trainer, buffer writer and explorer actors).

Wall time is the trainer's: the sum of ``time/step_seconds`` from step ``WARMUP + 1`` (5) to the last
(model loading, process start-up and the explorers' head start excluded, the same for every row). Explorer idle = 1 − explore time / wall
(async: the time it held back for the staleness bound / wall); trainer idle = 1 − train time / wall;
staleness = mean ``buffer/staleness_mean``. Modes alternate over ``--rounds`` rounds; medians reported.
The environment latencies are identical across modes (seeded per task and visit).

The learning rows (async with staleness 1–2 within 5 points of sync on arithmetic, and the wall-clock to a
target avg@8 per wiring) are their own script,
``benchmarks/staleness_learning.py``: it trains for accuracy, not for wall time.

Usage: python benchmarks/modes.py [--steps 30] [--latency 0.2] [--sigma 1.0] [--rounds 2] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import slow_env  # noqa: F401 - registers the workflow
import yaml
from common import ROOT, markdown_table, median, report, threads, tiny_model

from trine.config import validate_dict
from trine.loop import run

PLUGIN = Path(__file__).with_name("slow_env.py")
WARMUP = 5
"""Steps left out of the wall time: while the trainer loads and takes its first steps an async explorer
fills the buffer up to the staleness bound, a head start that a short run would count as speed."""


def config(run_dir: Path, steps: int, latency: float, sigma: float, **mode: dict) -> dict:
    base = {
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
        "eval": {"at_start": False},
        "monitor": {"sinks": ["jsonl"], "plot": False},
    }
    return {**base, **mode}


def measure(steps: int, latency: float, sigma: float, mode: dict) -> dict[str, float]:
    run_dir = Path(tempfile.mkdtemp(prefix="trine-modes-"))
    data = config(run_dir, steps, latency, sigma, **mode)
    if mode.get("launch") == "processes" or "cluster" in mode:  # `trine run` starts the processes
        path = run_dir.with_suffix(".yaml")
        path.write_text(yaml.safe_dump(data))
        cmd = [sys.executable, "-m", "trine.cli", "run", str(path), "--plugin", str(PLUGIN)]
        env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
        subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT, env=env)
    else:
        stages, errors = validate_dict(data)
        assert not errors, errors
        run(stages)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps_rows = [r for r in rows if "trainer/loss" in r or "trainer/empty_batch" in r]
    steps_rows = sorted(steps_rows, key=lambda r: r["step"])[
        WARMUP:
    ]  # an explorer fills the buffer meanwhile
    wall = sum(r.get("time/step_seconds", 0.0) for r in steps_rows)
    train = sum(r.get("time/train_seconds", 0.0) for r in steps_rows)
    if mode.get("mode") == "async":  # the explorer streams: idle = held back for the staleness bound
        explorer_files = sorted(run_dir.glob("explorers/*/metrics.jsonl")) or [run_dir / "metrics.jsonl"]
        paced = [
            sum(json.loads(line).get("explorer/paced_seconds", 0.0) for line in f.read_text().splitlines())
            for f in explorer_files
        ]
        explorer_idle = sum(paced) / len(paced) / wall
    else:
        explorer_idle = 1 - sum(r.get("time/explore_seconds", 0.0) for r in steps_rows) / wall
    staleness = [r["buffer/staleness_mean"] for r in steps_rows if "buffer/staleness_mean" in r]
    return {
        "wall": wall,
        "explorer_idle": min(1.0, max(0.0, explorer_idle)),
        "trainer_idle": max(0.0, 1 - train / wall),
        "staleness": sum(staleness) / len(staleness) if staleness else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--latency", type=float, default=0.2, help="median environment latency (s)")
    parser.add_argument("--sigma", type=float, default=1.0, help="log-normal shape: larger = longer tail")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--staleness", type=int, default=4, help="buffer.max_staleness of the async rows")
    parser.add_argument(
        "--oversample", type=float, default=3.0, help="explorer.oversample of async in one process"
    )
    parser.add_argument(
        "--only", default="", help="comma-separated parts of mode names to run (and sync_interval=1)"
    )
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    threads(2)
    stale = {"max_staleness": args.staleness}
    streams = {"oversample": args.oversample}
    processes = {
        "mode": "async",
        "launch": "processes",
        "num_threads": "auto",  # each role its own cores (trine.threads.role_cores)
        "buffer": {"storage": "sql", **stale},
        "explorer": streams,
    }
    ray = {
        "mode": "async",
        "num_threads": "auto",
        "cluster": {"backend": "ray", "num_cpus": 2},
        "buffer": {"storage": "sql", **stale},
        "explorer": streams,
    }
    modes = {
        "sync_interval=1": {},
        "sync_interval=10": {"sync": {"sync_interval": 10}},
        "sync_offset=1": {"sync": {"sync_offset": 1}},
        "async, one process": {"mode": "async", "buffer": stale, "explorer": streams},
        "async, explore + train processes": processes,
        "async, 2 explorers + trainer": {**processes, "explorer": {**streams, "instances": 2}},
        "async, Ray (one node)": ray,
    }
    if args.only:
        modes = {
            k: v
            for k, v in modes.items()
            if k == "sync_interval=1" or any(o in k for o in args.only.split(","))
        }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in modes}
    for _ in range(args.rounds):
        for name, mode in modes.items():
            results[name].append(measure(args.steps, args.latency, args.sigma, mode))
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
                f"{median([r['staleness'] for r in runs]):.2f}",
            ]
        )
    headers = [
        "mode",
        f"wall s (steps {WARMUP + 1}-{args.steps})",
        "speedup",
        "explorer idle",
        "trainer idle",
        "staleness",
    ]
    table = markdown_table(headers, rows)
    report(
        f"Modes, long-tailed environment (tiny-1m, 8 tasks x 8 samples, latency median {args.latency}s, "
        f"sigma {args.sigma}; async: max_staleness {args.staleness}, one process oversample {args.oversample})",
        table,
        f"Medians of {args.rounds} alternating rounds. Wall = the trainer's step time summed after its first {WARMUP} steps. "
        "Idle = 1 - busy time / wall (async explorer: time held back for the staleness bound / wall).",
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
