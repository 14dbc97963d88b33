"""TaskScheduler: the ``tasks -> explorer`` arrow of the loop.

``next_batch(n)`` hands out tasks epoch by epoch, each epoch in the order of a selector
(``sequential``, ``shuffle``, ``random``, ``easy_to_hard``; see :mod:`trine.tasks.selectors`);
``feedback(task_ids, stats)`` records per-task statistics (pass rates, mean rewards).
The whole position is a small JSON-able ``state_dict()``, so a resumed run gets the same batches.
Several tasksets mixed by weight: :class:`~trine.tasks.mixed.MixedScheduler`; an online
curriculum from the reported pass rates: :class:`~trine.tasks.curriculum.CurriculumScheduler`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from trine.tasks.selectors import NEEDS_DIFFICULTY, SELECTORS, difficulties
from trine.types import Task

Stats = Mapping[str, Sequence[Any]] | Sequence[Mapping[str, Any]]


class TaskScheduler:
    """Hands out the tasks of a taskset in batches, one epoch after another.

    Args:
        taskset: a :class:`~trine.tasks.TaskSet` or any sequence of :class:`~trine.types.Task`.
        shuffle: legacy switch: ``shuffle=False`` is ``selector="sequential"``; with ``selector``
            left None, ``shuffle=True`` is ``selector="shuffle"``.
        seed: seed of the per-epoch orders; epoch ``e`` is ordered by an RNG seeded by ``(seed, e)``
            alone, so the order of any epoch can be recomputed without replaying earlier ones.
        epochs: number of passes over the taskset; None repeats forever.
        drop_last: after the last epoch, drop a final batch that would be shorter than asked.
        selector: how each epoch is ordered, one of :data:`~trine.tasks.selectors.SELECTORS`
            (``sequential``, ``shuffle``, ``random`` = with replacement, ``easy_to_hard``).
        difficulty_key: row field with a number per task (higher = harder); required by
            ``easy_to_hard`` and used by nothing else.
        descending: with ``easy_to_hard``, go from hard to easy instead.

    Batches may cross an epoch boundary (the end of epoch ``e`` and the start of ``e+1`` share a
    batch); with a batch larger than the taskset, a batch can hold the same task twice.
    """

    def __init__(
        self,
        taskset: Sequence[Task],
        *,
        shuffle: bool = True,
        seed: int = 42,
        epochs: int | None = 1,
        drop_last: bool = False,
        selector: str | None = None,
        difficulty_key: str | None = None,
        descending: bool = False,
    ) -> None:
        if len(taskset) == 0:
            raise ValueError("TaskScheduler got an empty taskset; give it at least one task.")
        if epochs is not None and (not isinstance(epochs, int) or epochs < 1):
            raise ValueError(f"epochs={epochs!r}; expected an integer >= 1, or None to repeat forever.")
        self.taskset = taskset
        self.selector = _check_selector(selector, shuffle, difficulty_key, descending)
        self.shuffle = self.selector != "sequential"
        self.difficulty_key = difficulty_key
        self.descending = descending
        self._difficulty = (
            difficulties(taskset, difficulty_key, descending=descending) if difficulty_key else None
        )
        self.seed = seed
        self.epochs = epochs
        self.drop_last = drop_last
        self.epoch = 0
        """Current epoch (0-based)."""
        self.cursor = 0
        """Position within the current epoch's order."""
        self.stats: dict[str, dict[str, dict[str, float]]] = {}
        """Per task id, per metric: ``{"last": value, "sum": total, "n": number of reports}``."""
        self._order: list[int] = []
        self._order_epoch = -1
        self._ids = {task.task_id for task in taskset}

    @property
    def num_tasks(self) -> int:
        return len(self.taskset)

    @property
    def exhausted(self) -> bool:
        """True once every epoch has been handed out (``next_batch`` then returns ``[]``)."""
        return self.epochs is not None and self.epoch >= self.epochs

    def order(self, epoch: int) -> list[int]:
        """Indices of the taskset in the order epoch ``epoch`` visits them."""
        rng = random.Random(self.seed * 1000003 + epoch)
        return SELECTORS[self.selector](self.num_tasks, rng, self._difficulty)

    def remaining(self) -> int | None:
        """Tasks left to hand out (None when ``epochs`` is None)."""
        if self.epochs is None:
            return None
        return max(0, (self.epochs - self.epoch) * self.num_tasks - self.cursor)

    def next_batch(self, n: int) -> list[Task]:
        """The next ``n`` tasks, crossing into the next epoch when one ends.

        Returns fewer than ``n`` tasks at the very end (none with ``drop_last``), and ``[]`` once
        the scheduler is exhausted.
        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"next_batch(n={n!r}); expected an integer batch size >= 1.")
        left = self.remaining()
        if left is not None and self.drop_last and left < n:
            self.epoch, self.cursor = self.epochs, 0  # type: ignore[assignment]
            return []
        batch: list[Task] = []
        while len(batch) < n and not self.exhausted:
            if self._order_epoch != self.epoch:
                self._order, self._order_epoch = self.order(self.epoch), self.epoch
            take = self._order[self.cursor : self.cursor + n - len(batch)]
            batch.extend(self.taskset[i] for i in take)
            self.cursor += len(take)
            if self.cursor >= self.num_tasks:
                self.epoch, self.cursor = self.epoch + 1, 0
        return batch

    def steps_per_epoch(self, batch_size: int) -> int:
        """Batches per epoch: ``ceil(num_tasks / batch_size)`` (floor with ``drop_last``, at least 1)."""
        _check_batch_size(batch_size)
        if self.drop_last:
            return max(1, self.num_tasks // batch_size)
        return math.ceil(self.num_tasks / batch_size)

    def total_batches(self, batch_size: int) -> int | None:
        """Batches over all epochs (batches cross epochs, so the tail is shared); None if endless."""
        _check_batch_size(batch_size)
        if self.epochs is None:
            return None
        total = self.epochs * self.num_tasks
        return total // batch_size if self.drop_last else math.ceil(total / batch_size)

    def feedback(self, task_ids: Sequence[str], stats: Stats) -> None:
        """Record statistics of finished tasks.

        ``stats`` is either ``{metric: values}`` with one value per task id (e.g.
        ``{"pass_rate": [1.0, 0.5]}``), or a list with one ``{metric: value}`` dict per task id.
        A value may be a number or a list of numbers (e.g. the rewards of a task's group; their mean
        is recorded); None values are ignored.
        """
        task_ids = list(task_ids)
        unknown = [task_id for task_id in task_ids if task_id not in self._ids]
        if unknown:
            raise ValueError(
                f"feedback for task id(s) {unknown[:5]}, which are not in this scheduler's taskset; "
                "send feedback to the scheduler that handed the tasks out."
            )
        rows = _stats_rows(task_ids, stats)
        numbers = [{m: _as_number(m, v) for m, v in row.items()} for row in rows]  # validate first
        for task_id, row in zip(task_ids, numbers, strict=True):
            for metric, number in row.items():
                if number is None:
                    continue
                record = self.stats.setdefault(task_id, {}).setdefault(
                    metric, {"last": 0.0, "sum": 0.0, "n": 0}
                )
                record["last"] = number
                record["sum"] += number
                record["n"] += 1

    def task_stats(self, task_id: str) -> dict[str, float]:
        """``{metric: last value, metric_mean: mean, metric_n: reports}`` for ``task_id`` (``{}`` if none yet)."""
        out: dict[str, float] = {}
        for metric, record in self.stats.get(task_id, {}).items():
            out[metric] = record["last"]
            out[f"{metric}_mean"] = record["sum"] / record["n"]
            out[f"{metric}_n"] = record["n"]
        return out

    def state_dict(self) -> dict[str, Any]:
        """The position and statistics, as plain JSON-able data."""
        return {
            "epoch": self.epoch,
            "cursor": self.cursor,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "selector": self.selector,
            "num_tasks": self.num_tasks,
            "stats": _copy_stats(self.stats),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict`; the following batches equal those of the saved scheduler."""
        settings = ("num_tasks", "seed", "shuffle", "selector")
        for key, mine in ((key, getattr(self, key)) for key in settings):
            if key in state and state[key] != mine:
                raise ValueError(
                    f"scheduler state was saved with {key}={state[key]!r} but this scheduler has {key}={mine!r}; "
                    "resume with the same taskset and scheduler settings, or start without the saved state."
                )
        if not 0 <= int(state["cursor"]) < self.num_tasks:
            raise ValueError(
                f"scheduler state cursor={state['cursor']!r}; expected 0 <= cursor < {self.num_tasks}."
            )
        self.epoch = int(state["epoch"])
        self.cursor = int(state["cursor"])
        self.stats = _copy_stats(state.get("stats", {}))
        self._order_epoch = -1


