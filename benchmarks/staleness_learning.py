"""The learning rows of the modes table: does training on stale experiences cost accuracy, and how much
wall-clock does each wiring take to reach a target accuracy?

Every wiring starts from the same SFT warm-up of tiny-1m (the main job's first stage, 200 steps) and runs
``--steps`` GRPO steps (16 tasks × 8 samples, SQLite buffer), evaluated (avg@8 on the shipped eval set) at
the start and every ``--every`` steps, for seeds ``--seeds``:

- ``sync`` (``sync_interval: 1``);
- ``async, one process`` (explorer thread, ``max_staleness``);
- ``async, processes`` (``trine train`` + ``trine explore``, ``max_staleness``);
- ``async, Ray`` (a local one-node Ray cluster: trainer, buffer writer and explorer actors).

Two tables: final avg@8 per seed against sync (issue 11: within 5 points for the same steps), and the
wall-clock to reach ``--target`` avg@8 (issue 27: async in ≤ 0.6× of sync's). Wall-clock is the trainer's
step time summed up to the first evaluation at or above the target (start-up and evaluation excluded,
the same for every wiring); a seed that never reaches it counts as its whole run and is marked ``>``.

Usage: python benchmarks/staleness_learning.py [--steps 50] [--every 10] [--target 0.35] [--seeds 0,1,2]
       [--staleness 1] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
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


def learn(
    root: Path, start: Path, wiring: str, seed: int, steps: int, staleness: int, every: int
) -> list[tuple[float, float]]:
    """``(avg@8, trainer seconds so far)`` at the start and every ``every`` of ``steps`` GRPO steps of one
    wiring and seed."""
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
        "eval": {"every": every, "k": 8, "at_start": True},
        "monitor": {"sinks": ["jsonl"], "plot": False},
    }
    if wiring != "sync":
        cfg.update(mode="async", launch="thread" if wiring == "async" else "processes")
        cfg["buffer"]["max_staleness"] = staleness
        cfg["num_threads"] = "auto"  # processes: each role its own cores
    if wiring == "ray":
        del cfg["launch"]
        cfg["cluster"] = {"backend": "ray", "num_cpus": 2}
    path = root / f"{wiring}-{seed}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    if wiring in ("processes", "ray"):
        env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
        command = [sys.executable, "-m", "trine.cli", "run", str(path)]
        subprocess.run(command, check=True, capture_output=True, cwd=ROOT, env=env)
    else:
        run(load_config(path))
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    out, seconds = [], 0.0
    for r in sorted(rows, key=lambda r: (r["step"], KEY not in r)):
        seconds += r.get("time/step_seconds", 0.0) - r.get("time/eval_seconds", 0.0)
        if KEY in r:
            out.append((r[KEY], seconds))
    return out


def time_to(curve: list[tuple[float, float]], target: float) -> tuple[float, bool]:
    """Trainer seconds to the first evaluation at or above ``target`` (reached), else the whole run's."""
    for value, seconds in curve:
        if value >= target:
            return seconds, True
    return curve[-1][1], False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--staleness", type=int, default=1, help="buffer.max_staleness of the async rows")
    parser.add_argument("--every", type=int, default=10, help="evaluate every this many steps")
    parser.add_argument("--target", type=float, default=0.35, help="avg@8 to reach (time-to-accuracy table)")
    parser.add_argument("--wirings", default="sync,async,processes,ray")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    threads(2)
    seeds = [int(s) for s in args.seeds.split(",")]
    root = Path(tempfile.mkdtemp(prefix="trine-staleness-"))
    start = sft_start(root)
    labels = {
        "sync": "sync (sync_interval 1)",
        "async": "async, one process",
        "processes": "async, processes",
        "ray": "async, Ray (one node)",
    }
    names = {w: labels[w] for w in args.wirings.split(",")}
    curves = {
        w: [learn(root, start, w, s, args.steps, args.staleness, args.every) for s in seeds] for w in names
    }
    final = {w: [c[-1][0] for c in curves[w]] for w in names}
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
    reached = {w: [time_to(c, args.target) for c in curves[w]] for w in names}
    mean = {w: statistics.fmean(t for t, _ in reached[w]) for w in names}
    rows = [
        [
            label,
            " / ".join(f"{'' if ok else '>'}{t:.0f}" for t, ok in reached[w]),
            f"{mean[w]:.0f}",
            f"{mean[w] / mean['sync']:.2f}x" if "sync" in mean else "",
        ]
        for w, label in names.items()
    ]
    table = markdown_table(["wiring", f"seconds to avg@8 >= {args.target} per seed", "mean", "vs sync"], rows)
    report(
        f"Time to accuracy (arithmetic, tiny-1m after SFT, avg@8 >= {args.target}, evaluated every "
        f"{args.every} steps, async max_staleness {args.staleness}, seeds {args.seeds})",
        table,
        "Trainer step time summed up to the first evaluation at or above the target (start-up and evaluation "
        "excluded); '>': not reached in the run, its whole time counted. Target (issue 27): async <= 0.6x of sync.",
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
