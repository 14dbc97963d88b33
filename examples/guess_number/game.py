"""Higher-or-lower: a multi-turn text game with the Gymnasium API (what any text environment plugs in as).

The secret is drawn from the reset seed; every reply's last number is a guess and the game answers
"Higher than N.", "Lower than N." or "Correct!". Solving it pays 1, each wrong guess costs
``step_penalty``, so fewer turns pay more. ``state_hash`` is the range the hints leave (GiGPO's anchor
state). Registered as the environment ``higher_lower`` when loaded with
``--plugin examples/guess_number/game.py``.
"""

from __future__ import annotations

import random
import re
from typing import Any

from trine import register


@register("environment", "higher_lower")
class HigherLower:
    """Guess a number from 1 to ``high``."""

    def __init__(self, high: int = 16, step_penalty: float = 0.05) -> None:
        self.high, self.step_penalty = high, step_penalty
        self.secret = 0
        self.lo, self.hi = 1, high

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        self.secret = random.Random(seed).randint(1, self.high)
        self.lo, self.hi = 1, self.high
        return f"Guess a number from 1 to {self.high}.", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        numbers = re.findall(r"\d+", action)
        if not numbers:
            return "Say a number.", -self.step_penalty, False, False, {"success": False}
        guess = int(numbers[-1])
        if guess == self.secret:
            return "Correct!", 1.0, True, False, {"success": True}
        if guess < self.secret:
            self.lo = max(self.lo, guess + 1)
        else:
            self.hi = min(self.hi, guess - 1)
        hint = f"Higher than {guess}." if guess < self.secret else f"Lower than {guess}."
        return hint, -self.step_penalty, False, False, {"success": False}

    def state_hash(self) -> str:
        """What a strategy needs: the range the secret is known to lie in."""
        return f"{self.lo}-{self.hi}"
