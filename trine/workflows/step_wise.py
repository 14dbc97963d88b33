"""Step-wise workflow: an agent acts in a text environment, one Experience per environment step.

For each of ``task.repeat`` rollouts (run concurrently, so the engine batches their requests) the
workflow builds a fresh environment, resets it, and loops: prompt = (system prompt) + the current
observation as the user message, ``await model.chat(..., n=1)``, ``env.step(completion.text)``.
Each step becomes one :class:`~trine.types.Experience` whose prompt is only the *current*
observation (not the whole history), so sequences stay short::

    Experience(tokens=prompt + response, action_mask=[1] * len(response), logprobs=...,
               reward=<step reward>, run_id=<one per rollout>, step=<t>,
               info={"env_state_hash", "step_reward", "episode_return", "success", ...})

That is what the multi-step advantages read: ``step_wise_grpo`` (the last step's reward of each
run, broadcast to its steps) and ``gigpo`` (per-step rewards, ``run_id``, ``step`` and
``info["env_state_hash"]``, the hash of the state the action was taken *from*). The explorer fills
in ``group_id`` (one per task) as for any workflow.

Rewards come from the environment; the task's ``reward`` function (the ``reward`` argument the
explorer passes) is not used by this workflow.

The workflow sees environments only through the async
:class:`~trine.workflows.envs.base.Environment` protocol (``await env.reset(task)``,
``await env.step(text)``, ``env.state_hash()``). A blocking environment class (``reset()`` without a
task, built from keyword arguments) is run behind it by
:class:`~trine.workflows.envs.base.BlockingEnvironment`: in worker threads bounded by the explorer's
task timeout, or inline when the class says ``blocking = False`` (the grid world does, which keeps
seeded sampling bit-reproducible). The workflow itself never deals with threads.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from trine import registry
from trine.types import Completion, Experience, Task, new_id
from trine.workflows.base import RolloutModel, ScoreFn, completion_experience
from trine.workflows.envs.base import EnvFactory, environment_maker
from trine.workflows.envs.grid_world import GridWorld


def resolve_env(env: str | EnvFactory) -> EnvFactory:
    """The environment class for ``env``: a registered name (registry kind ``"environment"``),
    ``"package.module:Class"``, or a class / callable given as is."""
    if callable(env):
        return env
    if isinstance(env, str):
        return registry.resolve("environment", env)
    raise ValueError(
        f"env={env!r}; expected an environment name, an import path 'package.module:Class', or a class."
    )


class StepWiseWorkflow:
    """Run ``task.repeat`` episodes of a text environment; one Experience per step.

    Args:
        reward: the explorer's score function; unused (the environment gives the rewards).
        env: environment name (``"grid_world"``, or one registered as kind ``"environment"``),
            ``"package.module:Class"`` or a class (async, or blocking: see
            :func:`~trine.workflows.envs.base.environment_maker`).
        env_args: keyword arguments of the environment for every task; for a blocking environment
            the task's row (``task.raw``) overrides them for each key that names a parameter of the
            environment (e.g. a grid-world row's ``size``, ``seed``, ``holes``, ``max_steps``).
        max_steps: cap on steps per episode when neither the row nor ``env_args`` has
            ``max_steps`` (the environment may end an episode sooner).
        system_prompt: system message of every step when the task has none.
    """

    registry_args: ClassVar[dict[str, str]] = {"env": "environment"}
    """Arguments that name an entry of another registry kind (``trine validate`` checks them)."""

    def __init__(
        self,
        reward: ScoreFn | None = None,
        *,
        env: str | EnvFactory = "grid_world",
        env_args: dict[str, Any] | None = None,
        max_steps: int = 30,
        system_prompt: str | None = None,
    ) -> None:
        if not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps={max_steps!r}; expected an integer >= 1.")
        self.reward = reward
        self.env_args = dict(env_args or {})
        self.new_env = environment_maker(resolve_env(env), self.env_args)
        self.max_steps = max_steps
        self.system_prompt = system_prompt

    def step_limit(self, task: Task) -> int:
        """Most steps an episode of ``task`` may take."""
        return int(task.raw.get("max_steps") or self.env_args.get("max_steps") or self.max_steps)

    async def run(self, task: Task, model: RolloutModel) -> list[Experience]:
        """All steps of ``task.repeat`` concurrent episodes, episode by episode."""
        episodes = await asyncio.gather(*(self.episode(task, model, i) for i in range(task.repeat)))
        return [e for episode in episodes for e in episode]

    async def episode(self, task: Task, model: RolloutModel, index: int = 0) -> list[Experience]:
        """Play one episode; returns its steps with the episode return filled in."""
        env = self.new_env()
        observation = await env.reset(task)
        state = env.state_hash()
        params = task.sampling.replace(n=1)
        run_id = new_id("run-")
        steps: list[Experience] = []
        env_info: dict[str, Any] = {}
        for t in range(self.step_limit(task)):
            completion = (await model.chat(self.messages(task, observation), params))[0]
            observation, reward, done, env_info = await env.step(completion.text)
            steps.append(
                _step_experience(completion, float(reward), task, run_id, t, state, params.temperature)
            )
            steps[-1].info.update(rollout_index=index, env_info=env_info)
            if done:
                break
            state = env.state_hash()
        episode_return = sum(float(e.reward or 0.0) for e in steps)
        success = bool(env_info.get("success", episode_return > 0))
        for e in steps:
            e.info.update(episode_return=episode_return, success=success, episode_length=len(steps))
            e.info["last_step"] = e is steps[-1]
        return steps

    def messages(self, task: Task, observation: str) -> list[dict[str, str]]:
        """The chat of one step: the system prompt (if any) and the observation."""
        system = task.system_prompt or self.system_prompt
        chat = [{"role": "system", "content": system}] if system else []
        return chat + [{"role": "user", "content": observation}]


class GridWorldWorkflow(StepWiseWorkflow):
    """:class:`StepWiseWorkflow` over the built-in :class:`~trine.workflows.envs.grid_world.GridWorld`.

    Task rows (see :func:`~trine.workflows.envs.grid_world.grid_world_tasks`) carry ``size``,
    ``seed``, ``holes`` and ``max_steps``.
    """

    def __init__(self, reward: ScoreFn | None = None, **kwargs: Any) -> None:
        if "env" in kwargs:
            raise ValueError(
                f"workflow 'grid_world' always uses GridWorld, got env={kwargs['env']!r}; "
                "use workflow 'step_wise' with env=... for another environment."
            )
        super().__init__(reward, env=GridWorld, **kwargs)


def _step_experience(
    completion: Completion, reward: float, task: Task, run_id: str, step: int, state: str, temperature: float
) -> Experience:
    exp = completion_experience(completion, reward, {}, temperature)
    exp.task_id, exp.run_id, exp.step = task.task_id, run_id, step
    del exp.info["reward_parts"]
    exp.info.update({"env_state_hash": state, "step_reward": reward})
    return exp
