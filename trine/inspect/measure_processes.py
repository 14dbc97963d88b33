"""``trine plan`` for mode async with ``launch: processes``: the explorers are the run's own ``trine
explore`` processes, and the plan's process is the trainer.

As ``trine run`` would, the plan starts ``explorer.instances`` × ``trine explore`` on the stage (written into
``<tmp>/plan.yaml`` with the run directory in the temporary directory; their output into
``<tmp>/explorers.log``), each on the explorers' cores, and pins itself to the trainer's
(:func:`trine.launch.processes.role_environments`). Then it is the trainer process (the shared settings
recorded, ``trainer.lock`` held) and measures its stage the way
:func:`~trine.inspect.measure_stage.plan_inline` measures any, with ``part="trainer"`` (the trainer side that
publishes its weights and trains on the explorers' batches from the SQL buffer): warm-up steps, steps until
enough are measured, one evaluation, one checkpoint, the end, which includes the explorers seeing the run
finish and stopping. Meanwhile a thread reads the explorers' peak memory and notices one that fails.

From each explorer's ``metrics.jsonl`` (a line per batch, with ``time/unix``) over the measured steps: its
seconds per batch and the part of them not paced; the trainer's step is never faster than the busiest
explorer's busy time per step (:func:`trine.inspect.estimate.steady_step`). What differs from ``trine run``:
there the trainer is a process of its own, started beside the explorers (one more Python start and config
check, about as long as the explorers' own, which the warm-up already waits for).
"""

from __future__ import annotations

import _thread
import contextlib
import dataclasses
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from trine.config import RunConfig
from trine.inspect.estimate import (
    Cost,
    Options,
    PlanError,
    ProcessEstimate,
    RunEstimate,
    Spread,
    StageEstimate,
    steady_step,
)

POLL_SECONDS = 0.2
"""How often the watch thread reads the explorers' peak memory and exit codes."""
EXIT_SECONDS = 60.0
"""How long the end waits for the explorers to see the run finish (as ``trine run`` does)."""


def plan_processes(
    cfg: RunConfig, tmp: Path, config: str, options: Options, say: Callable[[str], None], plugins: list[Path]
) -> RunEstimate:
    """Start the explorers, be the trainer, estimate the whole run (see the module docstring)."""
    from trine.config import load_config
    from trine.inspect.measure_stage import plan_inline
    from trine.launch.processes import check_shared_config, role_environments, trainer_lock
    from trine.threads import CORES_ENV, SHARE_ENV

    path = tmp / "plan.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json", exclude={"stages"}), sort_keys=False))
    cfg = load_config(path)[0]  # as the explorers load it: the same shared settings
    run_dir, n = cfg.run_path, cfg.explorer.instances
    env = role_environments(n)
    check_shared_config(cfg, run_dir)
    say(f"starting {n} explorer process(es); this process is the trainer ...")
    command = [sys.executable, "-m", "trine.cli", "explore", str(path), "--explorers", str(n)]
    command += [a for p in plugins for a in ("--plugin", str(p))]
    started = time.time()
    with open(tmp / "explorers.log", "ab") as log:
        children = [
            subprocess.Popen([*command, "--explorer-id", str(i)], env=env["explorer"], stdout=log, stderr=log)
            for i in range(n)
        ]
        watch, saved = Watch(children), {k: os.environ.get(k) for k in (CORES_ENV, SHARE_ENV)}
        os.environ.update({k: env["trainer"][k] for k in (CORES_ENV, SHARE_ENV) if k in env["trainer"]})
        try:
            with watch.watching(), trainer_lock(run_dir):
                est = plan_inline([cfg], config, options, say, tmp, "trainer", watch.finish)
        except KeyboardInterrupt:
            if watch.failed is None:
                raise
            tail = (tmp / "explorers.log").read_text(errors="replace")[-3000:]
            raise PlanError(f"{watch.failed} while the plan measured it; its last output:\n{tail}") from None
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            for child in children:
                if child.poll() is None:
                    child.terminate()
                    child.wait(timeout=30)
    explorers = [_lines(run_dir / "explorers" / str(i) / "metrics.jsonl") for i in range(n)]
    stage = with_explorers(
        est.stages[0], cfg, _lines(run_dir / "metrics.jsonl"), explorers, started, watch.peaks
    )
    device, load = est.machine.split(",")[0], est.machine[est.machine.rfind("(") :]  # "(2 cores, load 1.1)"
    return dataclasses.replace(
        est, stages=[stage], machine=f"{device}, processes: {_threads(run_dir)} {load}"
    )


