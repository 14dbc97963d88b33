"""Mode ``async`` in one process: the explorer side runs in a thread and explores batch after batch
from its own copy of the weights, picking up the newest version the trainer pushed (every
``sync_interval`` steps) between batches; the trainer side takes ``trainer.batch_size`` experiences
from the buffer as soon as they are there. They meet only at the buffer and at weight sync.

The explorer streams (:func:`trine.explorer.streaming.stream`): it keeps ``tasks.batch_size ×
explorer.oversample`` tasks in flight and puts a batch as soon as ``tasks.batch_size`` of them have
finished, so a slow task holds no batch (it lands in a later one, tagged with the version it started
with: ``explorer/version_spread``).

Staleness: the buffer never hands out an experience more than ``buffer.max_staleness`` versions
behind the trainer (it drops it, ``buffer/dropped_stale``), and the explorer paces itself so that it
rarely has to: it starts tasks only when the trainer will train them within ``max_staleness``
(counting the experiences already waiting and the tasks in flight), and holds back otherwise
(``explorer/paced_seconds``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial

from trine.buffer import Buffer, BufferTimeout
from trine.config import RunConfig
from trine.explorer.side import ExplorerSide
from trine.explorer.streaming import Produce, stream
from trine.stage import Stage
from trine.trainer.side import TrainerSide

POLL_SECONDS = 0.5
"""How long the trainer waits for a batch before it checks whether the explorer ended or failed."""


def steps(stage: Stage) -> Iterator[dict[str, float]]:
    """One metrics dict per training step: the step's, plus what the explorer did since the last one."""
    explorer, trainer = stage.explorer, stage.trainer
    assert explorer is not None
    limit = stage.cfg.buffer.max_staleness
    stop, ended, errors = threading.Event(), threading.Event(), []
    assert trainer.buffer is not None and trainer.batch_size is not None
    queue = partial(queued_steps, trainer.buffer, trainer.batch_size)

    def explore() -> None:
        def admit(version: int, waiting: int) -> bool:  # waiting: tasks started, not yet put
            if limit is None:
                return True
            ahead = trainer.version + trainer.stepping + queue() + math.ceil(waiting / explorer.batch_size)
            return ahead - version <= limit

        try:
            stream(explorer, lambda: _newest(explorer), admit, stop, _produce(stage.cfg))
        except BaseException as err:  # surfaced in the trainer's thread
            if not stop.is_set():
                errors.append(err)
        finally:
            ended.set()

    thread = threading.Thread(target=explore, name="trine-explorer", daemon=True)
    thread.start()
    try:
        while stage.step < stage.total_steps:
            try:
                metrics = trainer.consume(timeout=POLL_SECONDS)
            except BufferTimeout:
                if errors:
                    raise errors[0] from None
                if ended.is_set() and not _can_step(trainer):
                    return  # the tasks ran out
                continue
            yield {**explorer.report_all(), **metrics}
    finally:
        stop.set()
        explorer.sync.close()
        thread.join()


def _produce(cfg: RunConfig) -> Produce:
    e = cfg.explorer
    return Produce(oversample=e.oversample, tail_seconds=e.tail_seconds, partial_rollout=e.partial_rollout)


def _newest(explorer: ExplorerSide) -> int:
    """The newest weights version the trainer pushed (the explorer's own if none is waiting)."""
    latest = explorer.sync.latest()
    return explorer.engine.policy_version if latest is None else max(latest, explorer.engine.policy_version)


def trainer_steps(stage: Stage) -> Iterator[dict[str, float]]:
    """A trainer process (``trine train``): publish the current weights, then train on what explorer
    processes put in the shared buffer, waiting up to ``sync.wait_timeout`` for each batch."""
    trainer, cfg = stage.trainer, stage.cfg
    assert trainer.sync is not None
    trainer.sync.push(trainer.trainer.model, trainer.version)  # explorers start (again) from these weights
    waited = 0.0
    while stage.step < stage.total_steps:
        try:
            metrics = trainer.consume(timeout=POLL_SECONDS)
        except BufferTimeout:
            waited += POLL_SECONDS
            limit = cfg.sync.wait_timeout
            if limit is not None and waited >= limit:
                raise TimeoutError(
                    f"no batch of {trainer.batch_size} experiences arrived in {limit:.0f}s; is `trine explore` "
                    "running on this run directory? (sync.wait_timeout sets how long the trainer waits)"
                ) from None
            continue
        waited = 0.0
        yield metrics


def queued_steps(buffer: Buffer, batch_size: int) -> int:
    """Training steps the experiences already in the buffer (ready or pending) will fill."""
    m = buffer.metrics()
    return math.ceil((m["buffer/size"] + m["buffer/pending"]) / batch_size)


def _can_step(trainer: TrainerSide) -> bool:
    assert trainer.buffer is not None and trainer.batch_size
    return trainer.buffer.metrics()["buffer/size"] >= trainer.batch_size


def pace(
    explorer: ExplorerSide,
    trainer_at: Callable[[], int],
    queued: Callable[[], int],
    limit: int | None,
    stop: threading.Event,
) -> tuple[int, float]:
    """The weights version to explore the next batch with (the newest pushed), once a batch explored
    now would be trained within ``limit`` versions of it: the trainer will train it at ``trainer_at()``
    (its version, counting a step in flight) plus ``queued()`` steps already waiting. Returns the
    version and the seconds waited."""
    start = time.perf_counter()
    while True:
        version = _newest(explorer)
        if limit is None or stop.is_set() or trainer_at() + queued() - version <= limit:
            return version, time.perf_counter() - start
        stop.wait(0.02)
