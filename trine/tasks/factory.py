"""``build_scheduler``: the one call that turns tasksets and scheduling settings into a scheduler.

One taskset gives a :class:`TaskScheduler` (ordered by a selector) or, with ``curriculum``, a
:class:`CurriculumScheduler`; several tasksets give a :class:`MixedScheduler` over one such
scheduler per taskset. :data:`SCHEDULERS` is the registry table of kind ``"scheduler"``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from trine.tasks.curriculum import CurriculumScheduler
from trine.tasks.mixed import MixedScheduler
from trine.tasks.scheduler import TaskScheduler
from trine.types import Task

SCHEDULERS: dict[str, type] = {
    "default": TaskScheduler,
    "curriculum": CurriculumScheduler,
    "mixed": MixedScheduler,
}
"""Built-in schedulers by name: one taskset by a selector, the online curriculum, the weighted mix."""

CURRICULUM_ARGS = ("target_pass_rate", "prior_pass_rate", "prior_strength", "forgetting")
"""Keys accepted in ``build_scheduler(curriculum={...})``."""


def build_scheduler(
    tasksets: Sequence[Sequence[Task]],
    *,
    weights: Sequence[float] | Mapping[str, float] | None = None,
    selector: str | None = None,
    difficulty_key: str | None = None,
    descending: bool = False,
    curriculum: Mapping[str, Any] | None = None,
    seed: int = 42,
    epochs: int | None = 1,
    shuffle: bool = True,
) -> TaskScheduler | MixedScheduler:
    """The scheduler for ``tasksets`` (a list of :class:`~trine.tasks.TaskSet` or sequences of Tasks).

    Args:
        tasksets: one or more tasksets; each is named by its ``name`` attribute (``taskset<i>``
            when it has none) and names must be distinct.
        weights: share of each batch per taskset, as a list in ``tasksets`` order or ``{name: w}``;
            None weighs tasksets by their sizes (as if they were concatenated). Ignored for one taskset.
        selector: order within each taskset (``sequential``, ``shuffle``, ``random``,
            ``easy_to_hard``); None follows ``shuffle``.
        difficulty_key, descending: the difficulty column for ``easy_to_hard``, and its direction.
        curriculum: None for the selector's fixed order; otherwise the online curriculum's
            arguments (``{}`` for its defaults), any of :data:`CURRICULUM_ARGS`.
        seed: taskset ``i`` uses ``seed + i``; the mix uses ``seed``.
        epochs: passes over each taskset; None repeats forever.
        shuffle: legacy switch, see :class:`TaskScheduler`.
    """
    tasksets = list(tasksets)
    if not tasksets:
        raise ValueError("build_scheduler got no tasksets; give it at least one taskset.")
    names = _names(tasksets)
    children = {
        name: _one(ts, seed + i, epochs, selector, difficulty_key, descending, curriculum, shuffle)
        for i, (name, ts) in enumerate(zip(names, tasksets, strict=True))
    }
    if len(children) == 1:
        return children[names[0]]
    return MixedScheduler(children, _weights(names, tasksets, weights), seed=seed)


def _one(
    taskset: Sequence[Task],
    seed: int,
    epochs: int | None,
    selector: str | None,
    difficulty_key: str | None,
    descending: bool,
    curriculum: Mapping[str, Any] | None,
    shuffle: bool,
) -> TaskScheduler:
    if curriculum is None:
        return TaskScheduler(
            taskset,
            shuffle=shuffle,
            seed=seed,
            epochs=epochs,
            selector=selector,
            difficulty_key=difficulty_key,
            descending=descending,
        )
    if selector not in (None, "shuffle") or difficulty_key or descending:
        raise ValueError(
            f"curriculum is set, so tasks are picked online from their pass rates, but selector={selector!r}, "
            f"difficulty_key={difficulty_key!r}, descending={descending!r} ask for a fixed order; "
            "drop one of the two."
        )
    unknown = sorted(set(curriculum) - set(CURRICULUM_ARGS))
    if unknown:
        raise ValueError(
            f"unknown curriculum argument(s) {unknown}; expected some of {list(CURRICULUM_ARGS)}."
        )
    return CurriculumScheduler(taskset, seed=seed, epochs=epochs, **dict(curriculum))


def _names(tasksets: list[Sequence[Task]]) -> list[str]:
    names = [str(getattr(ts, "name", None) or f"taskset{i}") for i, ts in enumerate(tasksets)]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(
            f"taskset name(s) {repeated} are used more than once; give every taskset a distinct name "
            f"(names: {names})."
        )
    return names


def _weights(
    names: list[str],
    tasksets: list[Sequence[Task]],
    weights: Sequence[float] | Mapping[str, float] | None,
) -> dict[str, float]:
    if weights is None:
        return {name: float(len(ts)) for name, ts in zip(names, tasksets, strict=True)}
    if isinstance(weights, Mapping):
        return dict(weights)  # MixedScheduler checks the names and values
    weights = list(weights)
    if len(weights) != len(names):
        raise ValueError(
            f"weights={weights} has {len(weights)} entries for {len(names)} tasksets {names}; "
            "give one weight per taskset, in order."
        )
    return dict(zip(names, weights, strict=True))