def with_explorers(
    stage: StageEstimate,
    cfg: RunConfig,
    trainer: list[dict[str, Any]],
    explorers: list[list[dict[str, Any]]],
    started: float,
    peaks: dict[str, float],
) -> StageEstimate:
    """The trainer's stage with its explorers: a row per process (the trainer's from its step lines, each
    explorer's from its batch lines after the trainer's warm-up), the explorers' sampling as a part of the
    step, and the step bounded by the busiest explorer's busy time per step."""
    steps = [m for m in trainer if "time/step_seconds" in m]
    warm = stage.warmup_steps
    since = steps[warm - 1]["time/unix"] if 0 < warm <= len(steps) else started
    per_step = (
        cfg.trainer_batch_rows / (cfg.tasks.batch_size * cfg.tasks.train.repeat) / max(len(explorers), 1)
    )
    rows = []
    for i, lines in enumerate(explorers):
        measured = [m for m in lines if m["time/unix"] >= since]
        row = explorer_estimate(f"explorer-{i}", measured, started, stage.total_steps * per_step)
        first = lines[0]["time/unix"] - started if lines else float("nan")
        rows.append(dataclasses.replace(row, startup=first, peak_rss_mb=peaks.get(f"explorer-{i}")))
    busiest = max((r.busy.times(per_step) for r in rows), key=lambda s: s.mid, default=Spread.of([]))
    costs, coupled, train = [], Spread.of([]), Spread.of([])
    for cost in stage.costs:
        if cost.name == "training step":
            train = cost.each
        if cost.name == "step":
            coupled = cost.each
            cost = dataclasses.replace(cost, each=steady_step(cost.each, busiest))
        costs.append(cost)
        if cost.name == "step":
            batches = sum(r.count for r in rows)
            costs.append(
                Cost("sampling, per explorer batch (pacing excluded)", _merged(rows), batches, False)
            )
    first = steps[0]["time/unix"] - started if steps else float("nan")
    row = ProcessEstimate("trainer", first, "step", coupled, train, stage.total_steps, stage.peak_rss_mb)
    sampled = [m for lines in explorers for m in lines if m["time/unix"] >= since]
    return dataclasses.replace(
        stage, costs=costs, processes=[row, *rows], sampling_tokens_per_second=_sampling_rate(sampled)
    )


def explorer_estimate(
    name: str, lines: list[dict[str, Any]], started: float, batches: float
) -> ProcessEstimate:
    """One explorer process from its batch lines: start-up to its first batch, seconds between batches,
    and of those the seconds not paced (held back by the staleness bound)."""
    if not lines:
        return ProcessEstimate(name, float("nan"), "batch", Spread.of([]), Spread.of([]), 0)
    times = [m["time/unix"] for m in lines]
    gaps = [b - a for a, b in zip(times, times[1:])]
    paced = [float(m.get("explorer/paced_seconds", 0.0)) for m in lines[1:]]
    busy = [max(g - p, 0.0) for g, p in zip(gaps, paced)]
    return ProcessEstimate(
        name, times[0] - started, "batch", Spread.of(gaps), Spread.of(busy), math.ceil(batches)
    )


def _merged(processes: list[ProcessEstimate]) -> Spread:
    busy = [p.busy for p in processes if p.busy.samples]
    if not busy:
        return Spread.of([])
    return Spread(
        Spread.of([b.mid for b in busy]).mid, min(b.low for b in busy), max(b.high for b in busy), len(busy)
    )


def _sampling_rate(lines: list[dict[str, Any]]) -> float | None:
    tokens = sum(
        m.get("explorer/experiences", 0.0) * m.get("explorer/response_length_mean", 0.0) for m in lines
    )
    seconds = sum(m.get("time/explore_seconds", 0.0) for m in lines)
    return tokens / seconds if seconds > 0 else None


class Watch:
    """The explorer processes while the plan runs: their peak resident memory (``VmHWM``, Linux), read
    every :data:`POLL_SECONDS`, and the first of them that exits with an error (the trainer would wait
    ``sync.wait_timeout`` for its batches: the plan is interrupted instead)."""

    def __init__(self, children: list[subprocess.Popen]):
        self.children = children
        self.peaks: dict[str, float] = {}
        self.failed: str | None = None
        self.ending = False

    def finish(self) -> None:
        """The run finished: wait for the explorers to see it (they look every second), as ``trine run``
        does; their exit is no failure any more."""
        self.ending = True
        for child in self.children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=EXIT_SECONDS)

    def read(self) -> None:
        for i, child in enumerate(self.children):
            code = child.poll()
            if code and self.failed is None and not self.ending:
                self.failed = f"explorer {i} exited with code {code}"
                _thread.interrupt_main()
            role, pid = f"explorer-{i}", child.pid
            with contextlib.suppress(OSError, ValueError, IndexError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():  # gone: no change
                    if line.startswith("VmHWM:"):
                        mib = int(line.split()[1]) / 1024
                        self.peaks[role] = max(self.peaks.get(role, 0.0), mib)

    @contextlib.contextmanager
    def watching(self) -> Iterator[None]:
        stop = threading.Event()

        def poll() -> None:
            while not stop.wait(POLL_SECONDS):
                self.read()

        thread = threading.Thread(target=poll, name="trine-plan-explorers", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _threads(run_dir: Path) -> str:
    """``trainer 1 thread on cores 0, explorer-0 1 thread on cores 1`` from the status files."""
    out = []
    for role, path in [("trainer", run_dir / "status.json"),
                       *((f"explorer-{p.name}", p / "status.json") for p in sorted((run_dir / "explorers").glob("*")))]:  # fmt: skip
        with contextlib.suppress(OSError, ValueError):
            s = json.loads(path.read_text())
            cores = f" on cores {s['cores']}" if s.get("cores") else ""
            out.append(f"{role} {s.get('threads', '?')} thread(s){cores}")
    return ", ".join(out)
