"""Built-in text environments for step-wise workflows.

An environment has ``reset() -> observation``, ``step(action_text) -> (observation, reward, done,
info)`` and ``state_hash() -> str`` (equal for equal states across rollouts; GiGPO's anchor state).
``ENVIRONMENTS`` is the table of built-ins; anything else is given as ``"package.module:Class"``.
"""

from trine.workflows.envs.grid_world import GridWorld, grid_world_tasks, parse_action

ENVIRONMENTS = {"grid_world": GridWorld}

__all__ = ["ENVIRONMENTS", "GridWorld", "grid_world_tasks", "parse_action"]
