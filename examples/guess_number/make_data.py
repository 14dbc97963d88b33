"""Write the guess-the-number example's data (seeded).

- ``data/train.jsonl`` / ``data/eval.jsonl``: one game per row (its ``seed`` draws the secret).
- ``data/sft.jsonl``: a warm-up of whole games played by a policy that guesses at random and ignores the
  hints: it teaches the format (a number per turn) and nothing about the strategy, which RL then learns.

Usage: python examples/guess_number/make_data.py [--high 8] [--turns 4]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from game import HigherLower

HERE = Path(__file__).resolve().parent / "data"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--high", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    args = parser.parse_args()
    HERE.mkdir(exist_ok=True)
    for name, count, start in (("train", 2000, 0), ("eval", 64, 100_000)):
        rows = [{"question": "play", "seed": start + i} for i in range(count)]
        (HERE / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rng, rows = random.Random(7), []
    for i in range(1000):
        game = HigherLower(high=args.high)
        observation, _ = game.reset(seed=200_000 + i)
        chat = [{"role": "user", "content": observation}]
        for _ in range(args.turns):
            guess = str(rng.randint(1, game.high))
            chat.append({"role": "assistant", "content": guess})
            observation, _, done, _, _ = game.step(guess)
            if done:
                break
            chat.append({"role": "user", "content": observation})
        if chat[-1]["role"] == "user":
            chat.pop()
        rows.append({"messages": chat})
    (HERE / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    main()
