"""Does a busy neighbouring core slow a pinned trainer? (issue 27, item 7: "adding an explorer never makes
a run slower").

With ``launch: processes`` and ``num_threads: auto`` the trainer is pinned to the first half of the cores
and the explorers to the rest (:func:`trine.threads.role_cores`). Pinning keeps an explorer off the
trainer's core, but not off what the two cores share (a physical core under two virtual ones, the caches,
the clock). This measures it: a trainer-like forward + backward on core 0 (one torch thread), alternately
with core 1 idle, running torch matmuls and running pure Python, each in a process pinned to core 1.

    python benchmarks/core_interference.py [--rounds 3] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import torch

from common import markdown_table, median, report

NEIGHBOURS = {
    "idle": None,
    "torch matmuls": "import torch; torch.set_num_threads(1); a = torch.randn(512, 512)\n"
    "while True: a = (a @ a).tanh()",
    "pure Python": "x = 0\nwhile True: x = (x * 7 + 1) % 1000003",
}


def step_seconds(steps: int = 30) -> float:
    """A small MLP's forward and backward, ``steps`` times: the shape of a tiny model's training step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256))
    x = torch.randn(512, 256)
    start = time.perf_counter()
    for _ in range(steps):
        model(x).sum().backward()
    return time.perf_counter() - start


def with_neighbour(code: str | None, core: int, repeats: int = 5) -> float:
    """Median of ``repeats`` timings while ``code`` runs in a process pinned to ``core`` (None: nothing)."""
    proc = None
    if code is not None:
        pinned = f"import os; os.sched_setaffinity(0, {{{core}}})\n{code}"
        proc = subprocess.Popen([sys.executable, "-c", pinned])
        time.sleep(1.0)  # its start-up is not the neighbour we measure
    try:
        return median([step_seconds() for _ in range(repeats)])
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        sys.exit(f"needs two cores, this process may use {cores}")
    os.sched_setaffinity(0, {cores[0]})
    torch.set_num_threads(1)
    step_seconds(5)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in NEIGHBOURS}
    for _ in range(args.rounds):  # alternately: idle, torch, Python, idle, ...
        for name, code in NEIGHBOURS.items():
            times[name].append(with_neighbour(code, cores[1]))
    idle = median(times["idle"])
    rows = [
        [f"core {cores[1]}: {name}", f"{median(t):.3f}", f"{median(t) / idle:.2f}x"] for name, t in times.items()
    ]
    table = markdown_table([f"trainer-like step on core {cores[0]} (1 thread) while", "s", "vs idle"], rows)
    notes = (
        f"Medians of {args.rounds} alternating rounds of 5 timings of 30 forward + backward passes of a "
        "256-1024-256 MLP on 512 rows. A ratio above 1 is what an explorer busy on the other core costs the "
        "pinned trainer, whatever its threads and cores."
    )
    report("Core interference: a pinned trainer beside a busy core", table, notes, write=not args.no_write)


if __name__ == "__main__":
    main()
