"""Step-wise workflow: an agent acts in a text environment, one Experience per environment step.

For each of ``task.repeat`` rollouts (run concurrently, so the engine batches their requests) the
workflow leases an environment from its pool, resets it, and loops: prompt = (system prompt) + the
current observation as the user message, ``await model.chat(..., n=1)``, ``env.step(completion.text)``.
Each step becomes one :class:`~trine.types.Experience` whose prompt is only the *current*
observation (not the whole history), so sequences stay short::

    Experience(tokens=prompt + response, action_mask=[1] * len(response), logprobs=...,
               reward=<step reward>, run_id=<one per rollout>, step=<t>,
               status=<how the episode ended>, info={"env_state_hash", "step_reward", "episode_return", ...})

``info["invalid_actions"]`` counts the episode's steps whose environment ``info["invalid_action"]`` was true
(:mod:`trine.explorer.outcomes` reports them).

That is what the multi-step advantages read: ``step_wise_grpo`` (the last step's reward of each
run, broadcast to its steps) and ``gigpo`` (per-step rewards, ``run_id``, ``step`` and
``info["env_state_hash"]``, the hash of the state the action was taken *from*). The explorer fills
in ``group_id`` (one per task) as for any workflow.

Rewards come from the environment; the task's ``reward`` function (the ``reward`` argument the
explorer passes) is not used by this workflow.

The workflow sees environments only through the async
:class:`~trine.workflows.envs.base.Environment` protocol, lent per episode by an
:class:`~trine.workflows.envs.pool.EnvPool`: every shape of environment class (async, Gymnasium-style,
classic blocking; see :mod:`trine.workflows.envs.base`) goes through the same adapter, and the pool
bounds each ``reset``/``step`` by ``env_timeout``.

**Faults.** An environment whose ``step`` (or ``state_hash``) raises or times out ends its episode:
the steps played so far are returned with ``Experience.status = "env_error"`` or ``"timeout"`` and
``info["status_reason"]`` (the message), and the environment is discarded, never reused. When no step
happened (``reset`` or the first ``step`` failed) the workflow raises the
:class:`~trine.workflows.envs.pool.EnvFailure` (after cancelling the task's other episodes), so the
explorer retries or skips the task and counts it. Normal episodes have ``status = "ok"``,
also when they end by the environment's or the workflow's step limit (those are ordinary RL
outcomes, kept in the loss).
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from trine.types import Completion, Experience, Task, new_id
from trine.workflows.base import RolloutModel, ScoreFn, completion_experience, leave_pending
from trine.workflows.envs.base import EnvFactory
from trine.workflows.envs.grid_world import GridWorldEnv
from trine.workflows.envs.pool import EnvFailure, EnvLease, make_env_pool, resolve_env

__all__ = ["GridWorldWorkflow", "StepWiseWorkflow", "resolve_env"]

CANCEL_GRACE = 5.0
"""Seconds the task's other episodes get to wind down after one of them failed before any step."""


