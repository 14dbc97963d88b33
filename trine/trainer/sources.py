"""What a trainer-only stage trains on: supervised rows from a taskset, rows from a buffer; and when a
trainer process's buffer has gone idle (:class:`BufferIdle`, ``buffer.end_after_idle``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from trine.types import Experience, Task


class Rows(Protocol):
    """Where a supervised source draws its tasks from (a :class:`trine.tasks.TaskScheduler`, handed in by the
    wiring): the next ``n`` tasks, and its cursor for checkpoints."""

    def next_batch(self, n: int) -> list[Task]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


if TYPE_CHECKING:
    from trine.buffer import Buffer


@dataclass
class SupervisedSource:
    """``mode: train``: batches of supervised rows or preference pairs made from the taskset's rows."""

    scheduler: Rows
    batch_size: int
    make: Callable[[list[Task]], list[Experience]]
    """:func:`~trine.tasks.supervised.sft_experiences` or ``preference_experiences`` with their keys."""

    def next_batch(self, step: int, version: int) -> tuple[list[Experience], dict[str, float]] | None:
        """The next batch and its metrics (none), or None when the taskset is exhausted. (``step`` and
        ``version``, the stage's step and the trainer's version, are for sources that need them: a
        replay of stored steps.)"""
        tasks = self.scheduler.next_batch(self.batch_size)
        return (self.make(tasks), {}) if tasks else None

    def state_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])


@dataclass
class BufferSource:
    """``mode: train`` with ``tasks.source: buffer``: batches of the rows that land in a persistent buffer
    (annotated preference pairs, SFT rows, stored rollouts), taken with ``buffer.get``.

    Each batch is ``buffer.get(rows, timeout=timeout)``. :meth:`more` fetches the next batch ahead, right
    after a step, so the step that turns out to be the last one is known as such (the loop then evaluates
    and checkpoints it as the stage's end); when nothing arrives in time the source ends and ``ended`` says
    why. A checkpoint keeps the batch fetched ahead (it has left the buffer), so a resume trains it first.
    """

    buffer: Buffer
    rows: int
    """Rows per step (``tasks.batch_size``; twice that for preference pairs)."""
    timeout: float
    """Seconds to wait for a batch (``buffer.get_timeout``)."""
    pairwise: bool = False
    """The algorithm trains on preference pairs: every row must be one (kind ``preference``)."""
    ahead: list[Experience] | None = None
    """The next batch, fetched by :meth:`more` and not trained yet."""
    ended: str | None = None
    """Why the source ended early (None while it has not)."""

    def next_batch(self, step: int, version: int) -> tuple[list[Experience], dict[str, float]] | None:
        """The batch fetched ahead, else the next one from the buffer (raising ``TimeoutError`` naming
        the buffer when none arrives: the stage has nothing to train on); None once the source ended."""
        if self.ahead is None and self.ended is None:
            batch = self._get()
            if batch is None:
                raise TimeoutError(
                    f"tasks.source: buffer: no batch of {self.rows} rows arrived in {self.buffer!r} within "
                    f"buffer.get_timeout={self.timeout}s ({self.ended}); check buffer.url and "
                    "buffer.storage_args.table (annotated pairs land in table 'preferences'), or raise get_timeout"
                )
            self.ahead = batch
        if self.ahead is None:
            return None
        batch, self.ahead = self.ahead, None
        return batch, self.buffer.metrics()

    def more(self) -> bool:
        """Fetch the next batch now (waiting up to ``timeout``); False (with ``ended`` set) if none came."""
        if self.ahead is None and self.ended is None:
            self.ahead = self._get()
        return self.ahead is not None

    def _get(self) -> list[Experience] | None:
        try:
            batch = self.buffer.get(self.rows, timeout=self.timeout)
        except TimeoutError as err:  # BufferTimeout: fewer rows than a batch arrived in time
            self.ended = f"no batch of {self.rows} rows within buffer.get_timeout={self.timeout}s: {err}"
            return None
        if self.pairwise:
            odd = [e for e in batch if e.kind != "preference"]
            if odd:
                raise ValueError(
                    f"tasks.source: buffer with a pairwise algorithm trains on preference pairs, but {self.buffer!r} "
                    f"handed out rows of kind {sorted({e.kind for e in odd})}; point buffer.storage_args.table at "
                    "the pairs (annotated pairs land in table 'preferences')"
                )
        return batch

    def state_dict(self) -> dict[str, Any]:
        ahead = None if self.ahead is None else [e.to_dict() for e in self.ahead]
        return {"buffer_source": {"buffer": self.buffer.state_dict(), "ahead": ahead, "ended": self.ended}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = state["buffer_source"]
        self.buffer.load_state_dict(mine["buffer"])
        self.ahead = None if mine["ahead"] is None else [Experience.from_dict(d) for d in mine["ahead"]]
        self.ended = mine["ended"]


@dataclass
class BufferIdle:
    """``buffer.end_after_idle``: a trainer process (``trine train``) waiting for a batch asks :meth:`why`
    whether its buffer has been idle for ``seconds``: no row arrived, no reward was given, none was dropped
    (the buffer's ``buffer/size``, ``buffer/pending`` and ``buffer/dropped_stale`` unchanged). A trained step
    restarts the count (:meth:`reset`). Rows that arrive without completing a batch keep it going."""

    buffer: Buffer
    seconds: float
    clock: Callable[[], float] = time.monotonic
    _seen: tuple[float, ...] | None = field(default=None, init=False)
    _since: float = field(default=0.0, init=False)

    def why(self) -> str | None:
        """Why the stage ends now (the buffer idle for ``seconds``), else None."""
        m, now = self.buffer.metrics(), self.clock()
        seen = tuple(m.get(k, 0.0) for k in ("buffer/size", "buffer/pending", "buffer/dropped_stale"))
        if seen != self._seen:
            self._seen, self._since = seen, now
            return None
        if now - self._since < self.seconds:
            return None
        return (
            f"no new row and no reward in the buffer for {now - self._since:.0f}s "
            f"(buffer.end_after_idle={self.seconds:g}): the agents are done"
        )

    def reset(self) -> None:
        """A step was trained: count from now on."""
        self._seen = None


class Source(Protocol):
    """What a trainer-only stage trains on (:class:`SupervisedSource`, :class:`BufferSource`, a replay of
    stored steps). A source that may run dry also has ``more() -> bool`` (see :mod:`trine.modes.train`)."""

    def next_batch(self, step: int, version: int) -> tuple[list[Experience], dict[str, float]] | None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
