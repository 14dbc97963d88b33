"""Splitting one task stream between several explorer processes, without overlap and without loss.

Every explorer builds the same seeded scheduler and walks the same sequence of batches; explorer ``i``
of ``n`` explores batches ``i, i + n, i + 2n, ...`` and draws (without exploring) the others. Its
position is its own count of batches put, which the buffer keeps (``SQLBuffer.produced``), so a
restarted explorer replays the draws up to where it stopped (:meth:`PartitionedScheduler.skip`).
Schedulers that learn from feedback (curricula) would diverge between explorers and are refused
with explorer processes at validate time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from trine.types import Task


class Scheduler(Protocol):
    def next_batch(self, n: int) -> list[Task]: ...

    def feedback(self, task_ids: Sequence[str], stats: Any) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Any) -> None: ...


class PartitionedScheduler:
    """The batches of ``inner`` that belong to explorer ``index`` of ``count`` (see the module docstring)."""

    def __init__(self, inner: Scheduler, index: int, count: int) -> None:
        if not 0 <= index < count:
            raise ValueError(
                f"explorer index {index} of {count} explorers: expected 0 <= index < count; "
                "pass --explorer-id between 0 and --explorers minus 1."
            )
        self.inner, self.index, self.count = inner, index, count
        self.drawn = 0
        """Batches of the shared sequence drawn so far (this explorer's and the others')."""

    def next_batch(self, n: int) -> list[Task]:
        """This explorer's next batch of ``n`` tasks ([] when the stream is exhausted)."""
        while True:
            tasks = self.inner.next_batch(n)
            mine = self.drawn % self.count == self.index
            self.drawn += 1
            if not tasks or mine:
                return tasks

    def skip(self, batches: int, n: int) -> None:
        """Draw this explorer's first ``batches`` batches of ``n`` tasks without exploring them (a restart)."""
        for _ in range(batches):
            if not self.next_batch(n):
                return

    def feedback(self, task_ids: Sequence[str], stats: Any) -> None:
        self.inner.feedback(task_ids, stats)

    def state_dict(self) -> dict[str, Any]:
        return {"inner": self.inner.state_dict(), "drawn": self.drawn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state["inner"])
        self.drawn = int(state["drawn"])
