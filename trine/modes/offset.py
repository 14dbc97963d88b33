"""Mode ``sync`` with ``sync_offset: m > 0``: an explorer thread runs m batches ahead of the trainer,
from a weight snapshot updated every ``sync_interval`` steps."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

from trine import build
from trine.modes.common import explore_batches, train_on


def steps(st: build.Stage) -> Iterator[dict[str, float]]:
    """Pipelined: the explorer thread runs ``sync_offset`` batches ahead of the trainer."""
    k, m = st.cfg.sync.sync_interval, st.cfg.sync.sync_offset
    ready: queue.Queue = queue.Queue()
    stop, errors = threading.Event(), []

    def explore() -> None:
        b = st.step + len(st.pending)
        try:
            while b < st.total_steps and not stop.is_set():
                version = max(0, k * ((b - m) // k))
                st.sync.pull(st.engine, version)
                with st.gate:
                    if stop.is_set() or not explore_batches(st, b, 1, version):
                        break
                ready.put(b)
                b += 1
        except BaseException as err:  # surfaced in the trainer's thread
            if not stop.is_set():
                errors.append(err)
        finally:
            ready.put(None)

    thread = threading.Thread(target=explore, name="trine-explorer", daemon=True)
    thread.start()
    finished = False
    try:
        while st.step < st.total_steps:
            while not st.pending and not finished:
                finished = ready.get() is None
            if errors:
                raise errors[0]
            if not st.pending:
                return
            metrics = train_on(st)
            if st.trainer.version % k == 0:
                st.sync.push(st.trainer.model, st.trainer.version)
            yield metrics
    finally:
        stop.set()
        st.sync.close()
        thread.join()
