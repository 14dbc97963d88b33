"""The blocking-call pool: bounded concurrency, daemon workers, stuck workers replaced, exit guard."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from trine.blocking import BlockingPool, CallTimeout, run_blocking, use_pool


def test_calls_run_in_daemon_threads_at_most_max_workers_at_once():
    pool = BlockingPool(2, name="t-cap")
    running, peak, lock = [0], [0], threading.Lock()

    def work(i: int) -> tuple[int, bool]:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.1)
        with lock:
            running[0] -= 1
        return i, threading.current_thread().daemon

    async def main():
        return await asyncio.gather(*(pool.call(work, i) for i in range(6)))

    start = time.monotonic()
    assert asyncio.run(main()) == [(i, True) for i in range(6)]
    assert peak[0] == 2 and 0.28 < time.monotonic() - start < 2.0
    pool.close()


def test_a_call_past_its_timeout_is_abandoned_and_its_worker_replaced(caplog):
    pool = BlockingPool(1, name="t-stuck")
    release = threading.Event()

    async def main():
        with pytest.raises(CallTimeout, match="wait did not return within 0.2s"):
            await pool.call(release.wait, timeout=0.2, label="wait")
        assert pool.stuck == 1 and pool.abandoned == 1
        return await pool.call(lambda: "fresh worker", timeout=1.0)  # the only slot was not lost

    with caplog.at_level("WARNING", logger="trine.blocking"):
        assert asyncio.run(main()) == "fresh worker"
    assert "1 worker threads of t-stuck are stuck in calls that timed out (latest: wait)" in caplog.text
    release.set()
    deadline = time.monotonic() + 5
    while pool.stuck and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.stuck == 0  # the abandoned thread finished its call and left
    pool.close()


def test_cancelling_the_caller_abandons_a_running_call_and_drops_a_queued_one():
    pool = BlockingPool(1, name="t-cancel")
    release, ran = threading.Event(), []

    async def main():
        use_pool(pool)
        hung = asyncio.ensure_future(run_blocking(release.wait))
        queued = asyncio.ensure_future(run_blocking(ran.append, "queued"))
        await asyncio.sleep(0.1)
        queued.cancel()  # first, or the worker replacing the hung one could start it
        hung.cancel()
        await asyncio.gather(hung, queued, return_exceptions=True)
        return await run_blocking(lambda: "after")

    assert asyncio.run(main()) == "after"
    assert pool.abandoned == 1 and ran == []  # the queued call never ran
    release.set()
    pool.close()


def test_exceptions_of_the_call_reach_the_caller_unchanged():
    pool = BlockingPool(1)

    def boom(kind: type[Exception]):
        raise kind("inside")

    async def main():
        with pytest.raises(ValueError, match="inside"):
            await pool.call(boom, ValueError, timeout=1.0)
        with pytest.raises(TimeoutError, match="inside"):  # the function's own, not CallTimeout
            await pool.call(boom, TimeoutError, timeout=1.0)

    asyncio.run(main())
    assert pool.abandoned == 0
    with pytest.raises(ValueError, match="max_workers=0"):
        BlockingPool(0)
    pool.close()


def _python(code: str, timeout: float = 30) -> tuple[subprocess.CompletedProcess, float]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout
    )
    return proc, time.monotonic() - start


def test_exit_guard_ends_a_process_that_a_stuck_thread_would_keep_alive():
    proc, seconds = _python(
        """
        import sys, threading, time
        from trine.blocking import exit_guard
        threading.Thread(target=time.sleep, args=(1e9,), name="plugin-sleeper").start()  # not a daemon
        print("run ended", flush=True)
        assert not exit_guard(3, grace=0.5)  # not the trine command: a host's exit is left alone
        sys.argv[0] = "/venv/bin/trine"  # as the console script sees it
        assert exit_guard(3, grace=0.5)
        """
    )
    assert proc.returncode == 3 and seconds < 15
    assert "run ended" in proc.stdout
    assert "would keep the process alive: plugin-sleeper" in proc.stderr


def test_exit_guard_leaves_a_clean_exit_alone():
    proc, _ = _python(
        """
        import atexit, sys, threading, time
        from trine.blocking import exit_guard
        atexit.register(lambda: print("atexit ran", flush=True))
        threading.Thread(target=time.sleep, args=(0.3,), name="short").start()
        sys.argv[0] = "trine"
        assert exit_guard(5, grace=5.0)
        sys.exit(0)
        """
    )
    assert proc.returncode == 0 and "atexit ran" in proc.stdout and proc.stderr == ""
