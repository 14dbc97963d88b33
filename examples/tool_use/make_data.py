"""Write the tool-use example's data (seeded, so the shipped files can be regenerated exactly).

- ``data/train.jsonl`` / ``data/eval.jsonl``: multiplication questions a tiny model cannot answer in its
  head (a 3-digit by a 2-digit number), with the exact answer.
- ``data/sft_tools.jsonl``: whole conversations that call the calculator and copy its result: the first
  warm-up teaches the call's format and to copy the expression and the result.
- ``data/sft_direct.jsonl``: conversations that mostly answer directly (``--tool-share`` of them call the
  tool): the second warm-up makes the model prefer answering in its head, which it cannot do, so it is
  rarely right. Reinforcement learning then finds out that calling the tool pays.

Usage: python examples/tool_use/make_data.py [--tool-share 0.05]
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
    parser.add_argument("--tool-share", type=float, default=0.05)
    args = parser.parse_args()
    HERE.mkdir(exist_ok=True)
    for name, count, seed in (("train", 2000, 0), ("eval", 64, 1)):
        rng = random.Random(seed)
        rows = [dict(zip(("expression", "question", "answer"), question(rng))) for _ in range(count)]
        (HERE / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name, share, seed in (("sft_tools", 1.0, 2), ("sft_direct", args.tool_share, 3)):
        (HERE / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in conversations(share, seed)))


def conversations(tool_share: float, seed: int, count: int = 1000) -> list[dict]:
    """Warm-up chats: with probability ``tool_share`` a tool call then the copied result, else a direct answer."""
    rng, rows = random.Random(seed), []
    for _ in range(count):
        expression, text, answer = question(rng)
        chat = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        if rng.random() < tool_share:
            chat += [
                {"role": "assistant", "content": call(expression)},
                {"role": "tool", "content": answer},
                {"role": "assistant", "content": answer},
            ]
        else:
            chat.append({"role": "assistant", "content": answer})
        rows.append({"messages": chat})
    return rows


if __name__ == "__main__":
    main()
