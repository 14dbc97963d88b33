"""Mode ``async`` as separate processes: one ``trine train`` and one or more ``trine explore`` on one run
directory. They meet only at the SQL buffer (``<run_dir>/buffer.db`` by default, or PostgreSQL) and at
the weights the trainer publishes into ``<run_dir>/weights`` (``sync.method: published``).

- **trainer** (:func:`train`): the loop with the trainer side only (:func:`trine.modes.asynchronous.
  trainer_steps`): publishes its weights at start and every ``sync_interval`` steps, checkpoints as
  usual. One per run directory (``trainer.lock``). Killed and restarted, it resumes at its checkpoint and
  gives back what it took from the buffer since (``rewind="reads"``): nothing is lost or trained twice.
- **explorer** (:func:`explore`): streams tasks it pulls from the buffer's task ledger
  (:mod:`trine.explorer.claims`: a fast explorer takes more, a dead one's claims expire and go to the
  others, a restarted one reopens what it never put) with the newest published weights, paced by
  ``buffer.max_staleness`` (counting every explorer's tasks in flight); each batch is put once under its
  name (``explorer-i``) with the claims it finishes, in one transaction. It writes ``explorers/<i>/status.json`` and
  ``explorers/<i>/metrics.jsonl`` and stops when the trainer's run ends or its tasks run out.
- **launcher** (:func:`launch`): ``trine run`` with ``launch: processes`` starts both and waits, telling
  each its role's cores (:func:`role_environments`: the trainer half of them, the explorers the rest).
  Ctrl-C / SIGTERM is forwarded to them: the trainer finishes its step, checkpoints it and exits 130 /
  143 (as ``trine run`` does in one process), the explorers stop; the same command resumes.

Either side may start first: an explorer waits for the first published weights, the trainer for each
batch, each up to ``sync.wait_timeout``. Each side also watches the other's status files
(:mod:`trine.launch.liveness`): an explorer whose trainer died (its pid gone, or no heartbeat for
``sync.wait_timeout``) and was not restarted within ``sync.wait_timeout`` stops with exit code 1, and so
does a trainer whose explorers all died; a side restarted within that window is picked up. All processes
must agree on the settings they share (``shared_config.json``, :func:`check_shared_config`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from trine.config import RunConfig
from trine.launch.liveness import PeerGone, TrainerWatch
from trine.status import STOP_GRACE_SECONDS, Terminated

SHARED_SECTIONS = ("seed", "model", "tasks", "algorithm", "buffer", "sync", "trainer")
"""Config keys every process of a run must agree on (the explorers' batches are the trainer's data)."""
PER_LAUNCH = ("sync.address",)
"""Shared keys that may change from one launch of a run to the next (a Ray driver picks a new port)."""
FINAL = ("finished", "failed", "stopped")
WATCH_SECONDS = 1.0
"""How often an explorer process looks at the trainer's status file."""
CHECKPOINT_SECONDS = 300.0
"""How long ``trine run`` waits for a stopped trainer to write its checkpoint, after its step's grace."""


class ProcessSetupError(ValueError):
    """A process cannot join the run: wrong mode or buffer, other shared settings, a second trainer."""


def as_process(stages: list[RunConfig], command: str) -> RunConfig:
    """The one stage a ``trine train`` / ``trine explore`` process runs, with ``launch: processes``."""
    if len(stages) != 1 or stages[0].mode != "async":
        modes = [s.mode for s in stages]
        raise ProcessSetupError(
            f"`trine {command}` runs one stage of mode async (explorer and trainer processes); this config has "
            f"{len(stages)} stage(s) of mode(s) {modes}. Use `trine run` for it, or give a single-stage "
            "config with mode: async."
        )
    if command in ("explore", "run") and stages[0].tasks.source == "serve":
        raise ProcessSetupError(
            f"`trine {command}` explores a taskset, but this config has tasks.source: serve (agents bring the "
            "tasks): start `trine serve CONFIG` for the agents and `trine train CONFIG` for the trainer instead"
        )
    from pydantic import ValidationError

    cfg = stages[0].model_copy(update={"launch": "processes"})
    try:  # the checks for processes (a SQL buffer, published weights, ...) with launch set
        RunConfig.model_validate(cfg.model_dump(), context={"mode": cfg.mode})  # as validate_dict does
    except ValidationError as err:
        problems = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in err.errors())
        raise ProcessSetupError(f"`trine {command}`: {problems}") from None
    return cfg