def _check_selector(selector: str | None, shuffle: bool, difficulty_key: str | None, descending: bool) -> str:
    """The selector name that ``selector``/``shuffle`` ask for; raises on contradictions."""
    if selector is None:
        selector = "shuffle" if shuffle else "sequential"
    elif not shuffle and selector != "sequential":
        raise ValueError(
            f"shuffle=False contradicts selector={selector!r}; drop shuffle=False (the selector alone "
            "sets the order) or use selector='sequential'."
        )
    if selector not in SELECTORS:
        raise ValueError(f"unknown selector {selector!r}; expected one of {sorted(SELECTORS)}.")
    if selector in NEEDS_DIFFICULTY and not difficulty_key:
        raise ValueError(
            f"selector={selector!r} orders tasks by difficulty; set difficulty_key= to a numeric row field."
        )
    if difficulty_key and selector not in NEEDS_DIFFICULTY:
        raise ValueError(
            f"difficulty_key={difficulty_key!r} is only used by selector 'easy_to_hard', but selector={selector!r}; "
            "set selector='easy_to_hard' or drop difficulty_key."
        )
    if descending and selector not in NEEDS_DIFFICULTY:
        raise ValueError(f"descending=True only applies to selector 'easy_to_hard', not {selector!r}.")
    return selector


