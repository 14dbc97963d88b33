"""A small OpenEnv environment, served by openenv-core's own FastAPI app: guess a number, told higher/lower.

This file is written for openenv-core (``pip install openenv-core``), not for Trine: it runs in the
environment's own Python (the OpenEnv venv of ``scripts/openenv_env.sh``, a container, a Space), and Trine
talks to it over the network with :class:`trine.workflows.envs.openenv.OpenEnvEnv`::

    .venv-openenv/bin/python examples/openenv/server.py --port 8001
    # -> listening on http://127.0.0.1:8001

One episode: ``reset(seed)`` draws a secret number in 1..``--high``; each action's ``message`` is a guess;
the observation's ``text`` says ``higher``, ``lower`` or ``correct``. Reward 1 for the right guess (the
episode ends), 0 otherwise; the episode also ends after ``--max-guesses`` guesses. A message that is no
number counts as a guess and says so (``invalid: true``).
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import threading
import time
from typing import Any

from openenv.core.env_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

HIGH = 8
MAX_GUESSES = 4


class GuessAction(Action):
    message: str
    """The guess, as the model wrote it."""


class GuessObservation(Observation):
    text: str = ""
    """What the player is told: the rules, then higher / lower / correct."""
    invalid: bool = False
    """Whether the last message held no number."""


class GuessEnv(Environment[GuessAction, GuessObservation, State]):
    """Guess the secret number in 1..HIGH within MAX_GUESSES guesses."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State()
        self.secret = 1
        self.guesses = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, **_: Any) -> GuessObservation:
        self.secret = random.Random(seed).randint(1, HIGH)
        self.guesses = 0
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(text=f"Guess my number between 1 and {HIGH}. Reply with the number only.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **_: Any) -> GuessObservation:
        self.guesses += 1
        self._state.step_count += 1
        found = re.search(r"-?\d+", action.message)
        if found is None:
            text, reward, invalid = "invalid: reply with a number", 0.0, True
        else:
            guess = int(found.group())
            invalid = False
            text = "correct" if guess == self.secret else ("higher" if guess < self.secret else "lower")
            reward = 1.0 if guess == self.secret else 0.0
        done = reward == 1.0 or self.guesses >= MAX_GUESSES
        return GuessObservation(text=text, reward=reward, done=done, invalid=invalid)

    @property
    def state(self) -> State:
        return self._state


def main(argv: list[str] | None = None) -> None:
    global HIGH, MAX_GUESSES
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001, help="0: a free port (printed)")
    parser.add_argument("--high", type=int, default=HIGH)
    parser.add_argument("--max-guesses", type=int, default=MAX_GUESSES)
    parser.add_argument("--sessions", type=int, default=16, help="most concurrent sessions")
    args = parser.parse_args(argv)
    HIGH, MAX_GUESSES = args.high, args.max_guesses

    import uvicorn

    app = create_fastapi_app(GuessEnv, GuessAction, GuessObservation, max_concurrent_envs=args.sessions)
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            sys.exit("the OpenEnv server did not start")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    print(f"listening on http://{args.host}:{port}", flush=True)
    thread.join()


if __name__ == "__main__":
    main()