def check_shared_config(cfg: RunConfig, run_dir: Path) -> None:
    """The first process records the settings every process must share in ``shared_config.json``; a later
    one with different settings is refused with the keys that differ."""
    mine = _flat(cfg.model_dump(mode="json", include=set(SHARED_SECTIONS)))
    for key in PER_LAUNCH:
        mine.pop(key, None)
    path = run_dir / "shared_config.json"
    run_dir.mkdir(parents=True, exist_ok=True)
    if _create_once(path, json.dumps(mine, indent=1, sort_keys=True)):
        return
    theirs = {k: v for k, v in json.loads(path.read_text()).items() if k not in PER_LAUNCH}
    differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    if differ:
        shown = ", ".join(f"{k} ({theirs.get(k)!r} there, {mine.get(k)!r} here)" for k in differ[:6])
        raise ProcessSetupError(
            f"{run_dir} is a run whose processes use other settings: {shown}"
            + (f" and {len(differ) - 6} more" if len(differ) > 6 else "")
            + f". Start every process with the same config (see {path}), or use another run_dir."
        )


def _create_once(path: Path, text: str) -> bool:
    """Write ``text`` into ``path`` unless it exists (then False): the first of several processes wins,
    and none reads the file half written (a hard link of a complete file; where the file system has
    none, an exclusive create)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:  # no hard links here
        try:
            with open(path, "x", encoding="utf-8") as f:
                f.write(text)
            return True
        except FileExistsError:
            return False
    finally:
        tmp.unlink()


def _flat(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` as ``{"a.b": 1}`` (an empty dict stays a value)."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


@contextlib.contextmanager
def trainer_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``<run_dir>/trainer.lock`` (released by the OS if the process dies): one trainer per run."""
    import fcntl

    path = run_dir / "trainer.lock"
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = Path(path).read_text().strip() or "?"
            raise ProcessSetupError(
                f"another trainer (pid {holder}) is running on {run_dir} ({path} is locked); a run has one "
                "trainer: stop it first, or use another run_dir."
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        os.close(fd)  # closing releases the lock


def train(stages: list[RunConfig]) -> dict[str, Any]:
    """``trine train``: the trainer process of an async run (see the module docstring)."""
    from trine.loop import run
    from trine.trainer.ranks import rank_stages

    cfg = rank_stages([as_process(stages, "train")], "trainer")[0]  # under torchrun: this rank's view
    run_dir = cfg.run_path
    check_shared_config(cfg, run_dir)
    with trainer_lock(run_dir):
        return run([cfg], part="trainer")


def trainer_ended(run_dir: Path, since: float) -> str | None:
    """The trainer's final state if it ended after ``since`` (unix time), else None."""
    path = run_dir / "status.json"
    with contextlib.suppress(OSError, ValueError):
        state = json.loads(path.read_text()).get("state")
        if state in FINAL and path.stat().st_mtime >= since:
            return str(state)
    return None


def explore(
    stages: list[RunConfig],
    index: int,
    count: int,
    stop: threading.Event | None = None,
    buffer: Any = None,
    home: Path | None = None,
) -> str:
    """``trine explore``: explorer process ``index`` of ``count``; returns why it stopped. ``stop``: set by
    whoever drives this explorer to end it (a Ray driver); ``buffer``: where to put batches instead of
    opening the run's buffer (the Ray buffer writer); ``home``: a directory of its own node for its files
    instead of ``<run_dir>/explorers/<index>`` (``cluster.explorer_dir``: then it never reads the run
    directory, and whoever drives it watches the trainer). Raises :class:`~trine.launch.liveness.PeerGone`
    when the trainer died and was not restarted within ``sync.wait_timeout``."""
    from trine import build
    from trine.monitor import build_monitor
    from trine.monitor.progress import StepWatch
    from trine.status import Heartbeat, beat_interval
    from trine.threads import about, use_threads

    cfg = as_process(stages, "explore")
    run_dir = cfg.run_path if home is None else home.parent.parent  # its files: <run_dir>/explorers/<index>
    if home is None:
        check_shared_config(cfg, run_dir)
        if trainer_ended(run_dir, since=0) == "finished":
            return "the trainer already finished this run"
    started, out = time.time(), run_dir / "explorers" / str(index)
    out.mkdir(parents=True, exist_ok=True)
    threads = use_threads(cfg.num_threads)  # as RunDir.open does for the trainer process
    say = partial(print, flush=True)
    model, tokenizer = build.load_policy(cfg, weights=build.engine_weights(cfg) != "copy", say=say)
    side = build.build_explorer_process(cfg, model, tokenizer, run_dir, index, count, buffer)
    interval = beat_interval(cfg.sync.wait_timeout)  # the trainer watches it (launch/liveness)
    m = cfg.monitor  # stuck: no batch put for too long (status.json, `trine status`)
    watch = StepWatch(m.stuck_after, m.stuck_min_seconds, waiting=side.waiting_on, say=say)
    heartbeat = Heartbeat(out, side.batches, interval=interval, about=about(threads), watch=watch)
    monitor = build_monitor(["jsonl"], out, total_steps=None, config={}, resume_step=side.batches)
    stop = stop or threading.Event()
    trainer = TrainerWatch(run_dir, cfg.sync.wait_timeout, index, count) if home is None else None
    watcher = threading.Thread(target=_watch, args=(run_dir, started, stop, side.sync, trainer), daemon=True)
    watcher.start()
    try:
        try:
            side.sync.wait_for_first(cfg.sync.wait_timeout)  # type: ignore[attr-defined]
            watch.set_phase("step")
            why = _explore_loop(cfg, side, monitor, heartbeat, stop)
        except TimeoutError:
            if not stop.is_set():  # else: weight sync closed as the trainer's run ended, or it was gone
                raise
            why = "the trainer's run ended"
        if trainer is not None and trainer.gone:
            raise PeerGone(trainer.gone)
    except KeyboardInterrupt:
        heartbeat.end("stopped", reason="interrupted; run again to continue")
        raise
    except BaseException as err:
        heartbeat.end("failed", error=f"{type(err).__name__}: {err}")
        raise
    finally:
        stop.set()
        monitor.close()
        side.explorer.close()
        side.sync.close()
    heartbeat.end("finished", reason=why)
    return why


def _watch(
    run_dir: Path, since: float, stop: threading.Event, sync: Any, trainer: TrainerWatch | None
) -> None:
    """Set ``stop`` when the trainer's run ends (after ``since``), or when it is gone and not back within
    ``sync.wait_timeout`` (``trainer.gone`` says why; ``trainer`` None: not watched here, whoever drives
    this explorer sets ``stop``); once stopped, release a wait for weights."""
    while not stop.wait(WATCH_SECONDS):
        if trainer is not None and (trainer_ended(run_dir, since) or trainer.check()):
            stop.set()
    sync.close()


def _explore_loop(cfg: RunConfig, side: Any, monitor: Any, heartbeat: Any, stop: threading.Event) -> str:
    """Stream tasks pulled from the shared ledger (:mod:`trine.explorer.claims`) until ``stop`` or the tasks
    run out, each started once the pacing rule admits it: the rows waiting in the buffer and the tasks
    every explorer has in flight count."""
    from trine.explorer.pacing import Pacing, rows_queued
    from trine.explorer.streaming import stream
    from trine.modes.asynchronous import produce_strategies

    pacing = Pacing(cfg.buffer.max_staleness, cfg.trainer_batch_rows, cfg.tasks.train.repeat)
    claims = side.claims
    queued = partial(rows_queued, side.buffer)  # the other explorers' tasks in flight count as tasks
    trainer_at = lambda: (side.sync.latest() or 0) + cfg.sync.sync_interval  # noqa: E731 - at most this far
    tick = [time.perf_counter()]

    def put() -> None:
        report = {**side.report(), "explorer/version": float(side.engine.policy_version)}
        monitor.log(report, side.batches)
        print(
            batch_line(side.producer or "explorer", side.batches, report, time.perf_counter() - tick[0]),
            flush=True,
        )
        heartbeat.beat(side.batches)
        tick[0] = time.perf_counter()

    claims.reopen()  # what an earlier incarnation of this explorer claimed and never put
    try:
        why = stream(side, pacing, trainer_at, queued, stop, produce_strategies(cfg), on_put=put)
    finally:
        claims.reopen()  # the others take this explorer's unfinished tasks at once
    return "the trainer's run ended" if stop.is_set() or why == "stopped" else why


def batch_line(name: str, batch: int, metrics: dict[str, float], seconds: float) -> str:
    """An explorer process's console line for the batch it just put (``batch``: how many it has put, the
    step of its ``metrics.jsonl`` line): ``explorer-0 batch 3 | weights v2 | reward 0.531 | len 4.2 |
    time 1.23s (paced 0.40s)``; pending rewards show as ``reward pending 16``."""
    from trine.monitor.sinks import fmt_number, reward_text, scalars

    numbers = scalars(metrics)
    parts = [f"{name} batch {batch}", f"weights v{numbers.get('explorer/version', 0):.0f}"]
    parts += [text] if (text := reward_text(numbers)) else []
    if "explorer/response_length_mean" in numbers:
        parts.append(f"len {fmt_number(numbers['explorer/response_length_mean'])}")
    paced = numbers.get("explorer/paced_seconds", 0.0)
    parts.append(f"time {seconds:.2f}s" + (f" (paced {paced:.2f}s)" if paced >= 0.01 else ""))
    return " | ".join(parts)


def launch(config: Path, overrides: list[str], plugins: list[Path], cfg: RunConfig) -> int:
    """``trine run`` with ``launch: processes``: start ``trine train`` and ``explorer.instances`` ×
    ``trine explore`` on the same config, forward Ctrl-C / SIGTERM to them, wait; the trainer's exit code."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise ProcessSetupError(
            "`trine run` with launch: processes starts the trainer and the explorers itself; under torchrun, start "
            "the trainer ranks with `torchrun --nproc-per-node N -m trine.cli train CONFIG` and the explorers "
            "with `trine explore CONFIG --explorer-id I --explorers N` instead"
        )
    as_process([cfg], "run")  # refuses what `trine train` + `trine explore` cannot run (tasks.source: serve)
    base = [sys.executable, "-m", "trine.cli"]
    extra = [*overrides, *(a for p in plugins for a in ("--plugin", str(p)))]
    n = cfg.explorer.instances
    env = role_environments(n)
    trainer = subprocess.Popen([*base, "train", str(config), *extra], env=env["trainer"])
    explorers = [
        subprocess.Popen(
            [*base, "explore", str(config), *extra, "--explorer-id", str(i), "--explorers", str(n)],
            env=env["explorer"],
        )
        for i in range(n)
    ]
    children = [trainer, *explorers]
    try:
        code = trainer.wait()
        for p in explorers:  # they see the trainer's final status within a second or two
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.terminate()
        return code
    except KeyboardInterrupt as err:  # Ctrl-C or SIGTERM: the trainer checkpoints the step it is at
        _stop_children(children, signal.SIGTERM if isinstance(err, Terminated) else signal.SIGINT)
        raise
    finally:
        for p in children:
            if p.poll() is None:
                p.terminate()
        for p in children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=30)


def role_environments(explorers: int) -> dict[str, dict[str, str]]:
    """The environment of the trainer and of each of ``explorers`` explorer processes on this machine: each
    role's own cores (:func:`trine.threads.role_cores`, :data:`~trine.threads.CORES_ENV`) and how many
    processes share them (:data:`~trine.threads.SHARE_ENV`: 1 trainer, ``explorers`` explorers), so that
    ``num_threads: auto`` gives each its share of its role's cores. Where the platform cannot pin (no
    ``sched_getaffinity``), all of them share all the cores."""
    from trine.threads import CORES_ENV, SHARE_ENV, cores_text, role_cores

    if not hasattr(os, "sched_getaffinity"):
        shared = {**os.environ, SHARE_ENV: str(explorers + 1)}
        return {"trainer": shared, "explorer": shared}
    roles = role_cores(sorted(os.sched_getaffinity(0)), explorers)
    if roles["trainer"] == roles["explorer"]:  # one core: everyone shares it
        shared = {**os.environ, SHARE_ENV: str(explorers + 1), CORES_ENV: cores_text(roles["trainer"])}
        return {"trainer": shared, "explorer": shared}
    return {
        "trainer": {**os.environ, SHARE_ENV: "1", CORES_ENV: cores_text(roles["trainer"])},
        "explorer": {**os.environ, SHARE_ENV: str(explorers), CORES_ENV: cores_text(roles["explorer"])},
    }


def _stop_children(children: list[subprocess.Popen], sig: int) -> None:
    """Forward the stop ``sig`` to every child (a child that got it from the terminal too counts it once,
    :data:`trine.status.REPEAT_SECONDS`) and wait for the trainer (``children[0]``) to write its checkpoint
    and exit (at most :data:`trine.status.STOP_GRACE_SECONDS` for its step, then the checkpoint); a second
    stop is forwarded too: the children stop at once."""
    for p in children:
        if p.poll() is None:
            p.send_signal(sig)
    try:
        children[0].wait(timeout=STOP_GRACE_SECONDS + CHECKPOINT_SECONDS)
    except KeyboardInterrupt:  # a second stop: stop them at once
        for p in children:
            if p.poll() is None:
                p.send_signal(sig)
    except subprocess.TimeoutExpired:
        pass
