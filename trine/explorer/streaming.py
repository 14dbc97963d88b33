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

Before it starts a task it asks the pacing rule (:class:`trine.explorer.pacing.Pacing`) whether the
trainer will take it within the staleness bound (``explorer/paced_seconds``: how long it held back). When
it is held back with no task holding a place and the trainer cannot fill a batch without the rows it
has finished, it puts them as a smaller batch rather than hold them. Tasks drawn but not yet put are
kept in the side's state, so a checkpoint loses none of them; what the stream is doing is in
``side.activity``.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from trine.explorer.side import EXPLORING, PACED, WEIGHTS
from trine.types import Task

if TYPE_CHECKING:
    from trine.explorer.pacing import Pacing
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
    pacing: Pacing,
    trainer_at: Callable[[], int],
    rows_queued: Callable[[], int],
    stop: threading.Event,
    produce: Produce = Produce(),
    on_put: Callable[[], None] | None = None,
) -> str:
    """Explore continuously (mode async): keep ``ceil(batch_size × oversample)`` tasks in flight and
    put a batch as soon as ``batch_size`` of them have finished, in the order they finish — slow
    tasks carry over to a later batch instead of holding this one, each tagged with the weights
    version it started with. It loads the newest weights before it starts more tasks (or at once,
    with partial rollout), and starts each task only while ``pacing`` admits it, given the trainer's
    view: ``trainer_at()`` (its version counting a step in flight) and ``rows_queued()`` (rows in the
    buffer, ready or pending). ``on_put()`` runs after each put. Returns why it stopped."""
    run = _stream(side, pacing, trainer_at, rows_queued, stop, produce, on_put)
    return side.explorer.loop.run_until_complete(run)


async def _stream(
    side: ExplorerSide,
    pacing: Pacing,
    trainer_at: Callable[[], int],
    rows_queued: Callable[[], int],
    stop: threading.Event,
    produce: Produce,
    on_put: Callable[[], None] | None,
) -> str:
    """The loop of :func:`stream` on the explorer's event loop."""
    target = max(side.batch_size, math.ceil(side.batch_size * produce.oversample))
    flight = _Flight(deque(side.take_unfinished()), produce.tail_seconds)  # a checkpoint's drawn tasks first
    exhausted, paced, since, deferred = False, 0.0, time.perf_counter(), 0
    activity = side.activity
    activity.state = EXPLORING
    while not stop.is_set():
        if side.claims is not None:  # an explorer process keeps its claims while it runs them
            side.claims.renew()
        flight.drawn.extendleft(reversed(side.requeue(trainer_at())))  # dropped as stale: first in line
        deferred += flight.defer_late()
        version = side.newest_version()
        if produce.partial_rollout and version != side.engine.policy_version:
            await _pull(side, version)  # between two tokens
        flush = False
        if not exhausted and flight.holding < target:
            queued, others = rows_queued(), side.others_in_flight()
            if pacing.admits(version, trainer_at(), queued, flight.holding + others):
                if version != side.engine.policy_version:  # between generations (HFEngine.call)
                    await _pull(side, version)
                others_now = partial(side.others_in_flight, True)
                exhausted = flight.start(
                    side, target, version, partial(_admits, pacing, version, trainer_at, queued, others_now)
                )
                activity.state = EXPLORING
            else:
                paced += 0.02
                activity.state = PACED
                # nothing holds a place, and the trainer cannot fill a batch from the buffer without the rows this
                # stream has finished (other explorers' tasks in flight may be waiting the same way); an explorer
                # process beside others puts what it finished at once: it may wait long for a batch of its own
                # while the trainer steps on the others' rows, and its rows would age past the staleness bound
                flush = bool(flight.finished) and (
                    side.claims is not None or (not flight.started and queued < pacing.batch_rows)
                )
        activity.tasks_in_flight, activity.tasks_deferred = flight.holding, flight.deferred
        if exhausted and not flight.running and not flight.finished:
            return "its tasks ran out"
        await flight.wait()
        while flight.finished and (
            len(flight.finished) >= side.batch_size or flush or (exhausted and not flight.running)
        ):
            batch = flight.take(side.batch_size)
            seconds, since = time.perf_counter() - since, time.perf_counter()
            with side.gate:
                _put_batch(side, batch, seconds, paced, deferred)
            paced, deferred = 0.0, 0
            if on_put is not None:
                on_put()
    await flight.cancel()  # the run ended: tasks still in flight are dropped (a checkpoint kept them)
    return "stopped"


