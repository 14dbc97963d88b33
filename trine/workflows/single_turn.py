"""Single-turn workflow: one chat prompt, a group of ``repeat`` sampled answers, one reward each.

With ``greedy_baseline=True`` (ReMax, Li et al., arXiv 2310.10505) the workflow also asks for one
greedy completion of the same prompt, concurrently with the samples, scores it with the same
reward and stores that reward as ``info["baseline_reward"]`` in every returned experience (the
greedy completion itself is not returned). The ``remax`` advantage reads it.

With ``defer_reward=True`` the reward function is not called: experiences come back with
``reward=None`` (pending in the buffer, :func:`~trine.workflows.base.leave_pending`) and carry what an
external judge needs (``info["response"]``, ``info["answer"]``, ``info["task_id"]``); rewards arrive later
through ``Buffer.set_rewards`` or ``trine buffer reward RUN_DIR FILE``.

A reward call that raises or passes ``explorer.reward_timeout`` costs its own answer only: that
experience gets status ``reward_error`` (reward 0.0, the reason in ``info["reward_error"]``), is stored
for inspection and kept out of the loss by ``trainer.train_statuses``; the group's other answers train.
With ``greedy_baseline`` a failed baseline reward fails the task (there is no baseline to train with).
"""

from __future__ import annotations

import asyncio
import logging

from trine.types import Experience, Task
from trine.workflows.base import RolloutModel, ScoreFn, completion_experience, leave_pending

log = logging.getLogger(__name__)


class SingleTurnWorkflow:
    """Chat-template the task, sample ``task.repeat`` responses, score each with the reward.

    Args:
        reward: ``await reward(response_text, task) -> (reward, parts)``.
        greedy_baseline: also score one greedy (temperature 0, n=1) completion and store its
            reward as ``info["baseline_reward"]`` (ReMax).
        defer_reward: leave rewards pending for an external judge (delayed rewards).
    """

    def __init__(self, reward: ScoreFn, greedy_baseline: bool = False, defer_reward: bool = False) -> None:
        if greedy_baseline and defer_reward:
            raise ValueError("greedy_baseline needs rewards now; it cannot be combined with defer_reward")
        self.reward = reward
        self.greedy_baseline = greedy_baseline
        self.defer_reward = defer_reward

    async def run(self, task: Task, model: RolloutModel) -> list[Experience]:
        """Sample, score and wrap ``task.repeat`` completions of the task's prompt."""
        if self.greedy_baseline:
            return await self._run_with_baseline(task, model)
        params = task.sampling.replace(n=task.repeat)
        completions = await model.chat(task.messages(), params)
        if self.defer_reward:
            return leave_pending(
                [completion_experience(c, None, {}, params.temperature) for c in completions], task
            )
        scores = await asyncio.gather(*(self._score(c.text, task) for c in completions))
        return [
            _marked(completion_experience(c, reward, parts, params.temperature), error)
            for c, (reward, parts, error) in zip(completions, scores)
        ]

    async def _score(self, text: str, task: Task) -> tuple[float, dict[str, float], str | None]:
        """(reward, parts, None), or (0.0, {}, why) when the reward raised or timed out."""
        try:
            reward, parts = await self.reward(text, task)
        except Exception as err:  # noqa: BLE001 - recorded as the answer's status, not a failed task
            why = f"{type(err).__name__}: {err}"[:500]
            log.warning("task %s: an answer's reward failed (status reward_error): %s", task.task_id, why)
            return 0.0, {}, why
        return reward, parts, None

    async def _run_with_baseline(self, task: Task, model: RolloutModel) -> list[Experience]:
        params = task.sampling.replace(n=task.repeat)
        greedy = task.sampling.replace(n=1, temperature=0.0)
        messages = task.messages()
        completions, greedy_completions = await asyncio.gather(
            model.chat(messages, params), model.chat(messages, greedy)
        )
        greedy_score, *scores = await asyncio.gather(
            self.reward(greedy_completions[0].text, task), *(self._score(c.text, task) for c in completions)
        )
        baseline = float(greedy_score[0])
        out = []
        for c, (reward, parts, error) in zip(completions, scores):
            exp = _marked(completion_experience(c, reward, parts, params.temperature), error)
            exp.info["baseline_reward"] = baseline
            exp.info["baseline_response"] = greedy_completions[0].text
            out.append(exp)
        return out


def _marked(exp: Experience, error: str | None) -> Experience:
    if error is not None:
        exp.status = "reward_error"
        exp.info["reward_error"] = error
    return exp
