"""Pulled work for explorer processes: tasks claimed from the shared buffer's task ledger.

Every explorer process of a run builds the same seeded task stream. Instead of splitting it (explorer ``i``
taking every n-th batch), each claims tasks one at a time from the buffer's ledger
(:mod:`trine.buffer.sql_tasks`) as it has room for them: a fast explorer claims more, a slow one fewer,
and the claims of a dead or hung one expire (``explorer.lease_seconds``) and go to the others. A claim
names the task's place in the stream (``seq``); its rows carry it (``info["task_seq"]``) and the put that
stores them marks it done in the same transaction, so an explorer killed at any moment loses nothing and
explores nothing twice (a restarted explorer opens its old claims again first). Tasks whose rows the
trainer dropped as stale come back through the ledger too (``buffer.stale_retries``).
"""

from __future__ import annotations

import copy
import time
from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from trine.types import Task

if TYPE_CHECKING:
    from trine.buffer.sql_tasks import Claim
    from trine.tasks import TaskScheduler

CACHE_SECONDS = 0.1
"""How long the other explorers' claims counted in the ledger are reused before counting again."""


class TaskStream:
    """The run's task stream, numbered: ``stream(first, count)`` gives tasks ``first .. first + count - 1``
    of ``scheduler`` (fewer at its end), drawn ``chunk`` tasks at a time (every explorer draws in the same
    chunks, so the stream is the same in each). It only moves forward: tasks before ``first`` (claimed by
    others, or here earlier) are let go; those returned stay until a later call asks past them, so a claim
    transaction that is run again gets the same tasks."""

    def __init__(self, scheduler: TaskScheduler, chunk: int, owner: str) -> None:
        self.scheduler, self.chunk, self.owner = scheduler, chunk, owner
        self._drawn: deque[Task] = deque()
        self._next = 0  # stream number of self._drawn[0] (or of the next task drawn)

    def __call__(self, first: int, count: int) -> list[Task]:
        while True:
            while self._drawn and self._next < first:
                self._drawn.popleft()
                self._next += 1
            if self._next > first:
                raise RuntimeError(
                    f"{self.owner}: the task ledger asked for stream task {first}, before this copy of the "
                    f"stream ({self._next}); was the buffer's database replaced during the run?"
                )
            if self._next == first and len(self._drawn) >= count:
                break
            batch = self.scheduler.next_batch(self.chunk)
            if not batch:
                break
            self._drawn.extend(batch)
        return list(self._drawn)[:count] if self._next == first else []


class TaskClaims:
    """The tasks explorer ``owner`` holds, claimed through ``buffer`` (a :class:`~trine.buffer.SQLBuffer`,
    or the Ray buffer writer, which numbers the stream itself: ``stream`` None) from ``stream``."""

    def __init__(self, buffer: Any, stream: TaskStream | None, owner: str, lease: float) -> None:
        self.buffer, self.stream, self.owner, self.lease = buffer, stream, owner, lease
        self.held: dict[int, Claim] = {}
        """The claims not yet put, by ``id`` of their task."""
        self.retried = 0
        """Claims of tasks explored again (their earlier rows were dropped as stale)."""
        self._renewed = time.monotonic()
        self._others: tuple[float, int] = (0.0, 0)

    def reopen(self) -> int:
        """Open every claim of this explorer's name not yet put: at its start (an earlier incarnation was
        killed) and at its end (the others take them at once instead of after their lease)."""
        self.held.clear()
        return int(self.buffer.release_tasks(self.owner))

    def claim(self, n: int) -> list[Task]:
        """Up to ``n`` tasks to explore now; [] when the stream has run out and no task is open."""
        # each claim its own Task object: a taskset hands out the same object in every epoch, and two claims
        # of one row in flight at once must not share the id that :attr:`held` knows them by
        claims = [
            replace(c, task=copy.copy(c.task))
            for c in self.buffer.claim_tasks(self.owner, n, self.lease, self.stream)
        ]
        for c in claims:
            self.held[id(c.task)] = c
            self.retried += c.retries > 0
        return [c.task for c in claims]

    def finish(self, tasks: list[Task]) -> list[tuple[int, int]]:
        """The ``(seq, claim)`` of ``tasks`` (about to be put), no longer held."""
        return [(c.seq, c.claim) for c in (self.held.pop(id(t)) for t in tasks if id(t) in self.held)]

    def seq(self, task: Task) -> int | None:
        """The stream number of a held task (None for a task not claimed here)."""
        c = self.held.get(id(task))
        return None if c is None else c.seq

    def renew(self) -> None:
        """Extend the held claims by ``lease`` seconds, every third of a lease (call it often)."""
        now = time.monotonic()
        if self.held and now - self._renewed >= self.lease / 3:
            self.buffer.renew_tasks(self.owner, [(c.seq, c.claim) for c in self.held.values()], self.lease)
            self._renewed = now

    def others_in_flight(self, fresh: bool = False) -> int:
        """Tasks the other explorers hold (claimed, not put, lease running), counted at most every
        :data:`CACHE_SECONDS` (``fresh``: now, before a claim: explorers admitted at the same moment, when
        the trainer's new version reaches them all, would each see room for the same tasks)."""
        at, count = self._others
        if fresh or time.monotonic() - at >= CACHE_SECONDS:
            count = max(0, int(self.buffer.task_counts()["claimed"]) - len(self.held))
            self._others = (time.monotonic(), count)
        return count
