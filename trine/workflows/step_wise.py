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

The environment's construction, ``reset``, ``step`` and ``state_hash`` may block (a simulator, a
subprocess, a web page): they run in worker threads through :func:`trine.blocking.run_blocking`,
so the event loop keeps serving the other tasks and the explorer's task timeout bounds them.
An environment class that is pure, fast Python may say so with ``blocking = False`` (the grid world
does): its calls then run inline in the event loop. That keeps sampling bit-reproducible for a
seed: the engine batches whichever requests are waiting, so environment steps that finish in
threads at timing-dependent moments change which requests share a batch and which random numbers
each row draws.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from trine.blocking import run_blocking
from trine.types import Completion, Experience, Task, new_id
from trine.workflows.base import RolloutModel, ScoreFn, completion_experience
from trine.workflows.envs import ENVIRONMENTS
from trine.workflows.envs.grid_world import GridWorld


def resolve_env(env: str | Callable[..., Any]) -> Callable[..., Any]:
    """The environment factory for ``env``: a built-in name, ``"package.module:Class"`` or a callable."""
    if callable(env):
        return env
    if isinstance(env, str) and env in ENVIRONMENTS:
        return ENVIRONMENTS[env]
    if isinstance(env, str) and ":" in env:
        from trine.registry import import_object

        try:
            return import_object(env)
        except (ImportError, AttributeError, ValueError) as err:
            raise ValueError(f"environment {env!r} could not be imported: {err}") from err
    raise ValueError(
        f"env={env!r} is not a known environment; expected one of {sorted(ENVIRONMENTS)}, an import path "
        "'package.module:Class', or a callable returning an environment."
    )


class StepWiseWorkflow:
    """Run ``task.repeat`` episodes of a text environment; one Experience per step.

    Args:
        reward: the explorer's score function; unused (the environment gives the rewards).
        env: environment name (``"grid_world"``), ``"package.module:Class"`` or a callable.
        env_args: keyword arguments of the environment for every task; the task's row
            (``task.raw``) overrides them for each key that names a parameter of the environment
            (e.g. a grid-world row's ``size``, ``seed``, ``holes``, ``max_steps``).
        max_steps: cap on steps per episode when neither the row nor ``env_args`` has
            ``max_steps`` (the environment may end an episode sooner).
        system_prompt: system message of every step when the task has none.
    """

    def __init__(
        self,
        reward: ScoreFn | None = None,
        *,
        env: str | Callable[..., Any] = "grid_world",
        env_args: dict[str, Any] | None = None,
        max_steps: int = 30,
        system_prompt: str | None = None,
    ) -> None:
        if not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps={max_steps!r}; expected an integer >= 1.")
        self.reward = reward
        self.env_factory = resolve_env(env)
        self.env_args = dict(env_args or {})
        self.max_steps = max_steps
        self.system_prompt = system_prompt
        self._env_params = _named_params(self.env_factory)
        self._inline = getattr(self.env_factory, "blocking", True) is False

    def make_env(self, task: Task) -> Any:
        """A fresh environment for ``task`` (``env_args`` updated with the row's matching keys)."""
        args = dict(self.env_args)
        args.update({k: v for k, v in task.raw.items() if k in self._env_params})
        return self.env_factory(**args)

    def step_limit(self, task: Task) -> int:
        """Most steps an episode of ``task`` may take."""
        return int(task.raw.get("max_steps") or self.env_args.get("max_steps") or self.max_steps)

    async def run(self, task: Task, model: RolloutModel) -> list[Experience]:
        """All steps of ``task.repeat`` concurrent episodes, episode by episode."""
        episodes = await asyncio.gather(*(self.episode(task, model, i) for i in range(task.repeat)))
        return [e for episode in episodes for e in episode]

    async def episode(self, task: Task, model: RolloutModel, index: int = 0) -> list[Experience]:
        """Play one episode; returns its steps with the episode return filled in."""
        env = await self._call(self.make_env, task)
        observation, state = await self._call(_reset, env)
        params = task.sampling.replace(n=1)
        run_id = new_id("run-")
        steps: list[Experience] = []
        env_info: dict[str, Any] = {}
        for t in range(self.step_limit(task)):
            completion = (await model.chat(self.messages(task, observation), params))[0]
            (observation, reward, done, env_info), next_state = await self._call(_step, env, completion.text)
            steps.append(
                _step_experience(completion, float(reward), task, run_id, t, state, params.temperature)
            )
            steps[-1].info.update(rollout_index=index, env_info=env_info)
            if done:
                break
            state = next_state
        episode_return = sum(float(e.reward or 0.0) for e in steps)
        success = bool(env_info.get("success", episode_return > 0))
        for e in steps:
            e.info.update(episode_return=episode_return, success=success, episode_length=len(steps))
            e.info["last_step"] = e is steps[-1]
        return steps

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` inline for a ``blocking = False`` environment, else in a worker thread."""
        return fn(*args) if self._inline else await run_blocking(fn, *args)

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


def _reset(env: Any) -> tuple[str, str]:
    """``env.reset()`` and the hash of the state it starts in (one blocking call)."""
    return env.reset(), env.state_hash()


def _step(env: Any, action: str) -> tuple[tuple[str, float, bool, dict[str, Any]], str | None]:
    """``env.step(action)`` and the hash of the state it leads to (None once the episode is done)."""
    result = env.step(action)
    return result, None if result[2] else env.state_hash()


def _named_params(factory: Callable[..., Any]) -> set[str]:
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return set()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {p.name for p in parameters if p.kind in kinds}


def _step_experience(
    completion: Completion, reward: float, task: Task, run_id: str, step: int, state: str, temperature: float
) -> Experience:
    exp = completion_experience(completion, reward, {}, temperature)
    exp.task_id, exp.run_id, exp.step = task.task_id, run_id, step
    del exp.info["reward_parts"]
    exp.info.update({"env_state_hash": state, "step_reward": reward})
    return exp
