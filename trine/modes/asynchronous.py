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
rarely has to: it starts a task only when the trainer will train it within ``max_staleness``
(:class:`trine.explorer.pacing.Pacing`: counting the rows already waiting and the tasks in flight), and
holds back otherwise (``explorer/paced_seconds``).

The trainer never waits silently: without a batch for ``sync.wait_timeout`` seconds it stops with a
``TimeoutError`` that says what it waits for (rows ready and needed, tasks in flight, the explorer's state).
A stop signal ends its wait for a batch at once (:mod:`trine.loop` then checkpoints the step it is at).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from functools import partial

from trine.buffer import BufferTimeout
from trine.config import RunConfig
from trine.explorer.pacing import Pacing, rows_queued
from trine.explorer.streaming import Produce, stream
from trine.stage import Stage
from trine.status import stop_requested

POLL_SECONDS = 0.5
"""How long the trainer waits for a batch before it checks whether the explorer ended or failed."""


def steps(stage: Stage) -> Iterator[dict[str, float]]:
    """One metrics dict per training step: the step's, plus what the explorer did since the last one."""
    explorer, trainer, cfg = stage.explorer, stage.trainer, stage.cfg
    assert explorer is not None and trainer.buffer is not None and trainer.batch_size is not None
    buffer, need = trainer.buffer, trainer.batch_size
    pacing = Pacing(cfg.buffer.max_staleness, need, cfg.tasks.train.repeat)
    stop, ended, errors = threading.Event(), threading.Event(), []

    def explore() -> None:
        try:
            trainer_at = lambda: trainer.version + trainer.stepping  # noqa: E731 - the trainer's view
            why = stream(
                explorer, pacing, trainer_at, partial(rows_queued, buffer), stop, produce_strategies(cfg)
            )
            explorer.activity.state = f"ended: {why}"
        except BaseException as err:  # surfaced in the trainer's thread
            explorer.activity.state = f"ended: failed ({type(err).__name__}: {err})"
            if not stop.is_set():
                errors.append(err)
        finally:
            ended.set()

    thread = threading.Thread(target=explore, name="trine-explorer", daemon=True)
    thread.start()
    try:
        since = time.monotonic()
        while stage.step < stage.total_steps:
            try:
                metrics = trainer.consume(timeout=POLL_SECONDS)
            except BufferTimeout:
                if errors:
                    raise errors[0] from None
                if stop_requested():
                    return  # a stop signal: the loop checkpoints the step it is at
                if ended.is_set() and buffer.metrics()["buffer/size"] < need:
                    return  # the tasks ran out
                limit = cfg.sync.wait_timeout
                if limit is not None and time.monotonic() - since >= limit:
                    raise TimeoutError(_waiting(stage, time.monotonic() - since)) from None
                continue
            since = time.monotonic()
            yield {**explorer.report_all(), **metrics}
    finally:
        stop.set()
        explorer.sync.close()
        thread.join()


def _waiting(stage: Stage, seconds: float) -> str:
    """What a trainer that waited ``seconds`` without a batch waits for, and how to go on."""
    explorer, trainer, cfg = stage.explorer, stage.trainer, stage.cfg
    assert explorer is not None and trainer.buffer is not None
    m = trainer.buffer.metrics()
    return (
        f"the trainer waited {seconds:.1f}s for a batch (sync.wait_timeout={cfg.sync.wait_timeout}): "
        f"{m['buffer/size']:.0f} of {trainer.batch_size} rows ready ({m['buffer/pending']:.0f} pending a "
        f"reward), {explorer.activity.describe()}. Look at the workflow (explorer.timeout bounds one task) "
        "and at buffer.max_staleness / operators that drop rows, or raise sync.wait_timeout (null waits "
        "for ever)."
    )


def produce_strategies(cfg: RunConfig) -> Produce:
    """The stream's produce strategies from the ``explorer`` section."""
    e = cfg.explorer
    return Produce(oversample=e.oversample, tail_seconds=e.tail_seconds, partial_rollout=e.partial_rollout)


def trainer_steps(stage: Stage) -> Iterator[dict[str, float]]:
    """A trainer process (``trine train``): publish the current weights, then train on what explorer
    processes put in the shared buffer, waiting up to ``sync.wait_timeout`` for each batch. Stops earlier
    (:class:`~trine.launch.liveness.PeerGone`) once every explorer that wrote a status file is dead,
    stopped or failed and none came back within ``sync.wait_timeout`` (:mod:`trine.launch.liveness`).
    With ``buffer.end_after_idle``, a buffer idle that long after a trained step ends the stage at that
    step (finished: the loop checkpoints it)."""
    from trine.launch.liveness import ExplorersWatch, PeerGone
    from trine.trainer.sources import BufferIdle

    trainer, cfg = stage.trainer, stage.cfg
    assert trainer.sync is not None
    trainer.sync.push(trainer.trainer.model, trainer.version)  # explorers start (again) from these weights
    limit = cfg.sync.wait_timeout
    explorers = ExplorersWatch(cfg.run_path, limit)
    idle_after = cfg.buffer.end_after_idle
    idle = None if idle_after is None else BufferIdle(trainer.buffer, idle_after)
    waited = 0.0
    while stage.step < stage.total_steps:
        try:
            metrics = trainer.consume(timeout=POLL_SECONDS)
        except BufferTimeout:
            waited += POLL_SECONDS
            if stop_requested():
                return  # a stop signal: the loop checkpoints the step it is at
            if idle is not None and stage.step > 0 and (why := idle.why()):
                stage.total_steps = stage.step  # the last step trained ends the stage
                print(f"stage {cfg.stage} ends at its step {stage.step}: {why}", flush=True)
                return
            if gone := explorers.check():
                raise PeerGone(gone) from None
            if limit is not None and waited >= limit:
                seen = explorers.summary()
                seen = f"the explorers: {seen}" if seen else "is `trine explore` running on this run dir?"
                raise TimeoutError(
                    f"no batch of {trainer.batch_size} experiences arrived in {limit:.0f}s; {seen} "
                    "(sync.wait_timeout sets how long the trainer waits)"
                ) from None
            continue
        waited = 0.0
        if idle is not None:
            idle.reset()
        yield metrics
