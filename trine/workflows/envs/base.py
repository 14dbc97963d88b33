"""The Environment protocol, and the adapter that runs a blocking environment behind it.

A step-wise workflow drives one :class:`Environment` per episode, only through ``await``::

    env = new_env()                       # a fresh object per episode (see environment_maker)
    observation = await env.reset(task)
    state = env.state_hash()              # GiGPO's anchor: the state the next action is taken from
    observation, reward, done, info = await env.step(completion.text)

Two shapes of environment class are accepted (:func:`environment_maker` tells them apart):

- **async** (``async def reset(self, task)``): implements :class:`Environment` itself. It is built
  as ``Class(**env_args)`` (keep the constructor cheap: it runs in the event loop) and reads what it
  needs from the task in ``reset`` (``task.raw`` is the whole row).
- **blocking** (today's shape: ``reset()`` without a task, ``step(text)``, ``state_hash()``, all
  plain methods; see :class:`SyncEnvironment`): wrapped in a :class:`BlockingEnvironment`. The task
  reaches it through its constructor: ``env_args`` updated with every row key that names a
  constructor parameter (a grid-world row's ``size``, ``seed``...). Its construction, ``reset``,
  ``step`` and ``state_hash`` run in worker threads through :func:`trine.blocking.run_blocking`,
  so the event loop keeps serving other tasks and the explorer's task timeout bounds them; a class
  that is pure, fast Python says ``blocking = False`` to be called inline instead, which keeps
  seeded sampling bit-reproducible (threads finishing at timing-dependent moments change which
  requests the engine batches together, hence which random numbers each row draws).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from trine.blocking import run_blocking
from trine.types import Task

StepResult = tuple[str, float, bool, dict[str, Any]]
"""What ``step`` returns: ``(observation, reward, done, info)``; ``info`` is free-form and JSON-able
(``info["success"]``, if present, marks a solved episode)."""


@runtime_checkable
class Environment(Protocol):
    """One episode at a time of a text environment, as step-wise workflows drive it."""

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


class SyncEnvironment(Protocol):
    """A blocking environment (the shape :class:`BlockingEnvironment` adapts)."""

    def reset(self) -> str:
        """Start an episode; returns the first observation."""
        ...

    def step(self, action: str) -> StepResult:
        """Apply ``action``; returns ``(observation, reward, done, info)``."""
        ...

    def state_hash(self) -> str:
        """The current state, hashed (see :meth:`Environment.state_hash`)."""
        ...


EnvFactory = Callable[..., Environment | SyncEnvironment]
"""An environment class, or a callable that builds one from keyword arguments."""


class BlockingEnvironment:
    """A :class:`SyncEnvironment` class run behind the async :class:`Environment` protocol.

    Each ``reset(task)`` builds a fresh environment from ``env_args`` updated with the row keys in
    ``params``, resets it and hashes its state, as one call; each ``step`` steps it and (unless the
    episode ended) hashes the new state, as one call. Calls run in a worker thread of the current
    :class:`~trine.blocking.BlockingPool` (bounded by the explorer's task timeout), or inline.

    Args:
        factory: the environment class (or a callable returning one).
        env_args: its keyword arguments for every task.
        params: the row keys that override ``env_args`` (the factory's keyword parameters).
        inline: call the environment in the event loop instead of a worker thread.
    """

    def __init__(
        self, factory: EnvFactory, env_args: dict[str, Any], params: frozenset[str], inline: bool
    ) -> None:
        self.factory = factory
        self.env_args = env_args
        self.params = params
        self.inline = inline
        self.env: SyncEnvironment | None = None
        self._hash: str | None = None  # None once the episode ended (or before it started)
        self._live = False

    async def reset(self, task: Task) -> str:
        """Build the environment for ``task``, reset it and hash its first state."""
        observation, self._hash = await self._call(self._start, task)
        self._live = True
        return observation

    async def step(self, action: str) -> StepResult:
        """Step the environment with ``action`` and hash the state it leads to."""
        result, self._hash = await self._call(self._step, action)
        self._live = not result[2]
        return result

    def state_hash(self) -> str:
        """The hash computed by the last ``reset`` / ``step`` (so this never blocks)."""
        if not self._live:
            raise RuntimeError(
                f"state_hash() of {_name(self.factory)} called before reset() or after the episode "
                "ended; call it only while an episode runs."
            )
        return self._hash  # type: ignore[return-value]  # what the environment's state_hash returned

    async def _call(self, fn: Callable[..., Any], arg: Any) -> Any:
        return fn(arg) if self.inline else await run_blocking(fn, arg)

    def _start(self, task: Task) -> tuple[str, str]:
        args = dict(self.env_args)
        args.update({k: v for k, v in task.raw.items() if k in self.params})
        env = self.env = self.factory(**args)
        return env.reset(), env.state_hash()

    def _step(self, action: str) -> tuple[StepResult, str | None]:
        assert self.env is not None, "step() before reset()"
        observation, reward, done, info = self.env.step(action)
        return (observation, reward, done, info), None if done else self.env.state_hash()


def environment_maker(
    factory: EnvFactory, env_args: dict[str, Any] | None = None
) -> Callable[[], Environment]:
    """A callable returning a fresh :class:`Environment` per episode, for either shape of class.

    An async class (its ``reset`` is a coroutine function) is built as ``factory(**env_args)``;
    anything else is wrapped in a :class:`BlockingEnvironment`, inline when ``factory.blocking`` is
    ``False``.
    """
    args = dict(env_args or {})
    if inspect.iscoroutinefunction(getattr(factory, "reset", None)):
        return functools.partial(factory, **args)  # type: ignore[return-value]
    inline = getattr(factory, "blocking", True) is False
    return functools.partial(BlockingEnvironment, factory, args, _named_params(factory), inline)


def _named_params(factory: EnvFactory) -> frozenset[str]:
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return frozenset()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(p.name for p in parameters if p.kind in kinds)


def _name(factory: EnvFactory) -> str:
    return getattr(factory, "__qualname__", None) or repr(factory)
