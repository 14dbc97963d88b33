"""The loop's per-step overhead, before and after a refactor, side by side in one run (issue 10, issue 24).

The same short GRPO run (the main job's model and data: 16 tasks × 8 samples per step, ``--steps`` steps,
``num_threads`` 2) from a given starting checkpoint runs with the code of each git checkout in turn,
alternating over ``--rounds`` rounds, each in a fresh process with that checkout first on ``PYTHONPATH``.
A run's number is the median of its ``time/step_seconds`` (the first two steps skipped: warm-up); the table
shows each round and the median over rounds. The runs' non-timing metrics must be identical too (the same
code path computes the same numbers), which the table also says.

Usage: python benchmarks/overhead_ab.py BEFORE_CHECKOUT AFTER_CHECKOUT --start CHECKPOINT_DIR
       [--steps 25] [--rounds 3]
(make BEFORE with ``git worktree add /tmp/before <commit>``; CHECKPOINT_DIR: e.g. the SFT stage's last
checkpoint of a main-job run, ``runs/arithmetic/checkpoints/step_500``).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from compare_metrics import stable_records  # noqa: E402


def one_run(checkout: Path, start: Path, steps: int, out: Path) -> float:
    """Run the GRPO stage with ``checkout``'s code; the median step time (first two steps skipped)."""
    config = ROOT / "examples" / "arithmetic" / "config.yaml"
    overrides = [
        f"model.path={start}",
        "model.init_preset=null",
        "stages=[]",
        "mode=sync",
        "algorithm.name=grpo",
        f"tasks.total_steps={steps}",
        "trainer.lr=2.0e-4",
        "eval.every=0",
        "eval.at_start=false",
        "num_threads=2",
        "monitor.sinks=[jsonl]",
        "monitor.plot=false",
        f"run_dir={out}",
    ]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    subprocess.run(
        [sys.executable, "-m", "trine.cli", "run", str(config), *overrides],
        cwd=checkout,
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if x.strip()]
    times = [r["time/step_seconds"] for r in lines if "time/step_seconds" in r][2:]
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--start", type=Path, required=True)
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    results: dict[str, list[float]] = {"before": [], "after": []}
    same = True
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            runs = {}
            for name in ("before", "after"):
                out = Path(tmp) / f"{name}-{r}"
                results[name].append(one_run(getattr(args, name), args.start.resolve(), args.steps, out))
                runs[name] = stable_records(out / "metrics.jsonl")
            same &= runs["before"] == runs["after"]
    print("| code | " + " | ".join(f"round {r + 1}" for r in range(args.rounds)) + " | median |")
    print("|---|" + "---|" * (args.rounds + 1))
    for name, values in results.items():
        cells = " | ".join(f"{v:.4f}" for v in values)
        print(f"| {name} | {cells} | **{statistics.median(values):.4f} s** |")
    print(f"non-timing metrics identical in every round: {same}")


if __name__ == "__main__":
    main()
