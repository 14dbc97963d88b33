"""Blocking calls from async code, bounded by the caller's timeout: a pool of daemon worker threads.

asyncio's default executor (``asyncio.to_thread``) keeps a thread whose call hangs forever: after as
many hangs as it has threads every later call waits behind them, and because its threads are not
daemon threads the process cannot exit. :class:`BlockingPool` instead:

- runs at most ``max_workers`` calls at once, each in a **daemon** worker thread;
- when the awaiting coroutine gives up — a ``timeout`` passed to :meth:`BlockingPool.call`, or its
  task being cancelled (e.g. the explorer's task timeout) — a call that has started is
  *abandoned*: its thread is left to finish on its own (it exits when the call returns, or with the
  process), no longer counts against ``max_workers``, and a fresh worker takes its place; a call
  still queued is dropped;
- counts abandoned threads that are still running (:attr:`BlockingPool.stuck`) and logs a warning
  when they reach ``max_workers``, then twice as many, and so on.

The explorer runs reward functions through its pool, and sets it as the *current* pool of each
task, so a workflow's blocking calls (:func:`run_blocking`, e.g. a step-wise environment's
``reset``/``step``) are bounded by the task timeout too. :func:`exit_guard` keeps a process from
hanging at exit on threads a run left behind.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("trine.blocking")

DEFAULT_WORKERS = 32
"""Size of the pool used outside an explorer (e.g. a workflow run directly in a test)."""
IDLE_SECONDS = 60.0
"""A worker with nothing to do for this long exits (a new one starts when work comes)."""


class CallTimeout(Exception):
    """A call did not return within its timeout (its thread was abandoned).

    Not a ``TimeoutError``, so that code waiting with its own timeout (``asyncio.wait_for``) never
    mistakes it for its own.
    """


@dataclass(eq=False)
class _Job:
    fn: Callable[..., Any]
    args: tuple
    label: str
    loop: asyncio.AbstractEventLoop
    started: asyncio.Future
    done: asyncio.Future
    state: str = "queued"
    """queued -> running -> done, or queued -> dropped, or running -> abandoned -> done."""
    thread: threading.Thread | None = field(default=None, repr=False)


class BlockingPool:
    """At most ``max_workers`` blocking calls at once, in daemon threads; stuck workers are replaced.

    Args:
        max_workers: calls that run at once; more wait in a queue (first in, first out).
        name: prefix of the worker threads' names.
    """

    def __init__(self, max_workers: int = DEFAULT_WORKERS, name: str = "trine-blocking") -> None:
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise ValueError(f"BlockingPool: max_workers={max_workers!r}; expected an integer >= 1.")
        self.max_workers = max_workers
        self.name = name
        self.abandoned = 0
        """Calls abandoned so far (each one's thread was replaced)."""
        self._cond = threading.Condition()
        self._jobs: deque[_Job] = deque()
        self._workers = 0  # live workers, abandoned ones not counted
        self._idle = 0
        self._stuck: dict[threading.Thread, str] = {}
        self._warn_at = max_workers
        self._serial = 0
        self._closed = False

    @property
    def stuck(self) -> int:
        """Abandoned calls whose threads are still running."""
        with self._cond:
            return len(self._stuck)

    async def call(
        self, fn: Callable[..., Any], /, *args: Any, timeout: float | None = None, label: str = ""
    ) -> Any:
        """``fn(*args)`` in a worker thread; returns its result or raises its exception.

        ``timeout`` counts from when the call starts running (not while it waits for a worker);
        past it, :class:`CallTimeout` is raised and the worker abandoned. Cancelling the awaiting
        task abandons it as well. Pass keyword arguments with ``functools.partial``.
        """
        loop = asyncio.get_running_loop()
        job = _Job(fn, args, label or _name(fn), loop, loop.create_future(), loop.create_future())
        self._submit(job)
        try:
            await job.started
            if timeout is None:
                return await job.done
            try:
                return await asyncio.wait_for(job.done, timeout)
            except TimeoutError:
                if job.done.done() and not job.done.cancelled():  # the fn itself raised a TimeoutError
                    raise
                raise CallTimeout(f"{job.label} did not return within {timeout}s") from None
        except (CallTimeout, asyncio.CancelledError):
            self._give_up(job)
            raise

    def close(self) -> None:
        """Let idle workers exit; running calls finish first. Later calls start new workers."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # ------------------------------------------------------------------ internals
    def _submit(self, job: _Job) -> None:
        with self._cond:
            self._closed = False
            self._jobs.append(job)
            self._cond.notify()
            self._spawn_if_needed()

    def _spawn_if_needed(self) -> None:
        """Start a worker when queued jobs outnumber idle workers and there is room (lock held)."""
        if len(self._jobs) > self._idle and self._workers < self.max_workers:
            self._workers += 1
            self._serial += 1
            name = f"{self.name}-{self._serial}"
            threading.Thread(target=self._work, name=name, daemon=True).start()

    def _give_up(self, job: _Job) -> None:
        with self._cond:
            if job.state == "queued":
                self._jobs.remove(job)
                job.state = "dropped"
                return
            if job.state != "running":
                return
            job.state = "abandoned"
            self.abandoned += 1
            self._workers -= 1
            assert job.thread is not None
            self._stuck[job.thread] = job.label
            stuck = len(self._stuck)
            self._spawn_if_needed()
            warn = stuck >= self._warn_at
            if warn:
                self._warn_at *= 2
        if warn:
            log.warning(
                "%d worker threads of %s are stuck in calls that timed out (latest: %s); each stays until "
                "its call returns. A reward or environment that can hang should use its own timeouts.",
                stuck,
                self.name,
                job.label,
            )

    def _work(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                self._idle += 1
                while not self._jobs and not self._closed:
                    if not self._cond.wait(IDLE_SECONDS):
                        break
                self._idle -= 1
                if not self._jobs:  # closed, or idle for IDLE_SECONDS
                    self._workers -= 1
                    return
                job = self._jobs.popleft()
                job.state, job.thread = "running", me
            _settle(job.loop, job.started, None, None)
            try:
                result, error = job.fn(*job.args), None
            except BaseException as err:  # handed to the caller
                result, error = None, err
            with self._cond:
                abandoned = job.state == "abandoned"
                job.state = "done"
                if abandoned:  # a fresh worker replaced this thread: leave
                    self._stuck.pop(me, None)
            _settle(job.loop, job.done, result, error)
            if abandoned:
                return


def _settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future, result: Any, error: Any) -> None:
    """Complete ``future`` from a worker thread (nothing if it was cancelled or its loop closed)."""

    def settle() -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the event loop was closed meanwhile
        pass


def _name(fn: Callable[..., Any]) -> str:
    inner = getattr(fn, "func", fn)  # functools.partial
    return getattr(inner, "__qualname__", None) or repr(inner)


# --------------------------------------------------------------------------- the current pool

_current: contextvars.ContextVar[BlockingPool | None] = contextvars.ContextVar(
    "trine_blocking_pool", default=None
)
_default: BlockingPool | None = None
_default_lock = threading.Lock()


def use_pool(pool: BlockingPool) -> contextvars.Token:
    """Make ``pool`` the current pool of this task and the tasks it starts; returns the reset token."""
    return _current.set(pool)


def current_pool() -> BlockingPool:
    """The pool set by :func:`use_pool` (the explorer's), else a process-wide default pool."""
    global _default
    pool = _current.get()
    if pool is not None:
        return pool
    with _default_lock:
        if _default is None:
            _default = BlockingPool(DEFAULT_WORKERS, name="trine-blocking")
        return _default


async def run_blocking(fn: Callable[..., Any], /, *args: Any, timeout: float | None = None) -> Any:
    """``await run_blocking(env.step, action)``: run a blocking call in the current pool.

    Workflows use it for every call that may block (environment construction, ``reset``, ``step``,
    a tool, a subprocess) so the explorer's task timeout bounds it: when the task is cancelled the
    call is abandoned and its worker replaced. ``timeout`` additionally bounds this one call
    (:class:`CallTimeout`).
    """
    return await current_pool().call(fn, *args, timeout=timeout)


# --------------------------------------------------------------------------- process exit


def exit_guard(code: int, grace: float = 3.0) -> bool:
    """Make sure the ``trine`` process exits with ``code`` even if threads left behind would block it.

    Python joins every non-daemon thread at exit, so one stuck thread (e.g. started by a plugin)
    keeps a finished run's process alive forever. When such threads are alive, a daemon watchdog
    waits for the interpreter to start shutting down, gives them ``grace`` seconds, then prints the
    ones still running, flushes stdout/stderr and ends the process with ``os._exit(code)``. A normal
    exit (nothing stuck) is untouched: atexit handlers run as usual.

    Only a process started as the ``trine`` command (``trine ...`` or ``python -m trine.cli``) is
    guarded, never a host that called the command in-process (e.g. pytest with typer's CliRunner),
    whose own exit code must not be replaced. Returns whether the watchdog was started.
    """
    if not _is_trine_command() or not _blocking_threads():
        return False
    threading.Thread(target=_watch_exit, args=(code, grace), name="trine-exit-guard", daemon=True).start()
    return True


def _is_trine_command() -> bool:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return getattr(spec, "name", None) == "trine.cli" or os.path.basename(sys.argv[0] or "") in (
        "trine",
        "trine.exe",
    )


def _blocking_threads() -> list[threading.Thread]:
    main = threading.main_thread()
    return [t for t in threading.enumerate() if t is not main and not t.daemon and t.is_alive()]


def _watch_exit(code: int, grace: float) -> None:
    while not (getattr(threading, "_SHUTTING_DOWN", False) or not threading.main_thread().is_alive()):
        time.sleep(0.1)
    deadline = time.monotonic() + grace
    for thread in _blocking_threads():
        thread.join(max(0.0, deadline - time.monotonic()))
    left = _blocking_threads()
    if not left:
        return
    names = ", ".join(sorted(t.name for t in left))
    print(
        f"trine: exiting with code {code}; {len(left)} thread(s) still running {grace:.0f}s after the run "
        f"ended would keep the process alive: {names}",
        file=sys.stderr,
    )
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


__all__ = ["BlockingPool", "CallTimeout", "current_pool", "exit_guard", "run_blocking", "use_pool"]
