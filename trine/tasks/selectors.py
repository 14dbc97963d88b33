"""Selectors: the order in which one epoch of a taskset is visited.

A selector is a function ``(num_tasks, rng, difficulty) -> list[int]`` returning ``num_tasks``
indices into the taskset. :class:`~trine.tasks.TaskScheduler` calls it once per epoch with
``rng = random.Random(seed * 1000003 + epoch)``, so every epoch's order can be recomputed from the
seed alone (which is what makes a resumed run hand out the same batches). ``difficulty`` is one
number per task (see :func:`difficulties`) for the selectors that need it, else None.

Built-ins (:data:`SELECTORS`):

- ``sequential``: the taskset's own order, every epoch.
- ``shuffle``: a fresh seeded permutation per epoch.
- ``random``: ``num_tasks`` independent uniform draws *with replacement* per epoch (a task may come
  twice in an epoch, another not at all).
- ``easy_to_hard``: offline curriculum, ascending by a difficulty column of the rows (Trinity-RFT's
  static task prioritization); tasks of equal difficulty come in a seeded order that differs per
  epoch. With ``descending`` the order is hard to easy.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from trine.types import Task

Selector = Callable[[int, random.Random, Sequence[float] | None], list[int]]


def sequential(num_tasks: int, rng: random.Random, difficulty: Sequence[float] | None = None) -> list[int]:
    """``0, 1, ..., num_tasks - 1``."""
    return list(range(num_tasks))


def shuffle(num_tasks: int, rng: random.Random, difficulty: Sequence[float] | None = None) -> list[int]:
    """A permutation of ``range(num_tasks)`` drawn from ``rng``."""
    indices = list(range(num_tasks))
    rng.shuffle(indices)
    return indices


def with_replacement(
    num_tasks: int, rng: random.Random, difficulty: Sequence[float] | None = None
) -> list[int]:
    """``num_tasks`` uniform draws from ``range(num_tasks)``, with replacement."""
    return rng.choices(range(num_tasks), k=num_tasks)


def easy_to_hard(num_tasks: int, rng: random.Random, difficulty: Sequence[float] | None = None) -> list[int]:
    """Indices sorted by ``difficulty`` ascending; ties keep a seeded (shuffled) order."""
    if difficulty is None or len(difficulty) != num_tasks:
        raise ValueError(
            "easy_to_hard needs one difficulty per task; build the scheduler with difficulty_key= "
            "naming a numeric column of the rows."
        )
    indices = shuffle(num_tasks, rng)
    indices.sort(key=difficulty.__getitem__)  # stable sort: ties stay in the shuffled order
    return indices


SELECTORS: dict[str, Selector] = {
    "sequential": sequential,
    "shuffle": shuffle,
    "random": with_replacement,
    "easy_to_hard": easy_to_hard,
}
"""Built-in selectors by name."""

NEEDS_DIFFICULTY = frozenset({"easy_to_hard"})
"""Selectors that need ``difficulty_key``."""


def difficulties(tasks: Sequence[Task], key: str, *, descending: bool = False) -> list[float]:
    """The number in ``task.raw[key]`` for every task (negated when ``descending``).

    Raises ValueError naming the first task whose row lacks ``key`` or holds something that is not
    a finite number.
    """
    values: list[float] = []
    for task in tasks:
        row = task.raw if isinstance(task.raw, dict) else {}
        number = _finite_number(row.get(key))
        if number is None:
            where = f"holds {row[key]!r} in field" if key in row else "has no field"
            raise ValueError(
                f"task {task.task_id!r} {where} {key!r} (difficulty_key); expected a finite number in every "
                f"row (row keys: {sorted(row)[:20]}). Add the column, fix the row, or pick another "
                "difficulty_key."
            )
        values.append(-number if descending else number)
    return values


def _finite_number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None
