"""Write the textarena example's model and data (seeded).

- ``model/``: tiny-1m built with seed 0 (``trine init-model tiny-1m examples/textarena/model``), unless it
  exists. The SFT rows below are token ids of *its* tokenizer, and a tiny model's tokenizer depends on the
  seed it is built with, so every run of the example starts from this one model (the run's ``seed`` varies
  the data order and the sampling).
- ``data/train.jsonl`` / ``data/eval.jsonl``: one game per row; its ``seed`` draws textarena's secret.
- ``data/sft.jsonl``: games of GuessTheNumber-v0 played by a scripted player through the ``multi_turn``
  workflow itself (:func:`trine.workflows.scripted_sft_rows`), so the rows hold exactly the tokens and the
  action mask a GRPO rollout has. The player bisects the range the hints leave with probability
  ``--bisect`` and otherwise guesses anywhere inside it (it never repeats a guess); only won games are kept.

``--players`` writes no data: it plays 2,000 games with each scripted player through the same workflow
and prints the share each wins and its turns per game (the README's figures for scale).

Usage: python examples/textarena/make_data.py [--games 400] [--bisect 0.5] [--players]
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
GAME = {"game": "GuessTheNumber-v0", "game_args": {"max_number": 8, "max_turns": 4}}  # config.yaml's env_args
LOW, HIGH, TURNS = 1, 8, 4
WORKFLOW_ARGS = {"env": "textarena", "env_args": GAME, "max_steps": TURNS}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--games", type=int, default=400, help="scripted games played for data/sft.jsonl")
    parser.add_argument("--bisect", type=float, default=0.5, help="the player's chance to bisect")
    parser.add_argument("--players", action="store_true", help="print the scripted players' scores")
    args = parser.parse_args()
    from trine.models import load_tokenizer
    from trine.models.tiny import init_model

    if not (HERE / "model" / "config.json").is_file():
        init_model("tiny-1m", HERE / "model", seed=0)
    tokenizer = load_tokenizer(str(HERE / "model"))
    if args.players:
        players(tokenizer, args.bisect)
        return
    DATA.mkdir(exist_ok=True)
    for name, count, start in (("train", 2000, 0), ("eval", 64, 100_000)):
        rows = [{"question": "play", "seed": start + i} for i in range(count)]
        (DATA / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rows = play(tokenizer, Player(args.bisect, seed=7), range(200_000, 200_000 + args.games))
    kept = [r for r in rows if r["reward"] >= 1.0]
    (DATA / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in kept))
    print(f"data/sft.jsonl: {len(kept)} won games of {len(rows)} played")


class Player:
    """Guesses inside the range the hints leave: its middle with probability ``bisect``, else anywhere in it."""

    def __init__(self, bisect: float, seed: int) -> None:
        self.bisect, self.rng = bisect, random.Random(seed)

    def __call__(self, messages: list[dict[str, str]]) -> str:
        lo, hi = LOW, HIGH
        guess = None
        for m in messages:
            if m["role"] == "assistant":
                found = re.search(r"\[(\d+)\]", m["content"])
                guess = int(found.group(1)) if found else None
            elif guess is not None and "higher" in m["content"]:
                lo = max(lo, guess + 1)
            elif guess is not None and "lower" in m["content"]:
                hi = min(hi, guess - 1)
        middle = (lo + hi) // 2
        return f"[{middle if self.rng.random() < self.bisect else self.rng.randint(lo, hi)}]"


def play(tokenizer: Any, player: Player, seeds: range) -> list[dict[str, Any]]:
    """One SFT row per game (won or not), played through the multi_turn workflow."""
    from trine.workflows import scripted_sft_rows

    tasks = [{"question": "play", "seed": s} for s in seeds]
    return scripted_sft_rows(
        tasks, player, tokenizer, workflow="multi_turn", workflow_args=WORKFLOW_ARGS, max_tokens=8
    )


def players(tokenizer: Any, bisect: float, games: int = 2_000) -> None:
    """Print each scripted player's share of won games and its turns per game."""
    for name, chance in (
        ("guesses anywhere inside the range the hints leave", 0.0),
        (f"bisects with probability {bisect} (data/sft.jsonl)", bisect),
        ("bisection", 1.0),
    ):
        rows = play(tokenizer, Player(chance, seed=0), range(games))
        won = sum(r["reward"] >= 1.0 for r in rows)
        turns = sum(sum(1 for m in r["messages"] if m["role"] == "assistant") for r in rows)
        print(f"{name}: wins {100 * won / len(rows):.0f}% in {turns / len(rows):.1f} turns per game")


if __name__ == "__main__":
    main()
