"""The multi-turn workflow (``multi_turn``): a whole conversation with a text environment, token-in token-out.

Where ``step_wise`` shows the model only the current observation at each step, ``multi_turn`` keeps the
conversation: the environment's first observation is the first user message, every reply is sent to
``env.step`` and the next observation comes back as the next user message — appended to the exact tokens
sampled so far (:class:`~trine.workflows.trajectory.Trajectory`), never re-rendered. Environments are the
same as for ``step_wise`` (async, Gymnasium-style or classic blocking, by name or import path; the
pool, seeds and timeouts of :func:`~trine.workflows.envs.pool.make_env_pool`).

An episode ends when the environment says done, at ``max_steps`` (status ``ok``: an ordinary outcome), when
the conversation would pass ``max_tokens`` (``truncated``), when a turn takes longer than ``turn_timeout``
(``timeout``), or when the environment raises or hangs after the first step (``env_error`` /
``timeout``; a failure before any step raises, so the explorer retries or skips the task).

Rewards are the environment's per-step rewards (step-level credit). ``output: trajectory`` gives one
experience per episode with reward = the episode return; ``output: turns`` one experience per turn with the
step's reward, ``run_id`` / ``step`` and ``info["env_state_hash"]`` — what ``step_wise_grpo`` and ``gigpo``
read.

An environment whose constructor takes ``history`` (the built-in ``textarena``: each observation repeats
the whole game so far) gets ``history=False`` here unless ``env_args`` sets it: the conversation already
holds every earlier observation, so resending them would grow each turn by the whole transcript
(quadratic). ``history: true`` set explicitly is kept, with a warning.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

from trine.types import Experience, Task
from trine.workflows.base import RolloutModel, ScoreFn
from trine.workflows.envs.pool import EnvFailure, EnvLease, resolve_env
from trine.workflows.step_wise import StepWiseWorkflow
from trine.workflows.tool_agent import Output
from trine.workflows.trajectory import Trajectory

log = logging.getLogger(__name__)


class MultiTurnWorkflow(StepWiseWorkflow):
    """A conversation with an environment; see the module docstring.

    Takes every argument of :class:`~trine.workflows.step_wise.StepWiseWorkflow` (``env``, ``env_args``,
    ``max_steps``, ``system_prompt``, ``pool_size``, ``env_timeout``, ...) and:

    Args:
        max_tokens: token budget of the whole conversation (None: unbounded).
        turn_timeout: seconds one model turn may take (None: the explorer's task timeout bounds it).
        output: ``"trajectory"`` (one experience per episode) or ``"turns"`` (one per turn).
    """

    def __init__(
        self,
        reward: ScoreFn | None = None,
        *,
        max_tokens: int | None = None,
        turn_timeout: float | None = None,
        output: Output = "trajectory",
        **kwargs: Any,
    ) -> None:
        if output not in ("trajectory", "turns"):
            raise ValueError(f"output={output!r}; expected 'trajectory' or 'turns'.")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 2):
            raise ValueError(f"max_tokens={max_tokens!r}; expected an integer >= 2 or null.")
        kwargs["env_args"] = conversation_env_args(kwargs.get("env", "grid_world"), kwargs.get("env_args"))
        super().__init__(reward, **kwargs)
        self.max_tokens, self.turn_timeout, self.output = max_tokens, turn_timeout, output

    async def episode(self, task: Task, model: RolloutModel, index: int = 0) -> list[Experience]:
        """One conversation; its experiences with the episode return and status filled in."""
        async with self.envs.lease() as env:
            observation = await env.reset(task, index)
            traj, env_info = await self._converse(env, task, model, observation)
        if not traj.turns:  # nothing to train on: the explorer retries or skips the task
            raise RuntimeError(f"the episode ended before its first turn: {traj.status}: {traj.reason}")
        episode_return = sum(float(t.reward or 0.0) for t in traj.turns)
        temperature = task.sampling.temperature
        if self.output == "trajectory":
            exps = [traj.experience(episode_return, {}, temperature)]
        else:
            exps = traj.turn_experiences(episode_return, {}, temperature)
        success = bool(env_info.get("success", episode_return > 0))
        for e in exps:
            e.task_id = task.task_id
            e.info.update(rollout_index=index, success=success, episode_return=episode_return)
            e.info.update(episode_length=len(traj.turns), env_info=env_info)
            e.info["invalid_actions"] = sum(bool(t.info.get("invalid_action")) for t in traj.turns)
        return exps

    async def _converse(
        self, env: EnvLease, task: Task, model: RolloutModel, observation: str
    ) -> tuple[Trajectory, dict[str, Any]]:
        system = task.system_prompt or self.system_prompt
        chat = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": observation}
        ]
        traj = Trajectory(model.tokenizer, chat, max_tokens=self.max_tokens)
        params = task.sampling.replace(n=1)
        env_info: dict[str, Any] = {}
        state = env.state_hash()
        for t in range(self.step_limit(task)):
            if traj.ended or traj.room() < 1:
                traj.end("truncated", f"no room left in max_tokens={self.max_tokens} before turn {t}")
                break
            request = model.generate(
                traj.tokens, params.replace(max_tokens=min(params.max_tokens, traj.room()))
            )
            try:
                completion = (await asyncio.wait_for(request, self.turn_timeout))[0]
            except asyncio.TimeoutError:
                traj.end("timeout", f"turn {t} took longer than turn_timeout={self.turn_timeout}s")
                break
            turn = traj.add_completion(completion, model.policy_version)
            turn.info.update(env_state_hash=state)
            try:
                observation, reward, done, env_info = await env.step(completion.text)
            except EnvFailure as failure:
                if t == 0:
                    raise
                traj.turns.pop()  # the env never answered this turn: not an action with a reward
                traj.end(failure.status, str(failure)[:500])  # type: ignore[arg-type]
                break
            turn.reward = float(reward)
            turn.info.update(step_reward=float(reward), invalid_action=bool(env_info.get("invalid_action")))
            if done or not traj.add_messages([{"role": "user", "content": observation}]):
                break
            try:
                state = env.state_hash()
            except EnvFailure as failure:
                traj.end(failure.status, str(failure)[:500])  # type: ignore[arg-type]
                break
        return traj, env_info


def conversation_env_args(env: Any, env_args: dict[str, Any] | None) -> dict[str, Any]:
    """``env_args`` for an environment played as one conversation: ``history=False`` when the environment
    takes a ``history`` parameter and ``env_args`` does not set it (a warning when it sets it true)."""
    args = dict(env_args or {})
    try:
        takes = "history" in inspect.signature(resolve_env(env)).parameters
    except (TypeError, ValueError):
        takes = False
    if takes and "history" not in args:
        args["history"] = False
    elif takes and args["history"]:
        log.warning(
            "multi_turn with env_args history: true resends the whole episode in every observation, though "
            "the conversation already holds it (the prompt grows quadratically); remove history (multi_turn "
            "sets it false) unless the environment needs it"
        )
    return args