class StepWiseWorkflow:
    """Run ``task.repeat`` episodes of a text environment; one Experience per step.

    Args:
        reward: the explorer's score function; unused (the environment gives the rewards).
        env: environment name (``"grid_world"``, ``"textarena"``, ``"gym"``, or one registered as
            kind ``"environment"``), ``"package.module:Class"`` or a class (async, Gymnasium-style
            or classic blocking: see :func:`~trine.workflows.envs.base.environment_maker`).
        env_args: keyword arguments of the environment for every task; for a blocking environment
            the task's row (``task.raw``) overrides them for each key that names a parameter of the
            environment (e.g. a grid-world row's ``size``, ``seed``, ``holes``, ``max_steps``).
        max_steps: cap on steps per episode when neither the row nor ``env_args`` has
            ``max_steps`` (the environment may end an episode sooner).
        system_prompt: system message of every step when the task has none.
        pool_size: environments kept and reused across episodes and tasks (at most this many exist;
            episodes wait for a free one). 0 (default): a new environment per episode, closed after
            it, as an environment whose ``reset`` does not fully restart it needs.
        env_timeout: seconds each ``reset``/``step`` may take before the episode ends with status
            ``"timeout"`` (None: only the explorer's task timeout bounds them).
        text_of: ``"package.module:function"`` (or a function) turning a Gymnasium-style
            environment's non-text observation into text: ``text_of(observation, info) -> str``.
        action_of: ``"package.module:function"`` (or a function) turning the reply into a
            Gymnasium-style environment's action: ``action_of(text) -> action``.
        option_keys: row keys passed to a Gymnasium-style ``reset`` as ``options``.
        seed_per_rollout: give each rollout of a task its own ``reset`` seed (default: the task's
            rollouts share one, the row's ``seed`` or one derived from the task id, so a group
            plays the same game).
        defer_reward: leave every step's reward pending for a grader or a person (the environment's
            episode return stays in ``info["env_return"]``; :func:`~trine.workflows.base.leave_pending`).
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
        pool_size: int = 0,
        env_timeout: float | None = 60.0,
        text_of: str | None = None,
        action_of: str | None = None,
        option_keys: list[str] | None = None,
        seed_per_rollout: bool = False,
        defer_reward: bool = False,
    ) -> None:
        if not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps={max_steps!r}; expected an integer >= 1.")
        self.reward = reward
        self.env_args = dict(env_args or {})
        self.envs = make_env_pool(
            env,
            self.env_args,
            size=pool_size,
            timeout=env_timeout,
            text_of=text_of,
            action_of=action_of,
            option_keys=option_keys or (),
            seed_per_rollout=seed_per_rollout,
        )
        self.max_steps = max_steps
        self.system_prompt = system_prompt
        self.defer_reward = defer_reward

    def step_limit(self, task: Task) -> int:
        """Most steps an episode of ``task`` may take."""
        return int(task.raw.get("max_steps") or self.env_args.get("max_steps") or self.max_steps)

    async def run(self, task: Task, model: RolloutModel) -> list[Experience]:
        """All steps of ``task.repeat`` concurrent episodes, episode by episode."""
        episodes = [asyncio.ensure_future(self.episode(task, model, i)) for i in range(task.repeat)]
        try:
            done = await asyncio.gather(*episodes)
        except BaseException:  # one episode failed before any step, or the task was cancelled
            for pending in episodes:
                pending.cancel()
            await asyncio.wait(episodes, timeout=CANCEL_GRACE)
            raise
        out = [e for episode in done for e in episode]
        return leave_pending(out, task) if self.defer_reward else out

    async def episode(self, task: Task, model: RolloutModel, index: int = 0) -> list[Experience]:
        """Play one episode; returns its steps with the episode return and status filled in.

        Raises :class:`~trine.workflows.envs.pool.EnvFailure` when the environment failed before
        any step was played.
        """
        async with self.envs.lease() as env:
            observation = await env.reset(task, index)
            steps, env_info = await self._play(env, task, model, index, observation)
        episode_return = sum(float(e.reward or 0.0) for e in steps)
        success = bool(env_info.get("success", episode_return > 0))
        status = env.failure.status if env.failure else "ok"
        invalid = sum(bool((e.info.get("env_info") or {}).get("invalid_action")) for e in steps)
        for e in steps:
            e.info.update(episode_return=episode_return, success=success, episode_length=len(steps))
            e.info["invalid_actions"] = invalid
            e.info["last_step"] = e is steps[-1]
            e.status = status
            if env.failure:
                e.info["status_reason"] = str(env.failure)[:500]
        return steps

    async def _play(
        self, env: EnvLease, task: Task, model: RolloutModel, index: int, observation: str
    ) -> tuple[list[Experience], dict[str, Any]]:
        """The steps of one episode and the last step's ``info``; stops at the first failure after
        a step (raises it when there was none)."""
        state = env.state_hash()
        params = task.sampling.replace(n=1)
        run_id = new_id("run-")
        steps: list[Experience] = []
        env_info: dict[str, Any] = {}
        for t in range(self.step_limit(task)):
            completion = (await model.chat(self.messages(task, observation), params))[0]
            try:
                observation, reward, done, env_info = await env.step(completion.text)
            except EnvFailure:
                if not steps:
                    raise
                break
            steps.append(
                _step_experience(completion, float(reward), task, run_id, t, state, params.temperature)
            )
            steps[-1].info.update(rollout_index=index, env_info=env_info)
            if done:
                break
            try:
                state = env.state_hash()
            except EnvFailure:
                break
        return steps, env_info

    async def aclose(self) -> None:
        """Close the pooled environments (the explorer calls it when it closes)."""
        await self.envs.aclose()

    def close(self) -> None:
        """:meth:`aclose` from code that runs no event loop."""
        asyncio.run(self.aclose())

    def messages(self, task: Task, observation: str) -> list[dict[str, str]]:
        """The chat of one step: the system prompt (if any) and the observation."""
        system = task.system_prompt or self.system_prompt
        chat = [{"role": "system", "content": system}] if system else []
        return chat + [{"role": "user", "content": observation}]


class GridWorldWorkflow(StepWiseWorkflow):
    """:class:`StepWiseWorkflow` over the built-in grid world
    (:class:`~trine.workflows.envs.grid_world.GridWorldEnv`).

    Task rows (see :func:`~trine.workflows.envs.grid_world.grid_world_tasks`) carry ``size``,
    ``seed``, ``holes`` and ``max_steps``.
    """

    def __init__(self, reward: ScoreFn | None = None, **kwargs: Any) -> None:
        if "env" in kwargs:
            raise ValueError(
                f"workflow 'grid_world' always uses GridWorld, got env={kwargs['env']!r}; "
                "use workflow 'step_wise' with env=... for another environment."
            )
        super().__init__(reward, env=GridWorldEnv, **kwargs)


def _step_experience(
    completion: Completion, reward: float, task: Task, run_id: str, step: int, state: str, temperature: float
) -> Experience:
    exp = completion_experience(completion, reward, {}, temperature)
    exp.task_id, exp.run_id, exp.step = task.task_id, run_id, step
    del exp.info["reward_parts"]
    exp.info.update({"env_state_hash": state, "step_reward": reward})
    return exp
