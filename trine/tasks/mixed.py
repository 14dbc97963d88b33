"""MixedScheduler: several tasksets in one stream of batches, mixed by weight.

Like xtuner's multi-task ``weight``: each batch of ``n`` tasks is split between the tasksets in
proportion to their weights, and each taskset's own scheduler (any selector, or a curriculum)
picks which of its tasks fill its share.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from trine.tasks.scheduler import Stats, _stats_rows
from trine.types import Task


class MixedScheduler:
    """Draws each batch from several child schedulers in proportion to ``weights``.

    Allocation of a batch of ``n`` among the active children (weights ``w_i``, total ``W``): child
    ``i`` gets ``floor(q_i)`` slots of its quota ``q_i = n * w_i / W``, and the ``r = n - sum floor(q_i)``
    remaining slots go to ``r`` distinct children drawn by seeded systematic sampling with inclusion
    probability ``q_i - floor(q_i)``. So every child gets ``floor(q_i)`` or ``ceil(q_i)`` slots, exactly
    ``q_i`` on average, and the observed shares converge to the weights as fast as possible. The
    slots of a batch are then shuffled, so the tasksets are interleaved within it.

    A child that runs out (returns fewer tasks than asked, or reports ``exhausted``) drops out and
    its slots go to the others by their weights; the mix is exhausted when every child is.
    ``feedback`` is routed to the child whose taskset holds each task id. The random stream of
    batch ``t`` is seeded by ``(seed, t)`` alone, so ``state_dict()`` (the batch counter, the dropped
    children and every child's state) restores it exactly.

    Args:
        schedulers: ``{name: scheduler}``; each needs ``taskset``, ``next_batch``, ``feedback``,
            ``exhausted``, ``state_dict`` and ``load_state_dict`` (a :class:`TaskScheduler` or
            :class:`CurriculumScheduler`). Task ids must be unique across the tasksets.
        weights: ``{name: weight > 0}`` for the same names (need not sum to 1).
        seed: seed of the allocation and interleaving.
    """

    def __init__(
        self, schedulers: Mapping[str, Any], weights: Mapping[str, float], *, seed: int = 42
    ) -> None:
        if not schedulers:
            raise ValueError("MixedScheduler got no schedulers; give it {taskset name: scheduler}.")
        if set(weights) != set(schedulers):
            raise ValueError(
                f"weights are given for {sorted(weights)} but the schedulers are {sorted(schedulers)}; "
                "give exactly one weight per taskset name."
            )
        bad = {
            name: w for name, w in weights.items() if not (isinstance(w, (int, float)) and 0 < w < math.inf)
        }
        if bad:
            raise ValueError(f"weights {bad} are not finite numbers > 0; give every taskset a weight > 0.")
        self.schedulers = dict(schedulers)
        self.weights = {name: float(weights[name]) for name in self.schedulers}
        self.seed = seed
        self.batches = 0
        """Batches handed out so far."""
        self.drained: set[str] = set()
        """Children that ran out of tasks."""
        self.counts = {name: 0 for name in self.schedulers}
        """Tasks handed out so far, per taskset."""
        self._owner = _owners(self.schedulers)

    @property
    def num_tasks(self) -> int:
        return sum(len(child.taskset) for child in self.schedulers.values())

    @property
    def exhausted(self) -> bool:
        """True once every child has run out (``next_batch`` then returns ``[]``)."""
        return all(self._gone(name) for name in self.schedulers)

    def next_batch(self, n: int) -> list[Task]:
        """The next ``n`` tasks, split between the tasksets by weight (fewer at the very end)."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"next_batch(n={n!r}); expected an integer batch size >= 1.")
        rng = random.Random(f"mixed/{self.seed}/{self.batches}")
        got: dict[str, list[Task]] = {name: [] for name in self.schedulers}
        need = n
        while need > 0:
            active = {name: w for name, w in self.weights.items() if not self._gone(name)}
            if not active:
                break
            for name, count in allocate(need, active, rng).items():
                if count:
                    tasks = self.schedulers[name].next_batch(count)
                    got[name].extend(tasks)
                    if len(tasks) < count:
                        self.drained.add(name)
            need = n - sum(len(tasks) for tasks in got.values())
        labels = [name for name, tasks in got.items() for _ in tasks]
        rng.shuffle(labels)
        queues = {name: iter(tasks) for name, tasks in got.items()}
        batch = [next(queues[name]) for name in labels]
        for name, tasks in got.items():
            self.counts[name] += len(tasks)
        self.batches += 1
        return batch

    def remaining(self) -> int | None:
        """Tasks left to hand out over all children (None if any child is endless)."""
        left = [self.schedulers[name].remaining() for name in self.schedulers if not self._gone(name)]
        return None if any(x is None for x in left) else sum(left)

    def total_batches(self, batch_size: int) -> int | None:
        """Batches over the whole run: every child's tasks, ``batch_size`` at a time; None if endless."""
        totals = [child.total_batches(1) for child in self.schedulers.values()]
        if any(total is None for total in totals):
            return None
        return math.ceil(sum(totals) / batch_size)

    def feedback(self, task_ids: Sequence[str], stats: Stats) -> None:
        """Route each task's statistics to the child scheduler whose taskset holds it."""
        task_ids = list(task_ids)
        unknown = [task_id for task_id in task_ids if task_id not in self._owner]
        if unknown:
            raise ValueError(
                f"feedback for task id(s) {unknown[:5]}, which are in none of the tasksets "
                f"{sorted(self.schedulers)}; send feedback for tasks this scheduler handed out."
            )
        routed: dict[str, tuple[list[str], list[Mapping[str, Any]]]] = {}
        for task_id, row in zip(task_ids, _stats_rows(task_ids, stats), strict=True):
            ids, rows = routed.setdefault(self._owner[task_id], ([], []))
            ids.append(task_id)
            rows.append(row)
        for name, (ids, rows) in routed.items():
            self.schedulers[name].feedback(ids, rows)

    def task_stats(self, task_id: str) -> dict[str, float]:
        """The statistics the owning child keeps for ``task_id``."""
        if task_id not in self._owner:
            raise ValueError(f"task id {task_id!r} is in none of the tasksets {sorted(self.schedulers)}.")
        return self.schedulers[self._owner[task_id]].task_stats(task_id)

    def state_dict(self) -> dict[str, Any]:
        """Batch counter, dropped children, counts and every child's state, as JSON-able data."""
        return {
            "seed": self.seed,
            "weights": dict(self.weights),
            "batches": self.batches,
            "drained": sorted(self.drained),
            "counts": dict(self.counts),
            "children": {name: child.state_dict() for name, child in self.schedulers.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict`; the following batches equal those of the saved scheduler."""
        children = state.get("children")
        if not isinstance(children, Mapping) or set(children) != set(self.schedulers):
            found = sorted(children) if isinstance(children, Mapping) else children
            raise ValueError(
                f"mixed scheduler state holds tasksets {found} but this scheduler mixes {sorted(self.schedulers)}; "
                "resume with the same tasksets, or start without the saved state."
            )
        for key, mine in (("seed", self.seed), ("weights", self.weights)):
            if state.get(key) != mine:
                raise ValueError(
                    f"mixed scheduler state was saved with {key}={state.get(key)!r} but this scheduler has "
                    f"{key}={mine!r}; resume with the same settings, or start without the saved state."
                )
        for name, child in self.schedulers.items():
            child.load_state_dict(children[name])
        self.batches = int(state["batches"])
        self.drained = set(state["drained"])
        self.counts = {name: int(state["counts"].get(name, 0)) for name in self.schedulers}

    def _gone(self, name: str) -> bool:
        return name in self.drained or self.schedulers[name].exhausted


def allocate(n: int, weights: Mapping[str, float], rng: random.Random) -> dict[str, int]:
    """Split ``n`` slots by ``weights``: ``floor`` of each quota plus systematic sampling of the rest.

    Each name gets ``floor(q)`` or ``ceil(q)`` slots of its quota ``q = n * w / sum(w)``, the extra
    one with probability ``q - floor(q)``, and the counts always sum to ``n``.
    """
    total = sum(weights.values())
    quotas = {name: n * w / total for name, w in weights.items()}
    counts = {name: math.floor(q) for name, q in quotas.items()}
    left = n - sum(counts.values())
    point, edge = rng.random(), 0.0
    bumped: list[str] = []
    for name, q in quotas.items():
        edge += q - counts[name]
        if left > len(bumped) and point < edge:  # fractions are < 1: at most one point per name
            bumped.append(name)
            point += 1.0
    for name in sorted(quotas, key=lambda k: counts[k] - quotas[k]):  # float rounding fallback
        if len(bumped) == left:
            break
        if name not in bumped:
            bumped.append(name)
    for name in bumped:
        counts[name] += 1
    return counts


def _owners(schedulers: Mapping[str, Any]) -> dict[str, str]:
    """``{task_id: name of the child whose taskset holds it}``; task ids must not repeat across tasksets."""
    owner: dict[str, str] = {}
    for name, child in schedulers.items():
        for task in child.taskset:
            other = owner.setdefault(task.task_id, name)
            if other != name:
                raise ValueError(
                    f"task id {task.task_id!r} is in both taskset {other!r} and {name!r}; task ids must be unique "
                    "across mixed tasksets: give the tasksets distinct names (ids are 'name/row') or distinct id_key values."
                )
    return owner
