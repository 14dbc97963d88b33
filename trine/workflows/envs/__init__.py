"""Text environments for step-wise workflows: the protocol, its adapter, and the built-ins.

An environment implements :class:`~trine.workflows.envs.base.Environment` (async ``reset(task)``,
``step(action) -> (observation, reward, done, info)``, ``state_hash()``), or is a blocking class
(``reset()``, ``step(action)``, ``state_hash()``) that
:class:`~trine.workflows.envs.base.BlockingEnvironment` runs behind that protocol.
``ENVIRONMENTS`` is the table of built-ins (registry kind ``"environment"``); anything else is given
as ``"package.module:Class"`` or registered with ``@trine.register("environment", "name")``.
"""

from trine.workflows.envs.base import (
    BlockingEnvironment,
    Environment,
    StepResult,
    SyncEnvironment,
    environment_maker,
)
from trine.workflows.envs.grid_world import GridWorld, grid_world_tasks, parse_action

ENVIRONMENTS = {"grid_world": GridWorld}

__all__ = [
    "ENVIRONMENTS",
    "BlockingEnvironment",
    "Environment",
    "GridWorld",
    "StepResult",
    "SyncEnvironment",
    "environment_maker",
    "grid_world_tasks",
    "parse_action",
]
