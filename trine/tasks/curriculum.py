"""CurriculumScheduler: online task selection from the pass rates the explorer reports.

A simplified BOTS (Shen et al., "BOTS: A Unified Framework for Bayesian Online Task Selection in LLM
Reinforcement Finetuning", arXiv 2510.26374), keeping its explicit evidence and Thompson sampling and
leaving out the implicit (interpolated) evidence for tasks that were not run.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from trine.tasks.scheduler import Stats, TaskScheduler, _as_number, _stats_rows
from trine.types import Task


class CurriculumScheduler(TaskScheduler):
    """Picks the tasks whose pass rate is estimated to be near ``target_pass_rate``.

    Tasks that are always solved (pass rate 1) or never (0) give GRPO-style algorithms no signal;
    the most informative ones sit in between. Each task ``k`` keeps a Beta posterior over its pass
    rate ``p_k``, starting from the prior ``Beta(a0, b0)`` with ``a0 = prior_pass_rate *
    prior_strength`` and ``b0 = (1 - prior_pass_rate) * prior_strength``. With forgetting factor
    ``lambda = forgetting``, every batch handed out (one step) pulls each posterior back towards
    the prior, and feedback adds its evidence (BOTS's update with explicit evidence only)::

        a_k <- (1 - lambda) * a_k + lambda * a0        b_k <- (1 - lambda) * b_k + lambda * b0
        a_k <- a_k + s_k                               b_k <- b_k + f_k

    where ``s_k = pass_rate_k * repeat_k`` and ``f_k = (1 - pass_rate_k) * repeat_k`` are the
    successes and failures reported through ``feedback(task_ids, {"pass_rate": [...]})``
    (``repeat`` is the task's group size). Forgetting lets the estimate follow a policy that
    improves; it is applied lazily, so a step costs nothing for tasks without feedback. The
    smoothed estimate is the posterior mean ``p_hat_k = a_k / (a_k + b_k)`` (:meth:`estimate`).

    Selection is Thompson sampling: each batch draws ``p~_k ~ Beta(a_k, b_k)`` for every task and
    takes the ``n`` tasks with the smallest ``|p~_k - target_pass_rate|`` (distinct tasks while
    ``n <= num_tasks``). Unseen tasks have a wide posterior, so they keep being explored; tasks
    known to be far from the target are almost never picked.

    An "epoch" is ``num_tasks`` tasks handed out: ``epochs`` bounds the run like
    :class:`TaskScheduler` does (None: endless). The random stream of batch ``t`` is seeded by
    ``(seed, t)`` alone, so ``state_dict()`` (position, posteriors, statistics) restores it exactly.

    Args:
        taskset: a :class:`~trine.tasks.TaskSet` or any sequence of :class:`~trine.types.Task`.
        target_pass_rate: pass rate to aim for, in (0, 1).
        prior_pass_rate: prior mean pass rate of a task never run, in (0, 1).
        prior_strength: prior pseudo-count ``a0 + b0`` (2 with prior 0.5 is the uniform prior).
        forgetting: ``lambda`` in [0, 1]: share of each task's evidence forgotten per batch (0.01: a
            half-life of ~70 batches). Keep it well below ``batch_size / num_tasks``, or evidence
            fades before a task comes round again and selection degrades towards uniform.
        seed: seed of the Thompson draws.
        epochs: number of ``num_tasks``-sized passes to hand out; None repeats forever.
    """

    def __init__(
        self,
        taskset: Sequence[Task],
        *,
        target_pass_rate: float = 0.5,
        prior_pass_rate: float = 0.5,
        prior_strength: float = 2.0,
        forgetting: float = 0.01,
        seed: int = 42,
        epochs: int | None = 1,
    ) -> None:
        super().__init__(taskset, selector="sequential", seed=seed, epochs=epochs)
        _check_open_unit("target_pass_rate", target_pass_rate)
        _check_open_unit("prior_pass_rate", prior_pass_rate)
        if not prior_strength > 0:
            raise ValueError(f"prior_strength={prior_strength!r}; expected a pseudo-count > 0 (e.g. 2).")
        if not 0 <= forgetting <= 1:
            raise ValueError(f"forgetting={forgetting!r}; expected a share in [0, 1] (e.g. 0.01).")
        self.target_pass_rate = float(target_pass_rate)
        self.prior = (prior_pass_rate * prior_strength, (1 - prior_pass_rate) * prior_strength)
        self.forgetting = float(forgetting)
        self.round = 0
        """Batches handed out so far (the step ``t`` of the update rule)."""
        self.posterior: dict[str, list[float]] = {}
        """Per task id with feedback: ``[a, b, round of the last update]``; others are at the prior."""
        self._index = {task.task_id: i for i, task in enumerate(taskset)}

    def estimate(self, task_id: str) -> float:
        """The smoothed pass rate ``p_hat = a / (a + b)`` of ``task_id`` now (the prior mean if unseen)."""
        a, b = self._beta(task_id)
        return a / (a + b)

    def next_batch(self, n: int) -> list[Task]:
        """``n`` tasks picked by Thompson sampling (fewer at the very end; ``[]`` once exhausted)."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"next_batch(n={n!r}); expected an integer batch size >= 1.")
        left = self.remaining()
        k = n if left is None else min(n, left)
        if k == 0:
            return []
        rng = random.Random(f"curriculum/{self.seed}/{self.round}")
        scored = []
        for task in self.taskset:
            a, b = self._beta(task.task_id)
            scored.append((abs(rng.betavariate(a, b) - self.target_pass_rate), rng.random(), task))
        scored.sort(key=lambda item: item[:2])
        batch = [scored[i % len(scored)][2] for i in range(k)]
        self.round += 1
        self.cursor += k
        self.epoch, self.cursor = self.epoch + self.cursor // self.num_tasks, self.cursor % self.num_tasks
        return batch

    def feedback(self, task_ids: Sequence[str], stats: Stats) -> None:
        """Record statistics (see :meth:`TaskScheduler.feedback`) and update the posterior of every
        task with a ``pass_rate`` (a number in [0, 1], or a list of per-rollout 0/1 outcomes)."""
        task_ids = list(task_ids)
        rates = [_as_number("pass_rate", row.get("pass_rate")) for row in _stats_rows(task_ids, stats)]
        bad = [(t, r) for t, r in zip(task_ids, rates, strict=True) if r is not None and not 0 <= r <= 1]
        if bad:
            raise ValueError(
                f"feedback pass_rate={bad[0][1]!r} for task {bad[0][0]!r}; expected a share in [0, 1] "
                "(the fraction of the task's rollouts that passed)."
            )
        super().feedback(task_ids, stats)  # checks the ids; records every metric
        for task_id, rate in zip(task_ids, rates, strict=True):
            if rate is None:
                continue
            repeat = max(1, int(self.taskset[self._index[task_id]].repeat))
            a, b = self._beta(task_id)
            self.posterior[task_id] = [a + rate * repeat, b + (1 - rate) * repeat, float(self.round)]

    def _beta(self, task_id: str) -> tuple[float, float]:
        """``(a, b)`` of ``task_id`` at the current round (forgetting applied lazily)."""
        record = self.posterior.get(task_id)
        if record is None:
            return self.prior
        a, b, last = record
        keep = (1 - self.forgetting) ** max(0.0, self.round - last)
        a0, b0 = self.prior
        return a0 + keep * (a - a0), b0 + keep * (b - b0)

    def state_dict(self) -> dict[str, Any]:
        """Position, statistics, round and posteriors, as plain JSON-able data."""
        state = super().state_dict()
        state["curriculum"] = {
            "round": self.round,
            "posterior": {task_id: list(record) for task_id, record in self.posterior.items()},
            "target_pass_rate": self.target_pass_rate,
            "prior": list(self.prior),
            "forgetting": self.forgetting,
        }
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state_dict`; the following batches equal those of the saved scheduler."""
        if "curriculum" not in state:
            raise ValueError(
                "scheduler state has no 'curriculum' entry: it was saved by a plain TaskScheduler; resume "
                "with the same scheduler settings (tasks.curriculum), or start without the saved state."
            )
        super().load_state_dict(state)
        saved = state["curriculum"]
        self.round = int(saved["round"])
        self.posterior = {
            task_id: [float(v) for v in record] for task_id, record in saved["posterior"].items()
        }


def _check_open_unit(name: str, value: float) -> None:
    if not 0 < value < 1:
        raise ValueError(f"{name}={value!r}; expected a pass rate strictly between 0 and 1 (e.g. 0.5).")
