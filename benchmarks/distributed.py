"""Ray's overhead and explorer scaling on the long-tailed environment (``benchmarks/slow_env.py``).

The same config, the same steps, wired four ways (``benchmarks/modes.py`` measures each run):

- ``async, one process``: explorer thread + trainer in one process (``launch: thread``, oversample 1: it
  explores whole batches, as explorer processes do);
- ``processes``: ``trine run`` with ``launch: processes`` (``trine train`` + ``trine explore``);
- ``ray``: ``cluster.backend: ray`` (a local Ray cluster, trainer / explorer / buffer-writer actors,
  weights by gloo broadcast), with 1 and with 2 explorers; and Ray with the directory sync.

Wall = the trainer's step time summed (start-up of processes, Ray and models excluded, the same for every
row); steps/s = steps / wall. The targets (issue 14): Ray with one explorer ≥ 0.9× the steps/s of the
in-process run; two explorers faster than one on this environment. Rows alternate over ``--rounds``;
medians reported.

Usage: python benchmarks/distributed.py [--steps 30] [--rounds 2] [--latency 0.2] [--sigma 1.0] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import sys

from common import markdown_table, median, report, threads
from modes import measure


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--latency", type=float, default=0.2, help="median environment latency (s)")
    parser.add_argument("--sigma", type=float, default=1.0, help="log-normal shape: larger = longer tail")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--staleness", type=int, default=4, help="buffer.max_staleness of every row")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    threads(2)
    load, command = os.getloadavg()[0], " ".join(["python benchmarks/distributed.py", *sys.argv[1:]])
    sql = {"storage": "sql", "max_staleness": args.staleness}
    ray = {"mode": "async", "buffer": sql, "num_threads": 1, "cluster": {"backend": "ray"}}
    rows_of = {
        "async, one process": {"mode": "async", "buffer": {"max_staleness": args.staleness}},
        "processes, 1 explorer": {"mode": "async", "launch": "processes", "buffer": sql, "num_threads": 1},
        "ray, 1 explorer (broadcast)": ray,
        "ray, 1 explorer (published)": {**ray, "sync": {"method": "published"}},
        "ray, 2 explorers (broadcast)": {**ray, "explorer": {"instances": 2}},
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in rows_of}
    for _ in range(args.rounds):
        for name, mode in rows_of.items():
            results[name].append(measure(args.steps, args.latency, args.sigma, mode))
    speed = {name: args.steps / median([r["wall"] for r in runs]) for name, runs in results.items()}
    base, one = speed["async, one process"], speed["ray, 1 explorer (broadcast)"]
    rows = [
        [
            name,
            f"{args.steps / speed[name]:.1f}",
            f"{speed[name]:.2f}",
            f"{speed[name] / base:.2f}x",
            f"{speed[name] / one:.2f}x",
            f"{100 * median([r['trainer_idle'] for r in runs]):.0f}%",
            f"{median([r['staleness'] for r in runs]):.2f}",
        ]
        for name, runs in results.items()
    ]
    headers = [
        "wiring",
        f"wall s ({args.steps} steps)",
        "steps/s",
        "vs one process",
        "vs ray 1 explorer",
        "trainer idle",
        "staleness",
    ]
    report(
        f"Ray vs in-process, long-tailed environment (tiny-1m, 8 tasks x 8 samples, latency median "
        f"{args.latency}s, sigma {args.sigma}; max_staleness {args.staleness})",
        markdown_table(headers, rows),
        f"Medians of {args.rounds} alternating rounds. Wall = the trainer's step time summed (start-up "
        "excluded). Targets: ray 1 explorer >= 0.9x one process; 2 explorers > 1. "
        f"Command: `{command}` (load average {load:.1f} at the start).",
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
