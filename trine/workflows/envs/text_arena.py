"""Single-player textarena games (``pip install textarena``) on the Gymnasium-style text API.

`textarena <https://github.com/LeonGuertler/TextArena>`_ ships text games with rules, feedback and
a final score: GuessTheNumber, Mastermind, TowerOfHanoi, Minesweeper, Sudoku, LightsOut,
FrozenLake, 2048... (its word games download NLTK data on first use and fail offline; the ones named
here work offline). :class:`TextArenaEnv` plays one of them as a :class:`~trine.workflows.envs.base.TextEnv`,
so any workflow drives it through the one adapter::

    workflow: step_wise
    workflow_args:
      env: textarena
      env_args: {game: GuessTheNumber-v0}     # history: true -> each observation is the whole game so far
      max_steps: 10

Under ``workflow: multi_turn`` (one conversation per game) ``history`` defaults to false: the conversation
already holds the game so far, so each observation is only what is new (the workflow sets it; an explicit
``history: true`` there is warned about, as every turn would resend the whole transcript).

The model's reply is the action, in the game's own format (``[42]`` for GuessTheNumber; a reply
without brackets is wrapped in them, as textarena's default wrapper does). Rewards are textarena's:
0 until the game ends, then the player's final reward (1 for a win, a fraction of the way for a
partial result, lower for invalid moves; ``reward: win`` pays only a win); ``info["success"]`` is a win without an invalid move, and
``info["invalid_action"]`` says whether this move was invalid (workflows count them: ``invalid_actions``).

textarena draws its games with the process-wide ``random`` module (``random.seed(seed)`` in
``reset``, more draws in some ``step`` calls). So that concurrent games neither disturb each other
nor the rest of the process, each game keeps its own ``random`` state, swapped in under a lock for
the duration of each call; a game is then reproducible from its ``reset`` seed.
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_RANDOM_LOCK = threading.Lock()
LOCK_SECONDS = 30.0
"""How long a call waits for another game's call to finish with the shared ``random`` module."""


def _textarena() -> Any:
    try:
        import textarena
    except ImportError as err:
        raise ImportError(
            f"env 'textarena' needs the textarena package ({err}); install it with "
            'pip install -e ".[envs]" (or pip install textarena).'
        ) from err
    return textarena


class TextArenaEnv:
    """A single-player textarena game as a Gymnasium-style text environment.

    Args:
        game: a textarena environment id, e.g. ``"GuessTheNumber-v0"``, ``"Mastermind-v0"``,
            ``"TowerOfHanoi-v0"`` (a row's ``game`` key overrides it per task).
        game_args: keyword arguments for ``textarena.make`` (e.g. ``{"max_turns": 6}``).
        history: each observation is the whole game so far (the prompt, every move and every game
            message), which a workflow that shows only the current observation needs; False: only
            what is new since the last move (the game's messages, not the echo of the move), for a
            workflow that keeps the conversation itself (``multi_turn`` sets False unless ``env_args``
            sets it).
        bracket_actions: wrap a reply without ``[`` ``]`` in brackets (textarena's default).
        reward: ``"game"``: textarena's final reward (a fraction for a partial result, paid also for a
            game ended by invalid moves); ``"win"``: 1 for a win without an invalid move, else 0 — for
            games whose partial credit a policy can farm by quitting (GuessTheNumber pays a near miss
            0.84-0.95 and a game ended by two invalid moves the fraction of its last valid guess).
    """

    def __init__(
        self,
        game: str = "GuessTheNumber-v0",
        game_args: dict[str, Any] | None = None,
        history: bool = True,
        bracket_actions: bool = True,
        reward: str = "game",
    ) -> None:
        if reward not in ("game", "win"):
            raise ValueError(
                f"textarena reward={reward!r}; expected 'game' (textarena's own final reward) or 'win' "
                "(1 for a win without an invalid move, else 0)."
            )
        ta = _textarena()
        if not isinstance(game, str) or game not in ta.envs.registration.ENV_REGISTRY:
            raise ValueError(
                f"game={game!r} is not a textarena environment id; expected one such as "
                "'GuessTheNumber-v0', 'Mastermind-v0', 'TowerOfHanoi-v0' (textarena.envs.registration.ENV_REGISTRY)."
            )
        env = ta.make(game, **(game_args or {}))
        while isinstance(env, ta.Wrapper):  # observations are formatted here, the same for every game
            env = env.env
        self.game_id = game
        self.game = env
        self.history = history
        self.bracket_actions = bracket_actions
        self.reward = reward
        self.transcript: list[str] = []
        self._random: Any = None  # this game's state of the random module

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict]:
        """Start a game (``seed`` draws it); returns the opening observation and ``{"game": id}``."""
        try:
            self._call(self.game.reset, num_players=1, seed=seed)
        except AssertionError as err:  # textarena asserts the number of players
            raise ValueError(f"textarena game {self.game_id!r} is not a single-player game: {err}") from err
        self.transcript = []
        return self._observe(), {"game": self.game_id}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play ``action``; the reward is the game's final reward once it ends, else 0."""
        if self.bracket_actions and "[" not in action and "]" not in action:
            action = f"[{action.strip()}]"
        errors = int(getattr(self.game.state, "error_count", 0) or 0)
        done, step_info = self._call(self.game.step, action)
        observation = self._observe()
        state = self.game.state
        info: dict[str, Any] = {"turn": int(getattr(state, "turn", 0)), **dict(step_info or {})}
        info["invalid_action"] = int(getattr(state, "error_count", 0) or 0) > errors  # warned, game goes on
        reward = 0.0
        if done:
            reward = float((state.rewards or {}).get(0, 0.0))
            outcome = dict(state.game_info.get(0, {}))
            info.update(outcome)
            info["invalid_action"] = info["invalid_action"] or bool(outcome.get("invalid_move"))
            info["success"] = reward >= 1.0 and not outcome.get("invalid_move", False)
            info["game_reward"] = reward
            if self.reward == "win":
                reward = float(info["success"])
        return observation, reward, bool(done), False, info

    def state_hash(self) -> str:
        """The whole game so far (every message), hashed: equal games give equal hashes."""
        return hashlib.sha1("\n".join(self.transcript).encode()).hexdigest()[:16]

    def close(self) -> None:
        """Drop the game's transcript (textarena games hold no other resources)."""
        self.transcript = []

    def _observe(self) -> str:
        ta = _textarena()
        _, messages = self.game.get_observation()
        new = []
        for sender, text, kind in messages:
            line = f"[{'GAME' if sender == ta.GAME_ID else 'Player'}] {text}"
            self.transcript.append(line)
            if kind != ta.ObservationType.PLAYER_ACTION:
                new.append(line)
        return "\n".join(self.transcript if self.history else new)

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with self._own_random():
            return fn(*args, **kwargs)

    @contextmanager
    def _own_random(self) -> Iterator[None]:
        if not _RANDOM_LOCK.acquire(timeout=LOCK_SECONDS):
            raise TimeoutError(
                f"textarena game {self.game_id!r} waited {LOCK_SECONDS}s for another game's call to "
                "finish with the random module; a textarena call is stuck."
            )
        try:
            outer = random.getstate()
            if self._random is not None:
                random.setstate(self._random)
            try:
                yield
            finally:
                self._random = random.getstate()
                random.setstate(outer)
        finally:
            _RANDOM_LOCK.release()
