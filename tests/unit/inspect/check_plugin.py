"""Plugins for the ``trine check`` tests (loaded with ``--plugin``): a game whose every observation is a
fixed marker text, and a reward that pays for any response containing the answer (hackable)."""

from __future__ import annotations

from typing import Any

from trine import register

MARKER = "MARKER-OBS keep going"
"""The game's observation after each move."""


@register("environment", "marker_game")
class MarkerGame:
    """Two moves, each answered with :data:`MARKER`; pays 0.5 per move."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        return "Make a move.", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return MARKER, 0.5, False, False, {}


@register("reward", "contains_answer")
def contains_answer(response: str, task: Any) -> dict[str, float]:
    """1 when the answer appears anywhere in the response (padding, repeats and junk still pay), in two
    parts."""
    found = float(str(task.answer) in response)
    return {"found": found, "length_bonus": 0.0}
