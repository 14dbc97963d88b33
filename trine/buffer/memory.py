"""In-memory buffer: a thread-safe FIFO queue (the default for sync runs)."""

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

    def put(self, experiences: list[Experience]) -> None:
        for e in experiences:
            e.check()
        with self._cond:
            for e in experiences:
                if e.reward is None:
                    self._pending[e.id] = e
                else:
                    self._ready.append(e)
            if self.capacity is not None:
                while len(self._ready) > self.capacity:
                    self._ready.popleft()
            self._cond.notify_all()

    def set_rewards(self, rewards: dict[str, float]) -> int:
        """Fill in pending rewards by experience id; returns how many became trainable."""
        with self._cond:
            done = 0
            for exp_id, reward in rewards.items():
                e = self._pending.pop(exp_id, None)
                if e is not None:
                    e.reward = float(reward)
                    self._ready.append(e)
                    done += 1
            self._cond.notify_all()
            return done

    def get(
        self, n: int, *, min_version: int | None = None, timeout: float | None = None
    ) -> list[Experience]:
        if n <= 0:
            raise ValueError(f"Buffer.get(n={n}): n must be a positive number of experiences.")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                self._drop_stale(min_version)
                if len(self._ready) >= n:
                    out = [self._ready.popleft() for _ in range(n)]
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
        if min_version is None or all(e.policy_version >= min_version for e in self._ready):
            return
        fresh = [e for e in self._ready if e.policy_version >= min_version]
        self.dropped_stale += len(self._ready) - len(fresh)
        self._ready = collections.deque(fresh)

    def __len__(self) -> int:
        return len(self._ready)

    def metrics(self) -> dict[str, float]:
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
        with self._cond:
            self._closed = True
            self._cond.notify_all()