def _copy_stats(
    stats: Mapping[str, Mapping[str, Mapping[str, float]]],
) -> dict[str, dict[str, dict[str, float]]]:
    return {task_id: {m: dict(r) for m, r in metrics.items()} for task_id, metrics in stats.items()}


def _check_batch_size(batch_size: int) -> None:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r}; expected an integer >= 1.")


def _stats_rows(task_ids: list[str], stats: Stats) -> list[Mapping[str, Any]]:
    """Turn either stats layout into one ``{metric: value}`` mapping per task id."""
    if isinstance(stats, Mapping):
        for metric, values in stats.items():
            if (
                isinstance(values, (str, bytes))
                or not isinstance(values, Sequence)
                or len(values) != len(task_ids)
            ):
                raise ValueError(
                    f"feedback stats[{metric!r}] must be a list with one value per task id "
                    f"({len(task_ids)}), got {values!r}."
                )
        return [{metric: values[i] for metric, values in stats.items()} for i in range(len(task_ids))]
    rows = list(stats)
    if len(rows) != len(task_ids) or not all(isinstance(row, Mapping) for row in rows):
        raise ValueError(
            f"feedback stats must be {{metric: [one value per task]}} or one {{metric: value}} dict per task id "
            f"({len(task_ids)} ids); got {len(rows)} entries."
        )
    return rows


def _as_number(metric: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        values = [float(v) for v in value if v is not None]
        return sum(values) / len(values) if values else None
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"feedback value for {metric!r} is {value!r}; expected a number or a list of numbers."
        ) from None
