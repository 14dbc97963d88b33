"""``status.json``: how a run stands, written by the run and read by ``trine status``.

A live run writes ``{"state": "running", "pid", "host", "started_at", "threads", "heartbeat", "step"}`` and
refreshes ``heartbeat`` from a daemon thread every :data:`HEARTBEAT_SECONDS` (more often where
``sync.wait_timeout`` is short, :func:`beat_interval`), whatever the run is doing (a long step, an
evaluation, a wait for batches), ``step`` at every step and, once one is raised, ``alarms``
(:mod:`trine.monitor.alarms`: ``kind``, ``step``, ``message``, ``numbers``); while the step has not advanced
for too long (:mod:`trine.monitor.progress`), ``stuck`` (``since``, ``seconds``, ``median_step_seconds``,
``waiting``, ``reason``), which :func:`describe` reports as the state ``stuck``; a stage that ended early
(``eval.plateau``) adds to ``ended_early`` (``stage``, ``step``, ``reason``); it ends with ``finished``,
``stopped`` (``stop_after_steps``, or Ctrl-C / SIGTERM, with a ``reason``) or ``failed`` (with the error). Ctrl-C and
SIGTERM stop a run at a step boundary with a checkpoint of that step (:func:`on_stop_signal`). A run killed
outright (kill -9, out of memory, a lost machine) leaves ``running`` behind: :func:`describe` tells it
from a live one by its pid (on the same host) and the age of its heartbeat. Every write replaces the
file atomically, so a reader never sees half of it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HEARTBEAT_SECONDS = 5.0
"""How often a live run refreshes its heartbeat."""
STALE_SECONDS = 60.0
"""A ``running`` status whose heartbeat is older than this belongs to a dead run."""
MIN_HEARTBEAT_SECONDS = 0.25
"""The shortest heartbeat period :func:`beat_interval` gives (a status file written 4 times a second)."""
REWARD_VERSION, REWARD_VERSION_MEAN, REWARD_VERSION_ROWS = (
    "trainer/reward_version",
    "trainer/reward_version_mean",
    "trainer/reward_version_rows",
)
"""Metrics of a trainer process (:class:`trine.trainer.rewards.VersionRewards`), shown by ``trine status``:
the newest weights version no longer sampled, and the mean reward and number of its rows trained."""


def beat_interval(wait_timeout: float | None) -> float:
    """The heartbeat period of a process whose peers give up on it after ``wait_timeout`` seconds
    without a heartbeat (:mod:`trine.launch.liveness`): a quarter of it, at most
    :data:`HEARTBEAT_SECONDS`, at least :data:`MIN_HEARTBEAT_SECONDS`; ``None`` (wait forever):
    :data:`HEARTBEAT_SECONDS`."""
    if wait_timeout is None:
        return HEARTBEAT_SECONDS
    return max(MIN_HEARTBEAT_SECONDS, min(HEARTBEAT_SECONDS, wait_timeout / 4))


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_status(run_dir: Path, state: str, **details: Any) -> None:
    """Replace ``run_dir/status.json`` atomically with ``{"state": state, **details}``."""
    path = Path(run_dir) / "status.json"
    tmp = path.with_name(f".status.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"state": state, **details}, indent=2, default=str))
    os.replace(tmp, path)


class Heartbeat:
    """The status of the run in this process: ``running`` with pid, host, step and a heartbeat, until
    :meth:`end` records how it ended. ``interval`` is the heartbeat period in seconds; ``about``: more
    that every write records about the process (its torch ``threads``); ``watch``: the stuck rule
    (:class:`trine.monitor.progress.StepWatch`: told of each step, checked at each beat of the thread)."""

    def __init__(
        self,
        run_dir: Path,
        step: int,
        interval: float = HEARTBEAT_SECONDS,
        about: dict[str, Any] | None = None,
        watch: Any = None,
    ):
        self.run_dir = Path(run_dir)
        self.step = step
        self.interval = interval
        self.watch = watch
        self.identity = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started_at": _now(),
            **(about or {}),
        }
        self.alarms: list[dict[str, Any]] = []
        """Alarms raised so far (:mod:`trine.monitor.alarms`), in every write as ``alarms``."""
        self.notes: dict[str, list[dict[str, Any]]] = {}
        """Other records kept in every write (``ended_early``: stages ended by ``eval.plateau``)."""
        self._lock = threading.Lock()
        self._ended = threading.Event()
        self.beat(step)
        self._thread = threading.Thread(target=self._run, name="trine-heartbeat", daemon=True)
        self._thread.start()

    def beat(self, step: int | None = None) -> None:
        """Record that the run is alive (at ``step`` when given)."""
        if step is not None and self.watch is not None:
            self.watch.advance(step)
        with self._lock:
            if self._ended.is_set():
                return
            self.step = self.step if step is None else step
            write_status(self.run_dir, "running", step=self.step, heartbeat=_now(), **self._about())

    def alarm(self, alarm: dict[str, Any]) -> None:
        """Add a raised alarm (``kind``, ``step``, ``message``, ``numbers``) and write it at once."""
        self.alarms.append(alarm)
        self.beat()

    def note(self, key: str, item: dict[str, Any]) -> None:
        """Add ``item`` to the list ``key`` that every write keeps (e.g. ``ended_early``), and write it."""
        self.notes.setdefault(key, []).append(item)
        self.beat()

    def _about(self) -> dict[str, Any]:
        stuck = self.watch.stuck if self.watch is not None and not self._ended.is_set() else None
        return {
            **self.identity,
            **({"alarms": self.alarms} if self.alarms else {}),
            **self.notes,
            **({"stuck": stuck} if stuck else {}),
        }

    def end(self, state: str, **details: Any) -> None:
        """Stop the heartbeat and record the final ``state`` (finished / stopped / failed)."""
        with self._lock:
            self._ended.set()
            write_status(self.run_dir, state, step=self.step, ended_at=_now(), **self._about(), **details)

    def _run(self) -> None:
        failed = False
        while not self._ended.wait(self.interval):
            try:
                if self.watch is not None:
                    self.watch.check()
            except Exception as err:  # noqa: BLE001 - the stuck check must not stop the heartbeat
                if not failed:
                    logging.getLogger("trine.status").warning("the stuck check failed: %r", err)
                failed = True
            try:
                self.beat()
            except OSError:  # a full or vanished disk must not kill the run from this thread
                pass


def read_status(run_dir: str | Path) -> dict[str, Any]:
    """``run_dir/status.json`` as a dict (FileNotFoundError naming the file when there is none)."""
    path = Path(run_dir) / "status.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist; pass a run directory written by `trine run` (runs/<name>)."
        )
    return json.loads(path.read_text())


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (one owned by another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def describe(status: dict[str, Any], stale_after: float = STALE_SECONDS) -> tuple[str, str]:
    """``(state, why)``: ``running``, ``stuck``, ``dead``, ``finished``, ``stopped`` or ``failed``, and the
    reason.

    A ``running`` status is ``dead`` when its pid is gone (checked only on the host that wrote it) or
    its heartbeat is older than ``stale_after`` seconds (the only check from another host), else ``stuck``
    while it holds a ``stuck`` record (its step has not advanced for too long, :mod:`trine.monitor.progress`;
    the reason says for how long and what each side waits for).
    """
    state = status.get("state", "unknown")
    if state != "running":
        return state, status.get("reason") or status.get("error") or ""
    pid, host = status.get("pid"), status.get("host")
    if pid is not None and host == socket.gethostname() and not pid_alive(int(pid)):
        return "dead", f"process {pid} on {host} is gone"
    beat = status.get("heartbeat")
    if beat is None:
        return "dead", "no heartbeat recorded (written by an older trine, or killed at start)"
    age = time.time() - datetime.fromisoformat(beat).timestamp()
    if age > stale_after:
        return "dead", f"last heartbeat {age:.0f}s ago (stale after {stale_after:.0f}s)"
    stuck = status.get("stuck")
    if isinstance(stuck, dict):
        return "stuck", str(stuck.get("reason") or "its step has not advanced for too long")
    return "running", f"pid {pid} on {host}, heartbeat {age:.0f}s ago"


class Terminated(KeyboardInterrupt):
    """SIGTERM during a command (``trine run``): handled like Ctrl-C (status ``stopped``, resumable),
    exit code 143."""


STOP_GRACE_SECONDS = 60.0
"""How long a stop waits for the step in progress to end (then it stops at once, without a checkpoint of
that step: the run resumes from the one before)."""
REPEAT_SECONDS = 2.0
"""A stop signal this soon after the first is the same stop delivered twice (to the process group by the
terminal and again by a launcher that forwards it), not a second one."""

_stop: list[type[KeyboardInterrupt]] = []  # the stop signals received, in order
_boundaries = threading.Event()  # set while a loop stops at step boundaries (:func:`at_step_boundaries`)
_first_at = [0.0]  # time.monotonic() of the first stop signal
_grace: list[threading.Timer] = []  # the running grace timer, if any
_forced = threading.Event()  # set when the grace timer delivers the stop again


def on_stop_signal(signum: int, frame: Any) -> None:
    """Signal handler for SIGINT (``KeyboardInterrupt``) and SIGTERM (:class:`Terminated`).

    Inside :func:`at_step_boundaries` (the steps of a run) the first stop is only recorded: the loop
    finishes the step in progress, writes a checkpoint at that step and raises it (:func:`check_stop`), so
    that the same command resumes with no step lost or trained twice. If that step does not end within
    :data:`STOP_GRACE_SECONDS`, or a second stop signal arrives (not within :data:`REPEAT_SECONDS`: that
    is the same one twice), the stop is raised at once, without that checkpoint. Outside, it is recorded
    and raised at once. An exception raised from a signal handler lands wherever the main thread is; if
    that place swallows it (a ``__del__``, a library's broad ``except``), the record stays, and
    :func:`check_stop` raises it again at the run's next step boundary."""
    import signal

    now = time.monotonic()
    if _stop and now - _first_at[0] < REPEAT_SECONDS and not _forced.is_set():
        return  # the same stop, delivered twice
    kind = Terminated if signum == signal.SIGTERM else KeyboardInterrupt
    _stop.append(kind)
    if len(_stop) == 1:
        _first_at[0] = now
    if len(_stop) == 1 and _boundaries.is_set():
        timer = threading.Timer(STOP_GRACE_SECONDS, _stop_now, args=(signum,))
        timer.daemon = True
        timer.start()
        _grace.append(timer)
        name = "SIGTERM" if kind is Terminated else "Ctrl-C"
        again = "send SIGTERM again" if kind is Terminated else "press Ctrl-C again"
        _say(
            f"{name}: stopping after the step in progress, with a checkpoint (at most "
            f"{STOP_GRACE_SECONDS:g}s; {again} to stop at once, resuming from the checkpoint before)"
        )
        return
    raise kind()


def _stop_now(signum: int) -> None:
    """The grace timer: deliver the stop signal again to the main thread, which then raises it."""
    import signal

    _say(
        f"the step in progress did not end within {STOP_GRACE_SECONDS:g}s: stopping now, without its checkpoint"
    )
    _forced.set()
    signal.pthread_kill(threading.main_thread().ident, signum)


def _say(text: str) -> None:
    """A line on stderr from a signal handler (``os.write``: never re-enters a buffered stream)."""
    try:
        os.write(2, f"{text}\n".encode())
    except OSError:
        pass


@contextlib.contextmanager
def at_step_boundaries() -> Iterator[None]:
    """While the block runs, a first stop signal waits for the loop's next step boundary (see
    :func:`on_stop_signal`); the loop asks :func:`stop_requested` there."""
    _boundaries.set()
    try:
        yield
    finally:
        _boundaries.clear()
        stopping()


def stop_requested() -> bool:
    """Whether a stop signal was received (the loop then checkpoints and calls :func:`check_stop`)."""
    return bool(_stop)


def stopping() -> None:
    """The loop has reached its step boundary and is writing its checkpoint: the grace timer is off."""
    while _grace:
        _grace.pop().cancel()


def check_stop() -> None:
    """Raise the first stop signal received, if any (called between steps and before a run records
    how it ended)."""
    if _stop:
        raise _stop[0]()


def clear_stop() -> None:
    """Forget received stop signals (a command starting)."""
    stopping()
    _stop.clear()
    _forced.clear()
