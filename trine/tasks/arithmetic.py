"""Built-in arithmetic tasks: ``{"question": "3+5=", "answer": "8", "a": 3, "b": 5, "op": "+"}``.

Regenerate the example data (from the repository root) with::

    python -c "from trine.tasks.arithmetic import write_example_data; write_example_data()"

which writes ``examples/arithmetic/data/{train,eval}.jsonl`` (see :func:`write_example_data`).
"""

from __future__ import annotations

import itertools
import json
import operator
import os
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
"""Supported operators."""


def _row(a: int, b: int, op: str) -> dict[str, Any]:
    return {"question": f"{a}{op}{b}=", "answer": str(OPS[op](a, b)), "a": a, "b": b, "op": op}


def generate_arithmetic(
    n: int | None,
    *,
    seed: int = 0,
    ops: Sequence[str] = ("+",),
    min_value: int = 0,
    max_value: int = 9,
    unique: bool = True,
) -> list[dict[str, Any]]:
    """Rows of ``a <op> b`` problems with operands in ``[min_value, max_value]`` (inclusive).

    ``n=None`` returns every ``(op, a, b)`` combination, built in a fixed order and then shuffled
    with ``seed``. Otherwise returns ``n`` rows drawn with ``seed``: distinct problems when
    ``unique`` (``n`` must not exceed the number of combinations), independent draws otherwise.
    Each row is ``{"question": "3+5=", "answer": "8", "a": 3, "b": 5, "op": "+"}``.
    """
    ops = [ops] if isinstance(ops, str) else list(ops)
    bad = [op for op in ops if op not in OPS]
    if bad or not ops:
        raise ValueError(f"ops={ops!r}; expected a non-empty list drawn from {list(OPS)}.")
    if min_value > max_value:
        raise ValueError(f"min_value={min_value} > max_value={max_value}; expected min_value <= max_value.")
    values = range(min_value, max_value + 1)
    combos = [(a, b, op) for op in dict.fromkeys(ops) for a, b in itertools.product(values, values)]
    rng = random.Random(seed)
    if n is None:
        rng.shuffle(combos)
        chosen = combos
    elif not isinstance(n, int) or n < 0:
        raise ValueError(f"n={n!r}; expected None (all combinations) or an integer >= 0.")
    elif unique:
        if n > len(combos):
            raise ValueError(
                f"n={n} unique problems requested but only {len(combos)} exist for ops={ops} and operands "
                f"{min_value}..{max_value}; lower n, widen the range, or pass unique=False."
            )
        chosen = rng.sample(combos, n)
    else:
        chosen = [rng.choice(combos) for _ in range(n)]
    return [_row(a, b, op) for a, b, op in chosen]


def write_jsonl(rows: Iterable[dict[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Write ``rows`` as JSON lines to ``path`` (parent folders are created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return path


def write_example_data(directory: str | os.PathLike[str] = "examples/arithmetic/data") -> list[Path]:
    """Write the arithmetic example's data: all 100 single-digit additions as train and eval sets."""
    directory = Path(directory)
    train = generate_arithmetic(None, seed=0)
    evaluation = generate_arithmetic(None, seed=1)
    return [write_jsonl(train, directory / "train.jsonl"), write_jsonl(evaluation, directory / "eval.jsonl")]
