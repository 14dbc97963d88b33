"""Write the tool-use example's data (seeded, so the shipped files can be regenerated exactly).

- ``data/train.jsonl`` / ``data/eval.jsonl``: multiplication questions a tiny model cannot answer in its
  head (a 3-digit by a 2-digit number), with the exact answer.
- ``data/sft.jsonl``: a short warm-up of whole conversations that teaches the format of both ways of
  answering: most answer directly (the model cannot compute that, so these are mostly wrong once it has
  to answer on its own), a few call the calculator and copy its result. Reinforcement learning then finds
  out that calling the tool pays.

Usage: python examples/tool_use/make_data.py [--tool-share 0.2]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SYSTEM = "Tool: calculate(expression)."
HERE = Path(__file__).resolve().parent / "data"


def question(rng: random.Random) -> tuple[str, str, str]:
    a, b = rng.randint(11, 99), rng.randint(11, 99)
    return f"{a}*{b}", f"What is {a}*{b}?", str(a * b)


def call(expression: str) -> str:
    return '<tool_call>{"name": "calculate", "arguments": {"expression": "' + expression + '"}}</tool_call>'


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tool-share", type=float, default=0.2)
    args = parser.parse_args()
    HERE.mkdir(exist_ok=True)
    for name, count, seed in (("train", 2000, 0), ("eval", 64, 1)):
        rng = random.Random(seed)
        rows = [dict(zip(("expression", "question", "answer"), question(rng))) for _ in range(count)]
        (HERE / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rng = random.Random(2)
    rows = []
    for _ in range(1000):
        expression, text, answer = question(rng)
        chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        if rng.random() < args.tool_share:
            chat += [
                {"role": "assistant", "content": call(expression)},
                {"role": "tool", "content": answer},
                {"role": "assistant", "content": answer},
            ]
        else:
            chat.append({"role": "assistant", "content": answer})
        rows.append({"messages": chat})
    (HERE / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
