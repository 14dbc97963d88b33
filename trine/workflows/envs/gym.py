"""Any ``gymnasium.make`` id as an environment (``pip install gymnasium``), and the Gymnasium-style
text API that every built-in environment shares.

A Gymnasium environment plugs into Trine's :class:`~trine.workflows.envs.base.Environment`
protocol through :class:`~trine.workflows.envs.base.BlockingEnvironment`, by one of:

- a registered name or import path of a class with the ``gymnasium.Env`` API (text observations,
  text actions)::

      workflow_args: {env: "my_package.envs:MyTextEnv", env_args: {level: 2}}

- the built-in name ``gym`` with a ``gymnasium.make`` id (``env_id``) and its keyword arguments;
  observations that are not text need ``text_of`` (``text_of(observation, info) -> str``) and
  actions that are not text need ``action_of`` (``action_of(reply) -> action``), both given as
  import paths::

      workflow_args:
        env: gym
        env_args: {env_id: FrozenLake-v1, is_slippery: false}
        text_of: my_package.render:frozen_lake_text
        action_of: my_package.render:frozen_lake_action

Each episode's ``reset`` gets a seed derived from the task (the row's ``seed``, else its task id:
:func:`~trine.workflows.envs.base.episode_seed`) and, with ``option_keys``, those row keys as
``options``; ``terminated or truncated`` ends the episode, and both flags are kept in ``info``.
"""

from __future__ import annotations

from typing import Any


def gym_make(env_id: str, **kwargs: Any) -> Any:
    """``gymnasium.make(env_id, **kwargs)``: the ``gym`` environment's factory."""
    try:
        import gymnasium
    except ImportError as err:
        raise ImportError(
            f"env 'gym' needs the gymnasium package ({err}); install it with "
            'pip install -e ".[envs]" (or pip install gymnasium).'
        ) from err
    if not isinstance(env_id, str) or (":" not in env_id and env_id not in gymnasium.registry):
        raise ValueError(
            f"env_id={env_id!r} is not a registered gymnasium environment id; expected one such as "
            "'FrozenLake-v1' (gymnasium.registry lists them), or 'my_package.module:MyEnv-v0' to import the "
            "module that registers it first."
        )
    return gymnasium.make(env_id, **kwargs)
