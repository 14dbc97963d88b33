"""Text environments for workflows: the protocol, the one adapter, the pool, and the built-ins.

An environment implements :class:`~trine.workflows.envs.base.Environment` (async ``reset(task)``,
``step(action) -> (observation, reward, done, info)``, ``state_hash()``), or is a blocking class
with the Gymnasium API (``reset(seed=, options=) -> (observation, info)``, ``step(action) ->
(observation, reward, terminated, truncated, info)``) or the classic one (``reset() -> observation``,
``step(action) -> (observation, reward, done, info)``, ``state_hash()``) that
:class:`~trine.workflows.envs.base.BlockingEnvironment` runs behind that protocol. Workflows lend
them per episode from an :class:`~trine.workflows.envs.pool.EnvPool` (reuse across tasks, timeouts,
faulty environments discarded).

``ENVIRONMENTS`` is the table of built-ins (registry kind ``"environment"``):

- ``grid_world``: :class:`~trine.workflows.envs.grid_world.GridWorldEnv`, a FrozenLake-like grid;
- ``textarena``: :class:`~trine.workflows.envs.text_arena.TextArenaEnv`, a single-player textarena
  game (``env_args: {game: GuessTheNumber-v0}``; needs ``textarena``);
- ``gym``: :func:`~trine.workflows.envs.gym.gym_make`, any ``gymnasium.make`` id
  (``env_args: {env_id: ...}``; needs ``gymnasium``);
- ``openenv``: :class:`~trine.workflows.envs.openenv.OpenEnvEnv`, an environment an OpenEnv server serves
  over HTTP / WebSocket (``env_args: {base_url: ...}``; docs/environments.md).

Anything else is given as ``"package.module:Class"`` or registered with
``@trine.register("environment", "name")``.
"""

from trine.workflows.envs.base import (
    BlockingEnvironment,
    Environment,
    StepResult,
    SyncEnvironment,
    TextEnv,
    environment_maker,
    episode_seed,
)
from trine.workflows.envs.grid_world import GridWorld, GridWorldEnv, grid_world_tasks, parse_action
from trine.workflows.envs.gym import gym_make
from trine.workflows.envs.openenv import OpenEnvEnv
from trine.workflows.envs.pool import EnvFailure, EnvLease, EnvPool, make_env_pool, resolve_env
from trine.workflows.envs.text_arena import TextArenaEnv

ENVIRONMENTS = {"grid_world": GridWorldEnv, "textarena": TextArenaEnv, "gym": gym_make, "openenv": OpenEnvEnv}

__all__ = [
    "ENVIRONMENTS",
    "BlockingEnvironment",
    "EnvFailure",
    "EnvLease",
    "EnvPool",
    "Environment",
    "GridWorld",
    "GridWorldEnv",
    "OpenEnvEnv",
    "StepResult",
    "SyncEnvironment",
    "TextArenaEnv",
    "TextEnv",
    "environment_maker",
    "episode_seed",
    "grid_world_tasks",
    "gym_make",
    "make_env_pool",
    "parse_action",
    "resolve_env",
]
