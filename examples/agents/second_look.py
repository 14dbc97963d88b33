"""A custom multi-turn workflow in a few lines: answer, be asked to check, answer again.

The model answers; the workflow replies "Check your answer." and the model answers once more. Only the
final answer is scored. The conversation is one token-in token-out Trajectory: the workflow's message is
appended as tokens with action_mask 0, the model's turns exactly as sampled.

    trine run config.yaml --plugin examples/agents/second_look.py      (tasks.train.workflow: second_look)
"""

from __future__ import annotations

from trine import register
from trine.types import Experience, Task
from trine.workflows import RolloutModel, ScoreFn, Trajectory


@register("workflow", "second_look")
class SecondLook:
    def __init__(self, reward: ScoreFn, *, prompt: str = "Check your answer.", max_tokens: int = 256) -> None:
        self.reward, self.prompt, self.max_tokens = reward, prompt, max_tokens

    async def run(self, task: Task, model: RolloutModel) -> list[Experience]:
        return [await self.episode(task, model) for _ in range(task.repeat)]

    async def episode(self, task: Task, model: RolloutModel) -> Experience:
        traj = Trajectory(model.tokenizer, task.messages(), max_tokens=self.max_tokens)
        params = task.sampling.replace(n=1)
        for turn in range(2):
            room = min(params.max_tokens, traj.room())
            if room < 1:
                traj.end("truncated", "no room for another turn")
                break
            (completion,) = await model.generate(traj.tokens, params.replace(max_tokens=room))
            traj.add_completion(completion, model.policy_version)
            if turn == 0 and not traj.add_messages([{"role": "user", "content": self.prompt}]):
                break
        reward, parts = await self.reward(traj.turns[-1].text, task)
        return traj.experience(reward, parts, params.temperature)
