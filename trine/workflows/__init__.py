"""Workflows: how tasks become experiences.

``WORKFLOWS`` is the explicit table of built-ins; anything else is an import path
``"package.module:Class"`` whose instances implement :class:`~trine.workflows.base.Workflow`.
"""

from trine.workflows.base import RolloutModel, ScoreFn, Workflow, completion_experience
from trine.workflows.single_turn import SingleTurnWorkflow

WORKFLOWS = {"single_turn": SingleTurnWorkflow}

__all__ = ["WORKFLOWS", "RolloutModel", "ScoreFn", "SingleTurnWorkflow", "Workflow", "completion_experience"]
