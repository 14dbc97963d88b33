"""In-memory buffer: a thread-safe FIFO queue (the default for sync runs).

:class:`MemoryBuffer` holds the buffer semantics every storage follows: ``put`` queues trainable
experiences and keeps ``reward=None`` ones pending; ``set_rewards`` fills pending ones (by id or by
``(task_id, run_id)``); ``get(n)`` takes exactly ``n`` trainable experiences, oldest first, after
dropping (and counting) those older than ``min_version``, or raises ``BufferTimeout`` consuming
nothing. Subclasses that persist the state (:class:`~trine.buffer.files.FileBuffer`) override
:meth:`MemoryBuffer._journal`, which sees every change before it takes effect.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from trine.buffer.base import BufferTimeout
from trine.types import Experience


class MemoryBuffer:
    """FIFO of ready experiences plus a side table of pending ones (reward not yet known).

    Thread-safe: explorer and trainer threads may put/get concurrently.
    """

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self._ready: collections.deque[Experience] = collections.deque()
        self._pending: dict[str, Experience] = {}
        self._cond = threading.Condition()
        self._closed = False
        self.dropped_stale = 0
        self.consumed = 0

    def _journal(self, records: list[dict[str, Any]]) -> None:
        """Record a change before it takes effect (no-op here; persistent subclasses write it)."""

    def put(self, experiences: list[Experience]) -> None:
        """Store experiences (those with ``reward=None`` wait as pending)."""
        for e in experiences:
            e.check()
        with self._cond:
            self._journal([e.to_dict() for e in experiences])
            for e in experiences:
                self._add(e)
            if self.capacity is not None:
                while len(self._ready) > self.capacity:
                    self._ready.popleft()
            self._cond.notify_all()

    def _add(self, e: Experience) -> None:
        if e.reward is None:
            self._pending[e.id] = e
        else:
            self._ready.append(e)

    def _fill(self, exp_id: str, reward: float) -> None:
        e = self._pending.pop(exp_id, None)
        if e is not None:
            e.reward = float(reward)
            self._ready.append(e)

    def set_rewards(self, rewards: dict[Any, float]) -> int:
        """Fill pending rewards by experience id or ``(task_id, run_id)``; returns how many filled."""
        with self._cond:
            updates: dict[str, float] = {}
            for key, reward in rewards.items():
                if isinstance(key, str):
                    if key in self._pending:
                        updates[key] = float(reward)
                elif isinstance(key, (tuple, list)) and len(key) == 2:
                    for e in self._pending.values():
                        if (e.task_id, e.run_id) == tuple(key):
                            updates[e.id] = float(reward)
                else:
                    raise TypeError(
                        f"set_rewards key {key!r}: expected an experience id (str) or a (task_id, run_id) pair."
                    )
            self._journal([{"_event": "reward", "id": i, "reward": r} for i, r in updates.items()])
            for exp_id, reward in updates.items():
                self._fill(exp_id, reward)
            self._cond.notify_all()
            return len(updates)

    def get(
        self, n: int, *, min_version: int | None = None, timeout: float | None = None
    ) -> list[Experience]:
        """Take ``n`` trainable experiences, oldest first, or raise :class:`BufferTimeout`."""
        if n <= 0:
            raise ValueError(f"Buffer.get(n={n}): n must be a positive number of experiences.")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                self._drop_stale(min_version)
                if len(self._ready) >= n:
                    out = [self._ready[i] for i in range(n)]
                    self._journal([{"_event": "consumed", "ids": [e.id for e in out]}])
                    for _ in range(n):
                        self._ready.popleft()
                    self.consumed += n
                    return out
                if self._closed:
                    raise BufferTimeout(
                        f"buffer closed with {len(self._ready)} of {n} requested experiences ready"
                    )
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise BufferTimeout(
                        f"only {len(self._ready)} of {n} experiences were ready after {timeout}s "
                        f"({len(self._pending)} pending a reward); raise buffer.get_timeout or check the explorer."
                    )
                self._cond.wait(remaining)

    def _drop_stale(self, min_version: int | None) -> None:
        # Not only the head: a pending reward filled in late puts an old version behind newer ones.
        if min_version is None:
            return
        stale = [e.id for e in self._ready if e.policy_version < min_version]
        if stale:
            self._journal([{"_event": "dropped", "ids": stale}])
            self._ready = collections.deque(e for e in self._ready if e.policy_version >= min_version)
            self.dropped_stale += len(stale)

    def __len__(self) -> int:
        return len(self._ready)

    def metrics(self) -> dict[str, float]:
        """``buffer/size``, ``buffer/pending`` and ``buffer/dropped_stale``."""
        with self._cond:
            return {
                "buffer/size": float(len(self._ready)),
                "buffer/pending": float(len(self._pending)),
                "buffer/dropped_stale": float(self.dropped_stale),
            }

    def state_dict(self) -> dict[str, Any]:
        with self._cond:
            return {
                "ready": [e.to_dict() for e in self._ready],
                "pending": [e.to_dict() for e in self._pending.values()],
                "dropped_stale": self.dropped_stale,
                "consumed": self.consumed,
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._cond:
            self._ready = collections.deque(Experience.from_dict(d) for d in state["ready"])
            self._pending = {d["id"]: Experience.from_dict(d) for d in state["pending"]}
            self.dropped_stale = state["dropped_stale"]
            self.consumed = state["consumed"]

    def close(self) -> None:
        """Stop waiting ``get`` calls."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
