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

:func:`~trine.workflows.scripted.scripted_sft_rows` plays episodes with a scripted policy through a workflow
and returns SFT rows of exactly the tokens the workflow renders (a warm start for an environment task).
"""

from __future__ import annotations

from trine.registry import Table, lazy_exports

WORKFLOWS = Table(
    {
        "single_turn": "trine.workflows.single_turn:SingleTurnWorkflow",
        "step_wise": "trine.workflows.step_wise:StepWiseWorkflow",
        "grid_world": "trine.workflows.step_wise:GridWorldWorkflow",
        "tool_agent": "trine.workflows.tool_agent:ToolAgentWorkflow",
        "multi_turn": "trine.workflows.multi_turn:MultiTurnWorkflow",
        "human_feedback": "trine.workflows.human:HumanFeedbackWorkflow",
    }
)
"""Built-in workflows by name (registry kind ``workflow``), each imported when first looked up."""

# Names are imported on first use (module ``__getattr__``), so looking up one workflow does not import
# the others (``human_feedback`` brings SQLAlchemy, ``tool_agent`` the tools).
_EXPORTS = {
    "ENVIRONMENTS": "trine.workflows.envs",
    "GridWorld": "trine.workflows.envs",
    "GridWorldWorkflow": "trine.workflows.step_wise",
    "HumanFeedbackWorkflow": "trine.workflows.human",
    "MultiTurnWorkflow": "trine.workflows.multi_turn",
    "RolloutModel": "trine.workflows.base",
    "ScoreFn": "trine.workflows.base",
    "SingleTurnWorkflow": "trine.workflows.single_turn",
    "StepWiseWorkflow": "trine.workflows.step_wise",
    "ToolAgentWorkflow": "trine.workflows.tool_agent",
    "Trajectory": "trine.workflows.trajectory",
    "ScriptedPolicy": "trine.workflows.scripted",
    "Workflow": "trine.workflows.base",
    "completion_experience": "trine.workflows.base",
    "grid_world_tasks": "trine.workflows.envs",
    "scripted_sft_rows": "trine.workflows.scripted",
}

__all__ = ["WORKFLOWS", *sorted(_EXPORTS)]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
