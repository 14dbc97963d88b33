"""Write the guess-the-number example's data (seeded).

- ``data/train.jsonl`` / ``data/eval.jsonl``: one game per row (its ``seed`` draws the secret).
- ``data/sft.jsonl``: a warm-up of whole games played by a weak policy: each guess follows the hints
  (drawn from the range they leave) with probability ``--follow``, else it is drawn from the whole range.
  It teaches the format and a little use of the hints (such a policy solves 64% of the games); RL then
  sharpens it. (A warm-up on guesses that ignore the hints teaches tiny-1m to ignore them, and RL did
  not find their use from there in 100 steps.)

Usage: python examples/guess_number/make_data.py [--high 8] [--turns 4] [--follow 0.5]
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
    parser.add_argument("--follow", type=float, default=0.5)
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
            lo, hi = (game.lo, game.hi) if rng.random() < args.follow else (1, game.high)
            guess = str(rng.randint(lo, hi))
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
