"""The one pacing rule of mode async: the explorer starts a task only when the trainer will train it
within ``buffer.max_staleness`` versions of the weights it is sampled with.

The streaming explorer of mode async asks it before each task it starts
(:func:`trine.explorer.streaming.stream`), in one process and as an explorer process (``trine explore``),
where the tasks every other explorer holds count as in flight too.

It counts **rows**, not steps. The trainer takes ``batch_rows`` rows per step, in the order they were
put; the rows already queued in the buffer (ready or pending a reward) and those of the tasks in flight
(each ``rows_per_task``) come before the new task's, so its first row lands in the trainer's batch
number ``rows_ahead // batch_rows`` (0 = the next batch the trainer takes). A partial batch in the buffer
(rows a filter or the staleness bound dropped, rewards that expired) therefore counts as no extra step:
the explorer fills it instead of waiting for a trainer that waits for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trine.buffer import Buffer


@dataclass(frozen=True)
class Pacing:
    """The staleness bound as a rule for the explorer (see the module docstring).

    With ``trainer_at`` the trainer's version counting a step in flight (its version, +1 while it
    steps: the version of its next ``Buffer.get``), ``rows_ahead = rows_queued + tasks_in_flight ×
    rows_per_task`` and ``version`` the weights the new task would be sampled with::

        admit  iff  trainer_at + rows_ahead // batch_rows - version <= max_staleness

    (always, when ``max_staleness`` is None). With whole batches queued this is the step count it has
    always been; a partial batch adds 0.
    """

    max_staleness: int | None
    """``buffer.max_staleness``: versions a trained row may lag the trainer (None: no bound)."""
    batch_rows: int
    """Rows the trainer takes per step (``trainer.batch_size``, :attr:`RunConfig.trainer_batch_rows`)."""
    rows_per_task: int
    """Rows one task puts (``tasks.train.repeat``; an estimate for workflows that return more or fewer)."""

    def __post_init__(self) -> None:
        """Refuse sizes that make no rule (the config's checks keep them out of a run)."""
        for name in ("batch_rows", "rows_per_task"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"Pacing {name}={value!r}: expected an integer >= 1 (rows per training step, rows per "
                    "task); check trainer.batch_size and tasks.train.repeat"
                )
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(
                f"Pacing max_staleness={self.max_staleness!r}: expected None or an integer >= 0 "
                "(buffer.max_staleness)"
            )

    def batches_ahead(self, rows_queued: int, tasks_in_flight: int = 0) -> int:
        """The trainer batch a task started now lands in (0 = the next one the trainer takes):
        ``(rows_queued + tasks_in_flight × rows_per_task) // batch_rows``."""
        return (rows_queued + tasks_in_flight * self.rows_per_task) // self.batch_rows

    def admits(self, version: int, trainer_at: int, rows_queued: int, tasks_in_flight: int = 0) -> bool:
        """May the explorer start a task now with weights ``version``? ``trainer_at``: the trainer's
        version counting a step in flight; ``rows_queued``: rows in the buffer, ready or pending;
        ``tasks_in_flight``: tasks started and not yet put that still hold a place (tasks deferred by
        ``explorer.tail_seconds`` do not). See the class docstring for the formula."""
        if self.max_staleness is None:
            return True
        return trainer_at + self.batches_ahead(rows_queued, tasks_in_flight) - version <= self.max_staleness


def rows_queued(buffer: Buffer) -> int:
    """Rows in ``buffer`` that no step has taken yet: ready ones and those pending a reward."""
    m = buffer.metrics()
    return int(m["buffer/size"] + m["buffer/pending"])
