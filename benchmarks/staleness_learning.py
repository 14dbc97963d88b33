"""The learning row of the modes table: does training on stale experiences cost accuracy?

Issue 11's target: on the arithmetic task, async with ``buffer.max_staleness`` 1–2 reaches an avg@8 within
5 points of sync for the same number of steps. Every wiring starts from the same SFT warm-up of tiny-1m
(the main job's first stage, 200 steps) and runs ``--steps`` GRPO steps (16 tasks × 8 samples, SQLite
buffer), evaluated (avg@8 on the shipped eval set) at the start and at the end, for seeds ``--seeds``:

- ``sync`` (``sync_interval: 1``);
- ``async, one process`` (explorer thread, ``max_staleness``);
- ``async, processes`` (``trine train`` + ``trine explore``, ``max_staleness``).

Prints final avg@8 per seed, the mean, and the difference to sync.

Usage: python benchmarks/staleness_learning.py [--steps 50] [--seeds 0,1,2] [--staleness 1] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from common import ROOT, markdown_table, report, threads, tiny_model

from trine.config import load_config
from trine.loop import run

EXAMPLE = ROOT / "examples" / "arithmetic" / "data"
KEY = "eval/addition/avg@8"


def sft_start(root: Path) -> Path:
    """tiny-1m after 200 SFT steps on the arithmetic answers (the main job's warm-up)."""
    cfg = {
        "name": "sft",
        "run_dir": str(root / "sft"),
        "seed": 0,
        "num_threads": 2,
        "mode": "train",
        "model": {"path": str(tiny_model("tiny-1m"))},
        "algorithm": {"name": "sft"},
        "tasks": {"batch_size": 16, "total_steps": 200, "train": {"path": str(EXAMPLE / "train.jsonl")}},
        "trainer": {"lr": 3e-3},
        "eval": {"at_start": False},
        "monitor": {"sinks": ["jsonl"], "plot": False},
    }
    path = root / "sft.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run(load_config(path))
    return root / "sft" / "checkpoints" / "step_200"


def learn(root: Path, start: Path, wiring: str, seed: int, steps: int, staleness: int) -> list[float]:
    """avg@8 at the start and after ``steps`` GRPO steps of one wiring and seed."""
    run_dir = root / f"{wiring}-{seed}"
    sampling = {"temperature": 1.0, "max_tokens": 6}
    cfg = {
        "name": wiring,
        "run_dir": str(run_dir),
        "seed": seed,
        "num_threads": 2,
        "model": {"path": str(start)},
        "tasks": {
            "batch_size": 16,
            "total_steps": steps,
            "train": {"path": str(EXAMPLE / "train.jsonl"), "repeat": 8, "sampling": sampling},
            "eval": [{"name": "addition", "path": str(EXAMPLE / "eval.jsonl"), "sampling": sampling}],
        },
        "trainer": {"lr": 1e-3},
        "buffer": {"storage": "sql"},
        "eval": {"every": steps, "k": 8, "at_start": True},
        "monitor": {"sinks": ["jsonl"], "plot": False},
    }
    if wiring != "sync":
        cfg.update(mode="async", launch="thread" if wiring == "async" else "processes")
        cfg["buffer"]["max_staleness"] = staleness
    path = root / f"{wiring}-{seed}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    if wiring == "processes":
        subprocess.run([sys.executable, "-m", "trine.cli", "run", str(path)], check=True, capture_output=True)
    else:
        run(load_config(path))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r[KEY] for r in rows if KEY in r]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--staleness", type=int, default=1, help="buffer.max_staleness of the async rows")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    threads(2)
    seeds = [int(s) for s in args.seeds.split(",")]
    root = Path(tempfile.mkdtemp(prefix="trine-staleness-"))
    start = sft_start(root)
    names = {"sync": "sync (sync_interval 1)", "async": "async, one process", "processes": "async, processes"}
    final: dict[str, list[float]] = {}
    for wiring in names:
        final[wiring] = [learn(root, start, wiring, s, args.steps, args.staleness)[-1] for s in seeds]
    base = statistics.fmean(final["sync"])
    rows = [
        [
            label,
            " / ".join(f"{v:.3f}" for v in final[w]),
            f"{statistics.fmean(final[w]):.3f}",
            f"{100 * (statistics.fmean(final[w]) - base):+.1f}",
        ]
        for w, label in names.items()
    ]
    table = markdown_table(["wiring", "final avg@8 per seed", "mean", "vs sync (points)"], rows)
    report(
        f"Learning with staleness (arithmetic, tiny-1m after SFT, {args.steps} GRPO steps, "
        f"async max_staleness {args.staleness}, seeds {args.seeds})",
        table,
        "Target: async within 5 points of sync for the same number of steps.",
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