@dataclass
class _Flight:
    """The stream's tasks: drawn and not started, running (each with the version it started with), and
    finished but not yet put."""

    drawn: deque[Task]
    tail_seconds: float | None
    running: dict[asyncio.Future, int] = field(default_factory=dict)
    started: dict[asyncio.Future, float] = field(default_factory=dict)
    """Start times of the running tasks that still hold a place (all of them, without a tail batch)."""
    finished: list[tuple[Any, int]] = field(default_factory=list)

    @property
    def holding(self) -> int:
        """Tasks that hold a place: running and not deferred, or finished and not put."""
        return len(self.started) + len(self.finished)

    @property
    def deferred(self) -> int:
        """Running tasks that no longer hold a place (past ``tail_seconds``)."""
        return len(self.running) - len(self.started)

    def take(self, n: int) -> list[tuple[Any, int]]:
        """The first ``n`` finished tasks, in the order they finished, as a batch to put."""
        batch, self.finished = self.finished[:n], self.finished[n:]
        return batch

    def defer_late(self) -> int:
        """Tasks running longer than ``tail_seconds`` run on but stop holding a place; how many did now."""
        if self.tail_seconds is None:
            return 0
        now = time.perf_counter()
        late = [f for f, t0 in self.started.items() if now - t0 > self.tail_seconds]
        for f in late:
            del self.started[f]
        return len(late)

    def start(self, side: ExplorerSide, target: int, version: int, admits: Callable[[int], bool]) -> bool:
        """Start tasks with weights ``version`` while fewer than ``target`` hold a place and
        ``admits(tasks_holding_a_place)``; True when the tasks ran out."""
        while self.holding < target and admits(self.holding):
            if not self.drawn:  # an explorer process claims one task at a time: a claim is a task it runs
                self.drawn.extend(side.draw(side.batch_size if side.claims is None else 1))
                if not self.drawn:
                    return True
            future = asyncio.ensure_future(side.explorer.run_one(self.drawn.popleft()))
            self.running[future], self.started[future] = version, time.perf_counter()
        return False

    async def wait(self) -> None:
        """Wait a moment for a running task to finish (it joins :attr:`finished`)."""
        if not self.running:
            await asyncio.sleep(0.02)
            return
        done, _ = await asyncio.wait(self.running, timeout=0.02, return_when=asyncio.FIRST_COMPLETED)
        for f in done:
            self.started.pop(f, None)
            self.finished.append((f.result(), self.running.pop(f)))

    async def cancel(self) -> None:
        """Cancel the running tasks and give them up to 5 s to end."""
        for future in self.running:
            future.cancel()
        if self.running:
            await asyncio.wait(self.running, timeout=5.0)


def _admits(
    pacing: Pacing,
    version: int,
    trainer_at: Callable[[], int],
    queued: int,
    others: Callable[[], int],
    in_flight: int,
) -> bool:
    """``pacing.admits`` with the trainer's version and the other explorers' tasks in flight read now."""
    return pacing.admits(version, trainer_at(), queued, in_flight + others())


async def _pull(side: ExplorerSide, version: int) -> None:
    """Load weights ``version`` into the engine, off the event loop (``waiting for weights`` meanwhile)."""
    state, side.activity.state = side.activity.state, WEIGHTS
    await asyncio.get_running_loop().run_in_executor(None, side.sync.pull, side.engine, version)
    side.activity.state = state


def _put_batch(
    side: ExplorerSide, batch: list[tuple[Any, int]], seconds: float, paced: float, deferred: int
) -> None:
    """Finished tasks ``(outcome, version)`` as the side's next batch, through its produce pipeline."""
    versions = [v for _, v in batch]
    side.release([done for done, _ in batch], versions)
    index = side.batches
    experiences, metrics = side.explorer.assemble([d for d, _ in batch], index, versions, seconds)
    partial = sum(1 for e in experiences if e.info.get("version_spread"))
    newest = max([*versions, *(e.policy_version + e.info.get("version_spread", 0) for e in experiences)])
    extra = {
        "explorer/paced_seconds": paced,
        "explorer/version_min": float(min(versions)),
        "explorer/version_spread": float(newest - min(versions)),
        "explorer/partial_samples": float(partial),
        "explorer/tail_deferred": float(deferred),
    }
    if side.stale is not None and side.claims is None:
        extra.update(
            {
                "explorer/tasks_retried": float(side.tasks_retried),
                "explorer/tasks_lost": float(side.tasks_lost),
            }
        )
        side.tasks_retried = side.tasks_lost = 0
    side.finish_batch(experiences, metrics, index, min(versions), refill=False, extra=extra)
