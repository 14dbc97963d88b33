"""Python functions as tools: the schema the model sees comes from the type hints and the docstring.

trine run examples/agents/tools.yaml --plugin examples/agents/tools.py
"""

from __future__ import annotations

from typing import Literal

from trine import register


@register("tool", "multiply")
def multiply(a: int, b: int) -> int:
    """Multiply two integers exactly.

    Args:
        a: the first factor
        b: the second factor
    """
    return a * b


@register("tool", "convert")
def convert(value: float, unit: Literal["km", "mi"]) -> float:
    """Convert a distance to the other unit.

    Args:
        value: the distance
        unit: the unit it is given in
    """
    return round(value / 1.609344 if unit == "km" else value * 1.609344, 3)
