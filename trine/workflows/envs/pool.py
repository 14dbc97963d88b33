"""Environment pool: environments lent per episode, reset and reused across tasks, faults contained.

A workflow builds one :class:`EnvPool` (usually with :func:`make_env_pool`) and plays each episode
on a lease::

    pool = make_env_pool("textarena", {"game": "GuessTheNumber-v0"}, size=8, timeout=30.0)
    async with pool.lease() as env:                 # an idle environment, or a new one
        observation = await env.reset(task, rollout=0)
        observation, reward, done, info = await env.step(reply)
    await pool.aclose()                             # closes the idle environments

- ``size=0`` (no pool): every lease gets a new environment object, closed when the lease ends.
- ``size=k``: at most ``k`` environments exist; a lease takes an idle one (reset by the next
  ``reset``) or builds one while fewer than ``k`` exist, else waits for one to come back (the wait
  counts against the explorer's task timeout, so give ``k`` >= the episodes meant to run at once).
- A lease whose ``reset``/``step``/``state_hash`` raised or timed out (:class:`EnvFailure`), or
  whose episode was cancelled or raised, **discards** its environment: it is closed in the
  background (bounded by ``timeout``), never lent again, and its slot is freed for a new one.
- ``timeout`` bounds every ``reset`` and ``step`` (for blocking environments the worker thread is
  abandoned and replaced, :mod:`trine.blocking`); an environment called inline (``blocking =
  False``) is not bounded: it must be fast, pure Python.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from trine import registry
from trine.blocking import CallTimeout
from trine.types import Task
from trine.workflows.envs.base import (
    ActionOf,
    EnvFactory,
    Environment,
    StepResult,
    TextOf,
    _name,
    _short,
    environment_maker,
    resolve_env,
)

log = logging.getLogger("trine.envs")

STATUSES = ("env_error", "timeout")
"""The statuses an :class:`EnvFailure` carries (the trajectory statuses of issue 12)."""


class EnvFailure(RuntimeError):
    """An environment's ``reset``, ``step`` or ``state_hash`` raised (``status="env_error"``) or did
    not return within the pool's timeout (``status="timeout"``).

    Not a ``TimeoutError``, so that code waiting with its own timeout never takes it for its own.
    """

    def __init__(self, env: str, call: str, status: str, detail: str) -> None:
        self.env, self.call, self.status, self.detail = env, call, status, detail
        super().__init__(f"environment {env}: {call} {detail}")


class EnvLease:
    """One environment lent for one episode: its calls, bounded by the pool's timeout.

    Every failure raises :class:`EnvFailure` and is kept in :attr:`failure`; after one, further
    calls raise it again without touching the environment (which the pool then discards).
    """

    def __init__(self, env: Environment, timeout: float | None) -> None:
        self.env = env
        self.timeout = timeout
        self.failure: EnvFailure | None = None
        self._takes_rollout = _accepts(env.reset, "rollout")

    async def reset(self, task: Task, rollout: int = 0) -> str:
        """Start an episode of ``task`` (``rollout``: this episode's index among the task's rollouts)."""
        kwargs = {"rollout": rollout} if self._takes_rollout else {}
        observation = await self._guard("reset", self.env.reset, task, **kwargs)
        if not isinstance(observation, str):
            raise self._fail("reset", "env_error", f"returned {_short(observation)}; expected text.")
        return observation

    async def step(self, action: str) -> StepResult:
        """Apply ``action``; returns ``(observation, reward, done, info)``."""
        result = await self._guard("step", self.env.step, action)
        if not (isinstance(result, (tuple, list)) and len(result) == 4):
            raise self._fail(
                "step", "env_error", f"returned {_short(result)}; expected (observation, reward, done, info)."
            )
        return tuple(result)  # type: ignore[return-value]

    def state_hash(self) -> str:
        """The state the next action is taken from (see :meth:`Environment.state_hash`)."""
        self._check()
        try:
            return self.env.state_hash()
        except Exception as err:
            raise self._fail("state_hash", "env_error", f"raised {type(err).__name__}: {err}") from err

    async def _guard(self, call: str, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self._check()
        try:
            pending = method(*args, **kwargs)
            if not inspect.isawaitable(pending):
                raise TypeError(f"{call}() returned {_short(pending)}, not an awaitable (make it async def)")
            if self.timeout is None or getattr(self.env, "inline", False):
                return await _own_timeouts(pending)
            return await asyncio.wait_for(_own_timeouts(pending), self.timeout)
        except (asyncio.TimeoutError, TimeoutError, CallTimeout):  # only the bound's own (see below)
            raise self._fail(
                call, "timeout", f"did not return within {self.timeout}s (the env timeout)"
            ) from None
        except Exception as err:
            cause = err.__cause__ if isinstance(err, _Raised) else err
            raise self._fail(call, "env_error", f"raised {type(cause).__name__}: {cause}") from cause

    def _check(self) -> None:
        if self.failure is not None:
            raise self.failure

    def _fail(self, call: str, status: str, detail: str) -> EnvFailure:
        self.failure = EnvFailure(_env_name(self.env), call, status, detail)
        return self.failure


class _Raised(Exception):
    """A ``TimeoutError`` the environment raised itself, carried past ``wait_for`` as its cause."""


async def _own_timeouts(pending: Awaitable[Any]) -> Any:
    try:
        return await pending
    except (asyncio.TimeoutError, TimeoutError) as err:
        raise _Raised() from err


class EnvPool:
    """Environments lent per episode (:meth:`lease`); up to ``size`` kept and reused (0: none).

    Args:
        make: returns a new :class:`Environment` object (e.g. from :func:`environment_maker`).
        size: most environments that exist at once, reused across episodes; 0 builds one per
            episode and closes it afterwards.
        timeout: seconds each ``reset``/``step`` may take (None: only the explorer's task timeout).
    """

    def __init__(self, make: Callable[[], Environment], size: int = 0, timeout: float | None = 60.0) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(
                f"pool_size={size!r}; expected an integer >= 0 (0: a new environment per episode)."
            )
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0
        ):
            raise ValueError(
                f"env_timeout={timeout!r}; expected seconds > 0, or None for no bound of its own."
            )
        self.make = make
        self.size = size
        self.timeout = timeout
        self.built = 0
        """Environment objects built so far."""
        self.reused = 0
        """Leases served by an idle environment."""
        self.discarded = 0
        """Environments dropped after a failure or a cancelled/failed episode."""
        self._idle: list[Environment] = []
        self._live = 0  # environments that exist: lent or idle
        self._waiters: deque[asyncio.Future] = deque()
        self._closing: set[asyncio.Task] = set()
        self._closed = False

    @asynccontextmanager
    async def lease(self) -> AsyncIterator[EnvLease]:
        """An environment for one episode; it goes back to the pool (or is closed) afterwards."""
        env = await self._acquire()
        lease = EnvLease(env, self.timeout)
        try:
            yield lease
        except BaseException:  # the episode raised or was cancelled: the env may be mid-call
            self._discard(env)
            raise
        if lease.failure is not None:
            self._discard(env)
        elif self.size > 0 and not self._closed:
            self._idle.append(env)
            self._wake()
        else:  # not pooled: close it now (bounded), so a finished episode leaves nothing open
            self._live -= 1
            self._wake()
            pending = self._close(env, background=False)
            if pending is not None:
                await self._bounded_close(env, pending)

    async def aclose(self) -> None:
        """Close the idle environments and wait for pending closes; leased ones are closed when
        they come back. The pool stays usable (a later lease builds new environments)."""
        self._closed = True
        idle, self._idle = self._idle, []
        for env in idle:
            self._live -= 1
            self._close(env)
        if self._closing:
            await asyncio.gather(*list(self._closing), return_exceptions=True)

    @property
    def idle(self) -> int:
        """Environments waiting in the pool."""
        return len(self._idle)

    # ------------------------------------------------------------------ internals
    async def _acquire(self) -> Environment:
        self._closed = False
        while True:
            if self._idle:
                self.reused += 1
                return self._idle.pop()
            if self.size == 0 or self._live < self.size:
                env = self.make()
                self._live += 1
                self.built += 1
                return env
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif waiter.done() and not waiter.cancelled():
                    self._wake()  # it was woken: pass the turn on
                raise

    def _discard(self, env: Environment) -> None:
        self._live -= 1
        self.discarded += 1
        self._close(env)
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _close(self, env: Environment, background: bool = True) -> Awaitable[Any] | None:
        """Close ``env``: at once when its ``close`` is plain; else the awaitable doing it, run in a
        background task (bounded by the timeout) unless ``background`` is False."""
        close = getattr(env, "close", None)
        if not callable(close):
            return None
        try:
            pending = close()
        except Exception as err:
            log.warning("closing environment %s failed: %s: %s", _env_name(env), type(err).__name__, err)
            return None
        if not inspect.isawaitable(pending):
            return None
        if not background:
            return pending
        task = asyncio.ensure_future(self._bounded_close(env, pending))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        return None

    async def _bounded_close(self, env: Environment, pending: Awaitable[Any]) -> None:
        try:
            await asyncio.wait_for(pending, self.timeout or 60.0)
        except Exception as err:
            log.warning("closing environment %s failed: %s: %s", _env_name(env), type(err).__name__, err)


def make_env_pool(
    env: str | EnvFactory,
    env_args: dict[str, Any] | None = None,
    *,
    size: int = 0,
    timeout: float | None = 60.0,
    text_of: str | TextOf | None = None,
    action_of: str | ActionOf | None = None,
    option_keys: list[str] | tuple[str, ...] = (),
    seed_key: str = "seed",
    seed_per_rollout: bool = False,
) -> EnvPool:
    """An :class:`EnvPool` of ``env`` (name, import path or class) built with ``env_args``.

    ``text_of`` / ``action_of`` may be import paths (``"package.module:function"``); the other
    arguments are those of :class:`~trine.workflows.envs.base.BlockingEnvironment`.
    """
    make = environment_maker(
        resolve_env(env),
        env_args,
        text_of=_callable(text_of, "text_of"),
        action_of=_callable(action_of, "action_of"),
        option_keys=tuple(option_keys or ()),
        seed_key=seed_key,
        seed_per_rollout=seed_per_rollout,
    )
    return EnvPool(make, size, timeout)


def _callable(value: str | Callable[..., Any] | None, what: str) -> Callable[..., Any] | None:
    if value is None or callable(value):
        return value
    if isinstance(value, str):
        try:
            found = registry.import_object(value)
        except (ImportError, AttributeError, ValueError) as err:
            raise ValueError(
                f"{what}={value!r} could not be imported: {err}; expected 'package.module:function', "
                "importable from where trine runs."
            ) from err
        if callable(found):
            return found
    raise ValueError(f"{what}={value!r}; expected a function or its import path 'package.module:function'.")


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _env_name(env: Any) -> str:
    name = getattr(env, "name", None)
    return name if isinstance(name, str) else _name(type(env))


__all__ = ["STATUSES", "EnvFailure", "EnvLease", "EnvPool", "make_env_pool", "resolve_env"]
