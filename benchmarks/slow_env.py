"""A single-turn workflow behind a simulated environment with a long-tailed (log-normal) latency, for
``benchmarks/modes.py``. A plugin file (``--plugin benchmarks/slow_env.py``), so that explorer processes
started by ``trine run`` register it too."""

from __future__ import annotations

import asyncio
import math
import random

from trine.registry import register
from trine.workflows import SingleTurnWorkflow


@register("workflow", "slow_env")
class SlowEnvironment(SingleTurnWorkflow):
    """Waits a log-normal time (median ``latency`` s, shape ``sigma``; seeded per task and visit) before
    the model answers: most tasks are quick, a few very slow."""

    def __init__(self, reward, latency: float = 0.2, sigma: float = 1.0) -> None:
        super().__init__(reward)
        self.mu, self.sigma = math.log(latency), sigma
        self.visits: dict[str, int] = {}

    async def run(self, task, model):
        visit = self.visits[task.task_id] = self.visits.get(task.task_id, 0) + 1
        delay = random.Random(f"{task.task_id}/{visit}").lognormvariate(self.mu, self.sigma)
        await asyncio.sleep(delay)
        return await super().run(task, model)
