"""The Environment protocol, and the one adapter that runs a blocking text environment behind it.

Workflows drive environments only through the async :class:`Environment` protocol, one episode at
a time, usually through an :class:`~trine.workflows.envs.pool.EnvPool` (which bounds each call by a
timeout and can reuse environments across tasks)::

    observation = await env.reset(task)            # the adapter also takes rollout=<index>
    state = env.state_hash()                       # GiGPO's anchor: the state the next action is taken from
    observation, reward, done, info = await env.step(completion.text)

Three shapes of environment class are accepted (:func:`environment_maker` tells them apart):

- **async** (``async def reset(self, task)``): implements :class:`Environment` itself. It is built
  as ``Class(**env_args)`` (keep the constructor cheap: it runs in the event loop) and reads what it
  needs from the task in ``reset`` (``task.raw`` is the whole row).
- **Gymnasium-style** (:class:`TextEnv`: ``reset(*, seed=None, options=None) -> (observation,
  info)``, ``step(action) -> (observation, reward, terminated, truncated, info)``, the
  ``gymnasium.Env`` API): wrapped in a :class:`BlockingEnvironment`. Its ``reset`` gets a seed
  derived from the task (:func:`episode_seed`), so a run reproduces whether or not the environment
  object is fresh, and the row keys named by ``option_keys`` as ``options``. Observations must be
  text, or be turned into text by a ``text_of(observation, info) -> str`` callable; the model's
  reply may be turned into the environment's action by ``action_of(text)``. ``state_hash()`` is
  optional (the default hashes the observation text). The grid world, textarena games and any
  ``gymnasium.make`` id take this path.
- **classic blocking** (:class:`SyncEnvironment`: ``reset()`` without a task, ``step(text)`` ->
  ``(observation, reward, done, info)``, ``state_hash()``): wrapped in a :class:`BlockingEnvironment`
  too; the task reaches it only through its constructor.

For both blocking shapes the constructor gets ``env_args`` updated with every row key that names
one of its parameters (a row's ``size``, ``game``...); the built object is kept, and reused by the
next ``reset`` when those arguments are unchanged (an environment returned to a pool), else closed
and rebuilt. Construction, ``reset``, ``step``, ``state_hash`` and ``close`` run in worker threads
through :func:`trine.blocking.run_blocking`, so the event loop keeps serving other tasks and a
timeout (the pool's, or the explorer's task timeout) bounds them; a class that is pure, fast Python
says ``blocking = False`` to be called inline instead, which keeps seeded sampling bit-reproducible
(threads finishing at timing-dependent moments change which requests the engine batches together,
hence which random numbers each row draws).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import math
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from trine import registry
from trine.blocking import run_blocking
from trine.types import Task

StepResult = tuple[str, float, bool, dict[str, Any]]
"""What ``step`` returns: ``(observation, reward, done, info)``; ``info`` is free-form and JSON-able
(``info["success"]``, if present, marks a solved episode)."""

TextOf = Callable[[Any, dict[str, Any]], str]
"""Turns a non-text observation (and the info that came with it) into the text the model reads."""
ActionOf = Callable[[str], Any]
"""Turns the model's reply into the environment's action (e.g. ``"left"`` -> ``0``)."""


@runtime_checkable
class Environment(Protocol):
    """One episode at a time of a text environment, as workflows drive it.

    An environment may also have ``close()`` (plain or async): called when it is discarded, or when
    its pool or workflow is closed.
    """

    async def reset(self, task: Task) -> str:
        """Start an episode of ``task``; returns the first observation (the next user message)."""
        ...

    async def step(self, action: str) -> StepResult:
        """Apply the model's reply ``action``; returns ``(observation, reward, done, info)``.

        ``reward`` is this step's reward; after ``done`` the workflow calls neither ``step`` nor
        ``state_hash`` again.
        """
        ...

    def state_hash(self) -> str:
        """The current state (the one the next action is taken *from*), as a string.

        Equal states of one task's rollouts must hash equally: GiGPO groups steps by it. Called
        after ``reset`` and after each ``step`` that did not end the episode; must not block.
        """
        ...


class TextEnv(Protocol):
    """A Gymnasium-style text environment (``gymnasium.Env``'s API; :class:`BlockingEnvironment`
    adapts it). ``state_hash()`` and ``close()`` are optional."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        """Start an episode (``seed`` makes it reproducible); returns ``(observation, info)``."""
        ...

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        """Apply ``action``; returns ``(observation, reward, terminated, truncated, info)``."""
        ...


class SyncEnvironment(Protocol):
    """A classic blocking environment (the other shape :class:`BlockingEnvironment` adapts)."""

    def reset(self) -> str:
        """Start an episode; returns the first observation."""
        ...

    def step(self, action: str) -> StepResult:
        """Apply ``action``; returns ``(observation, reward, done, info)``."""
        ...

    def state_hash(self) -> str:
        """The current state, hashed (see :meth:`Environment.state_hash`)."""
        ...


EnvFactory = Callable[..., Environment | TextEnv | SyncEnvironment]
"""An environment class, or a callable that builds one from keyword arguments."""


def episode_seed(task: Task, rollout: int = 0, *, seed_key: str = "seed", per_rollout: bool = False) -> int:
    """The ``reset`` seed of an episode of ``task``: the row's ``seed_key`` when it is an integer,
    else a stable hash of ``task.task_id`` (equal in every process).

    Every rollout of a task gets the same seed (the group plays the same game, which group-relative
    advantages assume) unless ``per_rollout``, which mixes in the rollout index.
    """
    value = task.raw.get(seed_key)
    has_seed = isinstance(value, int) and not isinstance(value, bool)
    if not per_rollout:
        return value if has_seed else _stable_int(f"id:{task.task_id}")
    base = f"seed:{value}" if has_seed else f"id:{task.task_id}"
    return _stable_int(f"{base}/rollout:{rollout}")


def _stable_int(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") & 0x7FFFFFFF


class BlockingEnvironment:
    """A blocking environment class (:class:`TextEnv` or :class:`SyncEnvironment`) behind the async
    :class:`Environment` protocol.

    Each ``reset(task)`` builds the environment (or keeps the one it has, when its constructor
    arguments are unchanged), resets it and hashes its first state, as one call; each ``step``
    steps it and (unless the episode ended) hashes the new state, as one call. Calls run in a worker
    thread of the current :class:`~trine.blocking.BlockingPool`, or inline.

    Args:
        factory: the environment class (or a callable returning one).
        env_args: its keyword arguments for every task.
        params: the row keys that override ``env_args`` (the factory's keyword parameters).
        inline: call the environment in the event loop instead of a worker thread (the built
            object's own ``blocking`` attribute, if any, decides from then on).
        text_of: turns a Gymnasium-style environment's non-text observations into text.
        action_of: turns the model's reply into a Gymnasium-style environment's action.
        option_keys: row keys passed to a Gymnasium-style ``reset`` as ``options``.
        seed_key: the row key holding the episode seed (see :func:`episode_seed`); for rows without
            it, an integer ``env_args[seed_key]`` is every task's seed.
        seed_per_rollout: give every rollout of a task its own seed.
    """

    def __init__(
        self,
        factory: EnvFactory,
        env_args: dict[str, Any],
        params: frozenset[str],
        inline: bool,
        *,
        text_of: TextOf | None = None,
        action_of: ActionOf | None = None,
        option_keys: tuple[str, ...] = (),
        seed_key: str = "seed",
        seed_per_rollout: bool = False,
    ) -> None:
        self.factory = factory
        self.env_args = env_args
        self.params = params
        self.inline = inline
        self.text_of = text_of
        self.action_of = action_of
        self.option_keys = option_keys
        self.seed_key = seed_key
        self.seed_per_rollout = seed_per_rollout
        self.env: Any = None
        self.gym_api = False
        """Whether the built environment speaks the Gymnasium API (else the classic one)."""
        self.builds = 0
        self._closed = False  # set by close(): an environment built after it (a cancelled episode's
        self._close_lock = threading.Lock()  # thread finishing late) is closed at once, never leaked
        """Environments this adapter has built (one per distinct constructor arguments in a row)."""
        self._built_args: dict[str, Any] | None = None
        self._hash: str | None = None  # None once the episode ended (or before it started)
        self._live = False

    @property
    def name(self) -> str:
        """The environment's name, for messages."""
        return _name(self.factory)

    async def reset(self, task: Task, rollout: int = 0) -> str:
        """Build (or keep) the environment for ``task``, reset it and hash its first state."""
        self._live = self._closed = False
        observation, self._hash = await self._call(self._start, task, rollout)
        self._live = True
        return observation

    async def step(self, action: str) -> StepResult:
        """Step the environment with ``action`` and hash the state it leads to."""
        if not self._live:
            raise RuntimeError(f"step() of {self.name} called before reset() or after the episode ended.")
        result, self._hash = await self._call(self._step, action)
        self._live = not result[2]
        return result

    def state_hash(self) -> str:
        """The hash computed by the last ``reset`` / ``step`` (so this never blocks)."""
        if not self._live:
            raise RuntimeError(
                f"state_hash() of {self.name} called before reset() or after the episode "
                "ended; call it only while an episode runs."
            )
        return self._hash  # type: ignore[return-value]  # what the environment's state_hash returned

    def close(self) -> Awaitable[None] | None:
        """Close the built environment: an awaitable doing it, or None when there is nothing to close."""
        with self._close_lock:
            self._closed = True
            env, self.env, self._built_args, self._live = self.env, None, None, False
        if env is None or not callable(getattr(env, "close", None)):
            return None
        return self._call(env.close)

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args) if self.inline else await run_blocking(fn, *args)

    def _start(self, task: Task, rollout: int) -> tuple[str, str]:
        args = dict(self.env_args)
        args.update({k: v for k, v in task.raw.items() if k in self.params})
        if self.env is None or not _same(args, self._built_args):
            self._build(args)
        env = self.env
        if not self.gym_api:
            observation = env.reset()
            _check_text(observation, self.name, "reset()")
            return observation, env.state_hash()
        seed = episode_seed(task, rollout, seed_key=self.seed_key, per_rollout=self.seed_per_rollout)
        fixed = self.env_args.get(self.seed_key)
        if self.seed_key not in task.raw and isinstance(fixed, int) and not self.seed_per_rollout:
            seed = fixed  # one seed for every task, given in env_args
        options = {k: task.raw[k] for k in self.option_keys if k in task.raw} or None
        result = env.reset(seed=seed, options=options)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise TypeError(
                f"{self.name}.reset(seed=..., options=...) returned {_short(result)}; expected "
                "(observation, info) as gymnasium.Env.reset does."
            )
        text = self._text(*result, "reset()")
        return text, self._gym_hash(text)

    def _build(self, args: dict[str, Any]) -> None:
        old, self.env = self.env, None
        if old is not None and callable(getattr(old, "close", None)):
            old.close()
        built = self.factory(**args)
        with self._close_lock:
            late = self._closed
            if not late:
                self.env = built
        if late:  # closed while it was being built: close it here instead of leaking it
            if callable(getattr(built, "close", None)):
                built.close()
            raise RuntimeError(f"{self.name} was closed while it was being built")
        self._built_args = args
        self.builds += 1
        self.gym_api = _speaks_gym(self.env)
        blocking = getattr(self.env, "blocking", None)
        if blocking is not None:  # the object's own say, from its next call on
            self.inline = blocking is False

    def _step(self, action: str) -> tuple[StepResult, str | None]:
        env = self.env
        assert env is not None, "step() before reset()"
        if not self.gym_api:
            observation, reward, done, info = env.step(action)
            return (observation, reward, done, info), None if done else env.state_hash()
        result = env.step(self.action_of(action) if self.action_of else action)
        if not (isinstance(result, tuple) and len(result) == 5):
            raise TypeError(
                f"{self.name}.step(action) returned {_short(result)}; expected (observation, reward, "
                "terminated, truncated, info) as gymnasium.Env.step does."
            )
        observation, reward, terminated, truncated, info = result
        info = {**plain(dict(info or {})), "terminated": bool(terminated), "truncated": bool(truncated)}
        text = self._text(observation, info, "step()")
        done = bool(terminated or truncated)
        return (text, _reward(reward, self.name), done, info), None if done else self._gym_hash(text)

    def _text(self, observation: Any, info: dict[str, Any], call: str) -> str:
        if self.text_of is not None:
            observation = self.text_of(observation, info)
            _check_text(observation, f"text_of for {self.name}", "text_of(observation, info)")
            return observation
        if not isinstance(observation, str):
            raise TypeError(
                f"{self.name}.{call} returned an observation of type {type(observation).__name__} "
                f"({_short(observation)}), not text; give the workflow text_of='package.module:function' "
                "(called as text_of(observation, info) -> str) to render it."
            )
        return observation

    def _gym_hash(self, text: str) -> str:
        own = getattr(self.env, "state_hash", None)
        if callable(own):
            return str(own())
        return hashlib.sha1(text.encode()).hexdigest()[:16]


def resolve_env(env: str | EnvFactory) -> EnvFactory:
    """The environment class for ``env``: a registered name (registry kind ``"environment"``),
    ``"package.module:Class"``, or a class / callable given as is."""
    if callable(env):
        return env
    if isinstance(env, str):
        return registry.resolve("environment", env)
    raise ValueError(
        f"env={env!r}; expected an environment name, an import path 'package.module:Class', or a class."
    )


def environment_maker(
    factory: str | EnvFactory,
    env_args: dict[str, Any] | None = None,
    *,
    text_of: TextOf | None = None,
    action_of: ActionOf | None = None,
    option_keys: tuple[str, ...] | list[str] = (),
    seed_key: str = "seed",
    seed_per_rollout: bool = False,
) -> Callable[[], Environment]:
    """A callable returning a new :class:`Environment` object per call, for any shape of class.

    An async class (its ``reset`` is a coroutine function) is built as ``factory(**env_args)``;
    anything else is wrapped in a :class:`BlockingEnvironment` (inline when ``factory.blocking`` is
    ``False``), which passes on the other arguments. ``factory`` may also be a registered name
    (``"textarena"``, ``"grid_world"``, ``"gym"``, ...) or ``"package.module:Class"`` (:func:`resolve_env`).
    """
    factory = resolve_env(factory)
    args = dict(env_args or {})
    if inspect.iscoroutinefunction(getattr(factory, "reset", None)):
        return functools.partial(factory, **args)  # type: ignore[return-value]
    inline = getattr(factory, "blocking", True) is False
    return functools.partial(
        BlockingEnvironment,
        factory,
        args,
        _named_params(factory),
        inline,
        text_of=text_of,
        action_of=action_of,
        option_keys=tuple(option_keys),
        seed_key=seed_key,
        seed_per_rollout=seed_per_rollout,
    )


def plain(value: Any) -> Any:
    """``value`` made JSON-able: numpy scalars and arrays to numbers and lists, other objects to repr."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    if callable(getattr(value, "tolist", None)):  # numpy scalars and arrays
        return plain(value.tolist())
    return repr(value)


def _speaks_gym(env: Any) -> bool:
    """Whether ``env.reset`` takes a ``seed`` (the Gymnasium API) rather than nothing (classic)."""
    try:
        parameters = inspect.signature(env.reset).parameters
    except (TypeError, ValueError, AttributeError):
        return False
    return "seed" in parameters or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())


def _same(args: dict[str, Any], built: dict[str, Any] | None) -> bool:
    try:
        return built is not None and bool(args == built)
    except Exception:  # values whose == is not a bool (arrays): rebuild
        return False


def _reward(value: Any, name: str) -> float:
    try:
        reward = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name}.step returned reward {_short(value)}; expected a number.") from None
    if not math.isfinite(reward):
        raise ValueError(f"{name}.step returned reward {reward}; expected a finite number.")
    return reward


def _check_text(value: Any, name: str, call: str) -> None:
    if not isinstance(value, str):
        raise TypeError(
            f"{name}: {call} returned {_short(value)} of type {type(value).__name__}; expected text."
        )


def _named_params(factory: EnvFactory) -> frozenset[str]:
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(p.name for p in parameters if p.kind in kinds)


def _name(factory: Any) -> str:
    inner = getattr(factory, "func", factory)  # functools.partial
    return getattr(inner, "__qualname__", None) or getattr(inner, "__name__", None) or repr(inner)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
