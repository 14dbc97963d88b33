"""Evaluation on the eval tasksets (``eval/<taskset>/*``)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
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

    def key(self, step: int) -> str:
        """What an evaluation at global ``step`` depends on besides the weights: the tasks (ids, workflow,
        reward, sampling and their arguments), ``k``, ``greedy``, the threshold and the seed. Equal keys at
        the same step of one run (a stage's last step and the next stage's start) give equal results, so the
        loop evaluates once (:func:`trine.loop._run_stage`)."""
        tasks = [
            [t.task_id, t.workflow, t.workflow_args, t.reward, t.reward_args, asdict(t.sampling)]
            for ts in self.tasksets
            for t in ts
        ]
        about = [step, self.k, self.greedy, self.success_threshold, self.seed + step, tasks]
        return hashlib.sha1(json.dumps(about, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def seen(self, step: int, stages: dict[str, dict[str, Any]]) -> dict[str, float] | None:
        """The result of an evaluation a stage record of ``stages`` (the run summary's) made at ``step``
        with this :meth:`key` (``eval_end`` / ``eval_key``), else None: what the next stage reuses for its
        ``eval_start`` instead of evaluating the same weights again."""
        key = self.key(step)
        found = [r["eval_end"] for r in stages.values() if r.get("eval_key") == key and "eval_end" in r]
        return found[-1] if found else None

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
