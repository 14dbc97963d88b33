"""Workflows: how tasks become experiences.

``WORKFLOWS`` is the explicit table of built-ins; anything else is an import path
``"package.module:Class"`` whose instances implement :class:`~trine.workflows.base.Workflow`.

- ``single_turn``: one prompt, ``repeat`` sampled answers scored by the task's reward
  (``greedy_baseline=True`` adds ReMax's greedy baseline reward).
- ``step_wise``: an agent in a text environment, one experience per step (``env=...``).
- ``grid_world``: ``step_wise`` over the built-in grid world (rows from ``grid_world_tasks``).
- ``multi_turn``: a whole conversation with a text environment, token-in token-out (one experience per
  episode, or one per turn).
- ``tool_agent``: multi-turn tool use (Python functions and MCP servers), token-in token-out
  (:mod:`trine.workflows.tool_agent` over :class:`~trine.workflows.trajectory.Trajectory`).
- ``human_feedback``: ``single_turn`` with the rewards left pending and the responses posted to the
  annotation queue for people to rate (``ask: rate``) or compare (``ask: pair``); docs/annotation.md.
"""

from trine.workflows.base import RolloutModel, ScoreFn, Workflow, completion_experience
from trine.workflows.envs import ENVIRONMENTS, GridWorld, grid_world_tasks
from trine.workflows.human import HumanFeedbackWorkflow
from trine.workflows.multi_turn import MultiTurnWorkflow
from trine.workflows.single_turn import SingleTurnWorkflow
from trine.workflows.step_wise import GridWorldWorkflow, StepWiseWorkflow
from trine.workflows.tool_agent import ToolAgentWorkflow
from trine.workflows.trajectory import Trajectory

WORKFLOWS = {
    "single_turn": SingleTurnWorkflow,
    "step_wise": StepWiseWorkflow,
    "grid_world": GridWorldWorkflow,
    "tool_agent": ToolAgentWorkflow,
    "multi_turn": MultiTurnWorkflow,
    "human_feedback": HumanFeedbackWorkflow,
}

__all__ = [
    "ENVIRONMENTS",
    "WORKFLOWS",
    "GridWorld",
    "GridWorldWorkflow",
    "HumanFeedbackWorkflow",
    "MultiTurnWorkflow",
    "RolloutModel",
    "ScoreFn",
    "SingleTurnWorkflow",
    "StepWiseWorkflow",
    "ToolAgentWorkflow",
    "Trajectory",
    "Workflow",
    "completion_experience",
    "grid_world_tasks",
]
