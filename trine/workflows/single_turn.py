"""Single-turn workflow: one chat prompt, a group of ``repeat`` sampled answers, one reward each."""

from __future__ import annotations

import asyncio

from trine.types import Experience, Task
from trine.workflows.base import RolloutModel, ScoreFn, completion_experience


class SingleTurnWorkflow:
    """Chat-template the task, sample ``task.repeat`` responses, score each with the reward."""

    def __init__(self, reward: ScoreFn) -> None:
        self.reward = reward

    async def run(self, task: Task, model: RolloutModel) -> list[Experience]:
        params = task.sampling.replace(n=task.repeat)
        completions = await model.chat(task.messages(), params)
        scores = await asyncio.gather(*(self.reward(c.text, task) for c in completions))
        return [
            completion_experience(c, reward, parts, params.temperature)
            for c, (reward, parts) in zip(completions, scores)
        ]
