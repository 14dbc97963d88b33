"""Write the guess-the-number example's data (seeded).

- ``data/train.jsonl`` / ``data/eval.jsonl``: one game per row (its ``seed`` draws the secret).
- ``data/sft.jsonl``: a warm-up of whole games played by a weak policy: each guess follows the hints
  (drawn from the range they leave) with probability ``--follow``, else it is drawn from the whole range.
  It teaches the format (such a policy solves 64% of the games: ``--players``); RL then sharpens the
  player. (A warm-up on guesses that ignore the hints teaches tiny-1m to ignore them, and RL did not
  find their use from there in 100 steps.)

``--players`` writes no data: it plays 100,000 games with each scripted player (one who ignores the
hints, the weak player of ``data/sft.jsonl``, one who guesses inside the range the hints leave, and
bisection) and prints the share each solves and its turns per game (the README's figures for scale).

Usage: python examples/guess_number/make_data.py [--high 8] [--turns 4] [--follow 0.5] [--players]
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
    parser.add_argument("--players", action="store_true", help="print the scripted players' scores")
    args = parser.parse_args()
    if args.players:
        players(args.high, args.turns, args.follow)
        return
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
            guess = str(weak(game, rng, args.follow))
            chat.append({"role": "assistant", "content": guess})
            observation, _, done, _, _ = game.step(guess)
            if done:
                break
            chat.append({"role": "user", "content": observation})
        if chat[-1]["role"] == "user":
            chat.pop()
        rows.append({"messages": chat})
    (HERE / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def weak(game: HigherLower, rng: random.Random, follow: float) -> int:
    """The warm-up's player: inside the range the hints leave with probability ``follow``, else anywhere."""
    lo, hi = (game.lo, game.hi) if rng.random() < follow else (1, game.high)
    return rng.randint(lo, hi)


def players(high: int, turns: int, follow: float, games: int = 100_000) -> None:
    """Print each scripted player's share of solved games and its mean turns per game."""
    policies = {
        "ignores the hints": lambda g, rng: rng.randint(1, g.high),
        f"follows the hints with probability {follow} (data/sft.jsonl)": lambda g, rng: weak(g, rng, follow),
        "guesses inside the range the hints leave": lambda g, rng: rng.randint(g.lo, g.hi),
        "bisection": lambda g, rng: (g.lo + g.hi) // 2,
    }
    for name, policy in policies.items():
        rng, solved, played = random.Random(0), 0, 0
        for i in range(games):
            game = HigherLower(high=high)
            game.reset(seed=i)
            done, turn = False, 0
            while not done and turn < turns:
                _, _, done, _, _ = game.step(str(policy(game, rng)))
                turn += 1
            solved, played = solved + done, played + turn
        print(f"{name}: solves {100 * solved / games:.0f}% in {played / games:.1f} turns per game")


if __name__ == "__main__":
    main()
