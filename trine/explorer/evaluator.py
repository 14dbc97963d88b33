"""Evaluation on the eval tasksets (``eval/<taskset>/*``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trine.explorer.evaluator import Evaluator
    from trine.explorer.runner import Explorer
    from trine.tasks import TaskSet


@dataclass
class Evaluator:
    """``eval/<taskset>/*`` on the eval tasksets with the weights its explorer samples (the trainer's
    own in a run, a checkpoint's in ``trine bench``)."""

    explorer: Explorer
    tasksets: list[TaskSet]
    k: int = 1
    greedy: bool = True
    success_threshold: float = 1.0
    seed: int = 0
    """Evaluation at global step ``s`` samples with seed ``seed + s``."""
    table_rows: int = 8
    """Rollouts per taskset sent to the monitor as the table ``eval/<taskset>/samples``."""

    def plan(self) -> str:
        """What an evaluation runs, for the console: ``addition (100 tasks × 8 samples + greedy)``."""
        draws = " + ".join([f"{self.k} sample{'s' if self.k > 1 else ''}"] + ["greedy"] * self.greedy)
        return ", ".join(f"{ts.name} ({len(ts)} tasks × {draws})" for ts in self.tasksets)

    def evaluate(self, step: int, monitor: Any = None) -> dict[str, float]:
        """Metrics of every eval taskset at global ``step``; a few rollouts (prompt, response,
        reward) go to ``monitor`` as a table when one is given."""
        out: dict[str, float] = {}
        for ts in self.tasksets:
            rows: list[dict[str, Any]] = []
            out.update(
                self.explorer.evaluate(
                    list(ts),
                    name=ts.name,
                    k=self.k,
                    greedy=self.greedy,
                    success_threshold=self.success_threshold,
                    seed=self.seed + step,
                    samples=rows,
                )
            )
            if rows and monitor is not None:
                monitor.log_table(f"eval/{ts.name}/samples", rows[: self.table_rows], step)
        return out
