"""A verifiers (v0.4, ``verifiers.v1``) taskset defined in code: one-digit sums, scored by exact match.

Nothing is downloaded: the tasks are built in :meth:`TrineSumsTaskset.load`. verifiers finds a taskset by
importing the package named by its id (``vf-eval trine-sums`` imports ``trine_sums``), so this folder's
parent goes on ``PYTHONPATH``. examples/verifiers/README.md runs it against ``trine serve``.
"""

from __future__ import annotations

import random
import re

import verifiers.v1 as vf


class TrineSumsData(vf.TaskData):
    """One question and its answer."""

    answer: str = ""


class TrineSumsTask(vf.Task[TrineSumsData]):
    """Reward 1 when the last number in the model's last reply is the sum, else 0."""

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        replies = [m for m in trace.messages if getattr(m, "role", None) == "assistant"]
        text = str(getattr(replies[-1], "content", "") or "") if replies else ""
        numbers = re.findall(r"-?\d+", text)
        return float(bool(numbers) and numbers[-1] == self.data.answer)


class TrineSumsConfig(vf.TasksetConfig):
    num_tasks: int = 16
    """How many sums to build."""
    seed: int = 0
    """Seed of the operands."""


class TrineSumsTaskset(vf.Taskset[TrineSumsTask, TrineSumsConfig]):
    def load(self) -> list[TrineSumsTask]:
        rng = random.Random(self.config.seed)
        tasks = []
        for i in range(self.config.num_tasks):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            data = TrineSumsData(id=f"sum-{i}", prompt=f"{a}+{b}=", answer=str(a + b))
            tasks.append(TrineSumsTask(data, self.config.task))
        return tasks


__all__ = ["TrineSumsTaskset"]
