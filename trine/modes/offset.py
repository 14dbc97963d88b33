"""Mode ``sync`` with ``sync_offset: m > 0``: an explorer thread runs m batches ahead of the trainer,
sampling a weight snapshot that is updated every ``sync_interval`` steps."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

from trine.stage import Stage
from trine.status import stop_requested

POLL_SECONDS = 0.5
"""How long the trainer waits for the explorer's next batch before it looks for a stop signal."""


def steps(stage: Stage) -> Iterator[dict[str, float]]:
    """Pipelined: batch b is explored with version ``k * ((b - m) // k)`` while the trainer trains."""
    explorer, trainer = stage.explorer, stage.trainer
    assert explorer is not None
    k, m, total = stage.cfg.sync.sync_interval, stage.cfg.sync.sync_offset, stage.total_steps
    ready: queue.Queue = queue.Queue()
    stop, errors = threading.Event(), []

    def explore() -> None:
        try:
            while explorer.batches < total and not stop.is_set():
                b = explorer.batches
                if not explorer.produce(max(0, k * ((b - m) // k)), stop=stop):
                    break
                ready.put(b)
        except BaseException as err:  # surfaced in the trainer's thread
            if not stop.is_set():
                errors.append(err)
        finally:
            ready.put(None)

    thread = threading.Thread(target=explore, name="trine-explorer", daemon=True)
    thread.start()
    finished = False
    try:
        while stage.step < total:
            while not trainer.batches_waiting() and not finished:
                if stop_requested():
                    return  # a stop signal: the loop checkpoints the step it is at
                try:
                    finished = ready.get(timeout=POLL_SECONDS) is None
                except queue.Empty:
                    continue
            if errors:
                raise errors[0]
            if not trainer.batches_waiting():
                return
            yield {**explorer.report(), **trainer.consume()}
    finally:
        stop.set()
        explorer.sync.close()
        thread.join()
