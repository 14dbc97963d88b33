"""The streaming explorer of mode async: tasks in flight all
the time, a batch put as soon as enough of them have finished.

The produce strategies (:class:`Produce`, from the ``explorer:`` section):

- **over-sampling** (``oversample``): it keeps ``ceil(tasks.batch_size × oversample)`` tasks running on
  the explorer's event loop and puts a batch when ``tasks.batch_size`` of them have finished, in the order
  they finish: a slow task holds no batch, it lands in a later one, tagged with the weights version it
  started with (``explorer/version_min``, ``explorer/version_spread``).
- **tail batch** (``tail_seconds``): a task that has run longer than this stops counting as in flight, so
  another starts in its place and the batches go on without it; it joins the batch being formed when it
  ends (``explorer/tail_deferred``: tasks deferred so).
- **partial rollout** (``partial_rollout``): new weights are loaded as soon as they are pushed, between
  two tokens of the running generations, which go on under them (see :mod:`trine.models.engine`); each
  token keeps the version it was sampled with (``info["token_versions"]``, ``explorer/partial_samples``).
  Without it, new weights are loaded only between two generations, before new tasks start.

Before starting more tasks it asks ``admit`` whether the trainer will take them within the staleness
bound (``explorer/paced_seconds``: how long it held back). Tasks drawn but not yet put are kept in the
side's state, so a checkpoint loses none of them.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trine.explorer.shaping import pass_rates
from trine.types import Task

if TYPE_CHECKING:
    from trine.explorer.side import ExplorerSide


@dataclass(frozen=True)
class Produce:
    """How a streaming explorer produces batches (``explorer.oversample``, ``explorer.tail_seconds``,
    ``explorer.partial_rollout``; see the module docstring)."""

    oversample: float = 1.0
    tail_seconds: float | None = None
    partial_rollout: bool = False


def stream(
    side: ExplorerSide,
    newest: Callable[[], int],
    admit: Callable[[int, int], bool],
    stop: threading.Event,
    produce: Produce = Produce(),
    on_put: Callable[[], None] | None = None,
) -> str:
    """Explore continuously (mode async): keep ``ceil(batch_size × oversample)`` tasks in flight and
    put a batch as soon as ``batch_size`` of them have finished, in the order they finish — slow
    tasks carry over to a later batch instead of holding this one, each tagged with the weights
    version it started with. It loads the ``newest()`` weights before it starts more tasks (or at once,
    with partial rollout), and starts tasks only while ``admit(version, tasks_not_yet_put)`` says the
    trainer will take them in time (``explorer/paced_seconds``: how long it held back); ``on_put()``
    runs after each put. Returns why it stopped."""
    return side.explorer.loop.run_until_complete(_stream(side, newest, admit, stop, produce, on_put))


async def _stream(
    side: ExplorerSide,
    newest: Callable[[], int],
    admit: Callable[[int, int], bool],
    stop: threading.Event,
    produce: Produce,
    on_put: Callable[[], None] | None,
) -> str:
    loop = asyncio.get_running_loop()
    target = max(side.batch_size, math.ceil(side.batch_size * produce.oversample))
    drawn: deque[Task] = deque(side.unfinished)  # tasks a checkpoint saw drawn but not put
    with side.gate:
        side._started = {id(t): t for t in side.unfinished}
        side.unfinished = []
    running: dict[asyncio.Future, int] = {}
    started: dict[asyncio.Future, float] = {}  # of the tasks still counted in flight (tail batch)
    finished: list[tuple[Any, int]] = []
    exhausted, paced, since, deferred = False, 0.0, time.perf_counter(), 0
    while not stop.is_set():
        if produce.tail_seconds is not None:
            late = [f for f, t0 in started.items() if time.perf_counter() - t0 > produce.tail_seconds]
            for f in late:  # runs on, but no longer holds a place in flight
                del started[f]
            deferred += len(late)
        counted = len(started) if produce.tail_seconds is not None else len(running)
        waiting = len(running) + len(finished)
        version = newest()
        if produce.partial_rollout and version != side.engine.policy_version:
            await loop.run_in_executor(None, side.sync.pull, side.engine, version)  # between two tokens
        if not exhausted and counted + len(finished) < target:
            if admit(version, waiting):
                if version != side.engine.policy_version:  # between generations (HFEngine.call)
                    await loop.run_in_executor(None, side.sync.pull, side.engine, version)
                while counted < target - len(finished):
                    if not drawn:
                        with side.gate:  # a checkpoint sees the cursor and the open tasks together
                            drawn.extend(side.scheduler.next_batch(side.batch_size))
                            side._started.update((id(t), t) for t in drawn)
                        if not drawn:
                            exhausted = True
                            break
                    task = drawn.popleft()
                    future = asyncio.ensure_future(side.explorer.run_one(task))
                    running[future], started[future] = version, time.perf_counter()
                    counted += 1
            else:
                paced += 0.02
        if exhausted and not running and not finished:
            return "its tasks ran out"
        if running:
            done, _ = await asyncio.wait(running, timeout=0.02, return_when=asyncio.FIRST_COMPLETED)
            for f in done:
                started.pop(f, None)
                finished.append((f.result(), running.pop(f)))
        else:
            await asyncio.sleep(0.02)
        while len(finished) >= side.batch_size or (finished and exhausted and not running):
            batch, finished = finished[: side.batch_size], finished[side.batch_size :]
            seconds, since = time.perf_counter() - since, time.perf_counter()
            with side.gate:
                _put_batch(side, batch, seconds, paced, deferred)
            paced, deferred = 0.0, 0
            if on_put is not None:
                on_put()
    for future in running:  # the run ended: tasks still in flight are dropped (a checkpoint kept them)
        future.cancel()
    if running:
        await asyncio.wait(running, timeout=5.0)
    return "stopped"


def _put_batch(
    side: ExplorerSide, batch: list[tuple[Any, int]], seconds: float, paced: float, deferred: int
) -> None:
    for (task, _, _), _ in batch:
        side._started.pop(id(task), None)
    index = side.batches
    versions = [v for _, v in batch]
    experiences, metrics = side.explorer.assemble([d for d, _ in batch], index, versions, seconds)
    partial = sum(1 for e in experiences if e.info.get("version_spread"))
    newest = max([*versions, *(e.policy_version + e.info.get("version_spread", 0) for e in experiences)])
    side.scheduler.feedback(*pass_rates(experiences, side.success_threshold))
    experiences = side._shape(experiences, metrics, index, min(versions), refill=False)
    if side.operators is not None:
        experiences, op_metrics = side.operators(experiences, step=index)
        metrics.update(op_metrics)
    if side.expert is not None:
        experiences = experiences + side.expert.rows(len(experiences), min(versions))
    metrics.update({"explorer/paced_seconds": paced, "explorer/version_min": float(min(versions))})
    metrics["explorer/version_spread"] = float(newest - min(versions))
    metrics["explorer/partial_samples"] = float(partial)
    metrics["explorer/tail_deferred"] = float(deferred)
    side._put(experiences, metrics)
