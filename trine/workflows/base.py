"""The Workflow protocol: how a task becomes experiences.

A workflow is built once per (workflow, reward) pair by the explorer as
``WorkflowClass(reward=score_fn, **workflow_args)`` and then run for many tasks::

    experiences = await workflow.run(task, model)

``model`` is a rollout model (:class:`trine.models.protocol.RolloutModel`): it has
``await model.generate(prompt_ids, params)`` and ``await model.chat(messages, params)`` returning
lists of :class:`~trine.types.Completion`, and a ``tokenizer``. ``score_fn`` is ``await score_fn(response_text, task) -> (reward, parts)``; the
explorer builds it from the task's reward function with a timeout, so a workflow never needs to
know which reward it is using.

Multi-turn workflows build experiences token-in, token-out: they keep the sampled token ids as
they are and append only the new observation tokens with ``action_mask`` 0.

Each returned Experience should carry ``info["temperature"]`` (the trainer recomputes logprobs at
it; :func:`completion_experience` sets it). The explorer fills in ``task_id``, ``group_id``,
``run_id`` and ``policy_version`` when left empty. docs/workflows.md documents the whole contract
with runnable single-turn and step-wise examples.

**Delayed rewards.** Every built-in workflow (``single_turn``, ``multi_turn``, ``step_wise``, ``tool_agent``)
takes ``defer_reward`` (default False): True leaves each rollout's reward pending (:func:`leave_pending`) for
a grader or a person to fill later through ``Buffer.set_rewards`` or ``trine buffer reward RUN_DIR FILE``;
the buffer keeps pending rows out of training until then.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, runtime_checkable

from trine.models.protocol import RolloutModel
from trine.types import Completion, Experience, Task

ScoreFn = Callable[[str, Task], Awaitable[tuple[float, dict[str, float]]]]


@runtime_checkable
class Workflow(Protocol):
    async def run(self, task: Task, model: RolloutModel) -> list[Experience]: ...


def completion_experience(
    completion: Completion, reward: float | None, parts: dict[str, float], temperature: float
) -> Experience:
    """A single-turn Experience from one completion (every response token is an action); a partial
    rollout's per-token versions go to ``info["token_versions"]``."""
    exp = Experience(
        tokens=completion.prompt_ids + completion.response_ids,
        prompt_length=len(completion.prompt_ids),
        action_mask=[1] * len(completion.response_ids),
        logprobs=list(completion.logprobs),
        reward=reward,
        info={
            "response": completion.text,
            "finish_reason": completion.finish_reason,
            "reward_parts": parts,
            "temperature": temperature,
        },
    )
    if completion.token_versions is not None:
        exp.info["token_versions"] = list(completion.token_versions)
    return exp


DEFER_REWARD_KEYS = ("episode_return", "step_reward", "success", "turn_rewards")
"""``info`` entries that state a reward or an outcome; pending experiences carry them as None."""


def leave_pending(exps: list[Experience], task: Task) -> list[Experience]:
    """``exps`` with their rewards left pending (``defer_reward``): ``reward=None`` and the entries of
    :data:`DEFER_REWARD_KEYS` None, so nothing counts them as scored. What a grader needs stays in ``info``:
    ``response`` (the last turn's text), ``answer`` (the task's reference answer), ``task_id``, and
    ``env_return`` (an environment's own episode return, when the workflow played one). Fill them by
    experience id, or every step of a rollout at once by ``(task_id, run_id)``."""
    for e in exps:
        if e.info.get("episode_return") is not None:
            e.info["env_return"] = e.info["episode_return"]
        e.reward = None
        e.info.update({key: None for key in DEFER_REWARD_KEYS if key in e.info})
        e.info.update(answer=task.answer, task_id=task.task_id)
    return exps
