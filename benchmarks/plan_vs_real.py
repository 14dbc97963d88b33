"""``trine plan``'s estimate against the real wall-clock of ``trine run``, on the main job and on an async
config with explorer and trainer processes.

For each config: ``trine plan CONFIG --json`` (its own process), then ``trine run CONFIG`` at once, timed
from the process's start to its exit, as a user would time it. Both build the tiny model on first use
(``model.path`` in a fresh temporary directory, ``model.init_preset``), as a first run does. Rows:

- ``main job``: ``examples/arithmetic/config.yaml`` as the README's first command runs it (500 SFT steps,
  200 GRPO steps), with ``run_dir`` and ``model.path`` in the temporary directory;
- ``async, processes``: GRPO on the same data with ``mode: async``, ``launch: processes`` (one trainer and
  one explorer process, each on its own cores), a SQLite buffer, ``max_staleness: 2``, ``--async-steps``
  steps, evaluation every 50.

The 1-minute load average is read before the plan, between plan and run, and after the run: the machines
these ran on are shared, and a change of load between the two moves the ratio.

Usage: python benchmarks/plan_vs_real.py [--only main,async] [--async-steps 150] [--rounds 1] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "examples" / "arithmetic" / "config.yaml"
DATA = ROOT / "examples" / "arithmetic" / "data"


def main_job(tmp: Path, *overrides: str) -> tuple[Path, list[str]]:
    """The README's first command, writing into ``tmp`` (its run directory and its model)."""
    return MAIN, [f"run_dir={tmp / 'run'}", f"model.path={tmp / 'model'}", *overrides]


def async_job(tmp: Path, steps: int = 150, *overrides: str) -> tuple[Path, list[str]]:
    """GRPO on the arithmetic data as trainer + explorer processes, written into ``tmp``."""
    sampling = {"temperature": 1.0, "max_tokens": 6}
    data = {
        "name": "plan-async",
        "run_dir": str(tmp / "run"),
        "seed": 0,
        "mode": "async",
        "launch": "processes",
        "model": {"path": str(tmp / "model"), "init_preset": "tiny-1m"},
        "tasks": {
            "batch_size": 16,
            "total_steps": steps,
            "train": {"path": str(DATA / "train.jsonl"), "repeat": 8, "sampling": sampling},
            "eval": [{"name": "addition", "path": str(DATA / "eval.jsonl"), "sampling": sampling}],
        },
        "buffer": {"storage": "sql", "max_staleness": 2},
        "trainer": {"lr": 2e-4},
        "eval": {"every": 50, "k": 8},
    }
    path = tmp / "async.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path, list(overrides)


def load() -> float:
    return os.getloadavg()[0]


def trine(*args: str, timeout: float) -> tuple[subprocess.CompletedProcess, float]:
    """``python -m trine.cli ARGS`` from the repository root; its result and wall seconds."""
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "trine.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise RuntimeError(
            f"trine {args[0]} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done, seconds


def compare(config: Path, overrides: list[str], run_dir: Path, timeout: float = 900) -> dict[str, Any]:
    """Plan ``config`` (asserting it wrote nothing into ``run_dir``), then run it; the estimate, the real
    wall-clock, their ratio and the load averages."""
    loads = [load()]
    done, plan_seconds = trine("plan", str(config), *overrides, "--json", timeout=timeout)
    assert not run_dir.exists(), f"trine plan wrote into the run directory {run_dir}"
    estimate = json.loads(done.stdout)
    loads.append(load())
    _, real = trine("run", str(config), *overrides, timeout=timeout)
    loads.append(load())
    seconds = estimate["seconds"]
    return {
        "estimate": seconds["mid"],
        "low": seconds["low"],
        "high": seconds["high"],
        "real": real,
        "ratio": seconds["mid"] / real,
        "plan_seconds": plan_seconds,
        "loads": loads,
        "machine": estimate["machine"],
        "plan": estimate,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="main,async", help="comma-separated: main, async")
    parser.add_argument("--async-steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    jobs = {
        "main job (README)": ("main", lambda tmp: main_job(tmp)),
        f"async, processes ({args.async_steps} steps)": (
            "async",
            lambda tmp: async_job(tmp, args.async_steps),
        ),
    }
    rows = []
    for _ in range(args.rounds):
        for name, (key, make) in jobs.items():
            if key not in args.only.split(","):
                continue
            with tempfile.TemporaryDirectory(prefix="trine-plan-bench-") as tmp:
                config, overrides = make(Path(tmp))
                r = compare(config, overrides, Path(tmp) / "run")
            print(f"{name}: estimate {r['estimate']:.1f} s, real {r['real']:.1f} s, ratio {r['ratio']:.2f}")
            rows.append(
                [
                    name,
                    f"{r['estimate']:.1f} ({r['low']:.0f}–{r['high']:.0f})",
                    f"{r['real']:.1f}",
                    f"{r['ratio']:.2f}",
                    f"{r['plan_seconds']:.1f}",
                    " → ".join(f"{x:.1f}" for x in r["loads"]),
                    r["machine"],
                ]
            )
    from common import markdown_table, report

    headers = [
        "config",
        "estimate s (range)",
        "real s",
        "estimate / real",
        "plan took s",
        "load",
        "measured on",
    ]
    report(
        "Issue 28: trine plan estimates vs real wall-clock",
        markdown_table(headers, rows),
        "Estimate: `trine plan CONFIG --json` (median per cost × count; the range: the measured minimum and "
        "maximum × count). Real: `trine run CONFIG` timed from process start to exit, started right after the "
        "plan. Load: 1-minute load average before the plan → before the run → after the run.",
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
