"""In-memory buffer: thread-safe, the default for sync runs.

:class:`MemoryBuffer` holds the buffer semantics every storage follows: ``put`` stores trainable
experiences and keeps ``reward=None`` ones pending; ``set_rewards`` fills pending ones (by id or by
``(task_id, run_id)``); ``get(n)`` takes exactly ``n`` trainable experiences by the rules of
:mod:`trine.buffer.sampling` (FIFO by default: put order, each handed out once), or raises
``BufferTimeout`` consuming nothing. Every ``put`` also records one explored batch (an id from a
counter, and its size); ``get(None)`` takes the oldest batch record not taken yet and hands out
what ``get(size)`` would (``[]`` for an empty batch), taking the record only with the rows.

Every change of state is an *event* (a dict with an ``"_event"`` key, see
:mod:`trine.buffer.files`) applied by :meth:`MemoryBuffer._apply`; subclasses that persist the
state (:class:`~trine.buffer.files.FileBuffer`) override :meth:`MemoryBuffer._journal`, which sees
every put and event before it takes effect, and replay the events on reopening.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trine.buffer.base import BufferTimeout
from trine.buffer.sampling import SamplingRules, arrange, batch_metrics
from trine.types import Experience


@dataclass
class _Slot:
    """One stored experience and its bookkeeping."""

    exp: Experience
    seq: int
    """Put order (ties and FIFO order)."""
    put_at: float
    """``clock()`` at the put (pending timeout)."""
    uses: int = 0
    last_get: int | None = None
    """Number of the get that last handed it out (cooldown)."""


class MemoryBuffer:
    """Trainable experiences plus a side table of pending ones (reward not yet known).

    Thread-safe: explorer and trainer threads may put/get concurrently. Sampling, replay,
    staleness, pending timeout and whole-group rules: see :mod:`trine.buffer.sampling`.

    Args:
        capacity: keep at most this many trainable experiences (the oldest are evicted).
        rules: the sampling rules (:class:`~trine.buffer.sampling.SamplingRules`: sampler, replay,
            staleness, pending timeout, whole groups; None = the defaults: FIFO, each once).
        clock: seconds for the pending timeout (inject a fake one in tests).
    """

    def __init__(
        self,
        capacity: int | None = None,
        *,
        rules: SamplingRules | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.capacity = capacity
        self.rules = SamplingRules() if rules is None else rules
        self.clock = clock
        self._ready: dict[str, _Slot] = {}
        self._pending: dict[str, _Slot] = {}
        self._seq = 0
        self._cond = threading.Condition()
        self._closed = False
        self.dropped_stale = 0
        self.consumed = 0
        """Experiences handed out (a replayed experience counts at each hand-out)."""
        self.pending_expired = 0
        self.gets = 0
        """Get calls that returned a batch (the cooldown counts these)."""
        self.last_batch: dict[str, float] = {}
        """``buffer/reuse`` and ``buffer/staleness_*`` of the last batch handed out."""
        self._batches: dict[int, int] = {}
        """Explored batches not taken by ``get(None)`` yet: batch id -> size, oldest first."""
        self._next_batch = 1
        """Id of the next explored batch (one per ``put``)."""
        self._tasks: dict[int, list[int]] = {}
        """Tasks with rows here (``info["task_seq"]``) -> [rows stored, rows handed out, rows dropped stale]."""
        self._stale_tasks: list[int] = []
        """Tasks whose rows were all dropped as stale, not yet taken (:meth:`take_stale_tasks`)."""

    # -- changes of state -------------------------------------------------------------------------

    def _journal(self, records: list[dict[str, Any]]) -> None:
        """Record a change before it takes effect (no-op here; persistent subclasses write it)."""

    def _clear(self) -> None:
        """Forget every experience and counter (a persistent subclass then replays its log)."""
        self._ready, self._pending, self._seq = {}, {}, 0
        self._batches, self._next_batch = {}, 1
        self._tasks, self._stale_tasks = {}, []
        self.dropped_stale = self.consumed = self.pending_expired = self.gets = 0
        self.last_batch = {}

    def _record(self, event: dict[str, Any]) -> None:
        self._journal([event])
        self._apply(event)

    def _add(self, e: Experience) -> None:
        slot = _Slot(e, self._seq, self.clock())
        self._seq += 1
        (self._pending if e.reward is None else self._ready)[e.id] = slot
        if (task := e.info.get("task_seq")) is not None:
            self._tasks.setdefault(int(task), [0, 0, 0])[0] += 1

    def _gone(self, slot: _Slot | None, how: int | None = None) -> None:
        """``slot`` left the buffer (``how``: 1 handed out, 2 dropped as stale, None otherwise); a task all of
        whose rows were dropped as stale joins :attr:`_stale_tasks`."""
        task = None if slot is None else slot.exp.info.get("task_seq")
        if task is None or int(task) not in self._tasks:
            return
        counts = self._tasks[int(task)]
        counts[0] -= 1
        if how is not None:
            counts[how] += 1
        if counts[0] <= 0:
            del self._tasks[int(task)]
            if counts[2] and not counts[1]:
                self._stale_tasks.append(int(task))

    def _fill(self, exp_id: str, reward: float) -> None:
        slot = self._pending.pop(exp_id, None)
        if slot is not None:
            slot.exp.reward = float(reward)
            self._ready[exp_id] = slot

    def _apply(self, event: dict[str, Any]) -> None:
        """Apply one event (live, or replayed from a log); unknown events are ignored."""
        kind = event.get("_event")
        if kind == "reward":
            self._fill(event["id"], event["reward"])
        elif kind == "expired":
            for exp_id in event["ids"]:
                if event["reward"] is None:
                    self._gone(self._pending.pop(exp_id, None))
                else:
                    self._fill(exp_id, event["reward"])
            self.pending_expired += len(event["ids"])
        elif kind == "dropped":
            for exp_id in event["ids"]:
                self._gone(self._ready.pop(exp_id, None), 2)
            self.dropped_stale += len(event["ids"])
        elif kind == "batch":  # one put: an explored batch of "size" experiences
            self._batches[int(event["batch"])] = int(event["size"])
            self._next_batch = max(self._next_batch, int(event["batch"]) + 1)
        elif kind == "taken":  # get(None) took that explored batch
            self._batches.pop(int(event["batch"]), None)
        elif kind in ("consumed", "used"):  # one get: "consumed" = for good, "used" = may replay
            self.gets += 1
            self.consumed += len(event["ids"])
            for exp_id in event["ids"]:
                slot = self._ready.get(exp_id)
                if slot is None:
                    continue
                slot.uses, slot.last_get = slot.uses + 1, self.gets
                if kind == "consumed" or slot.uses >= self.rules.reuse_limit:
                    self._gone(self._ready.pop(exp_id), 1)
                elif (task := slot.exp.info.get("task_seq")) is not None and int(task) in self._tasks:
                    self._tasks[int(task)][1] += 1  # handed out, may be handed out again

    # -- the Buffer protocol ----------------------------------------------------------------------

    def put(self, experiences: list[Experience]) -> None:
        """Store experiences (those with ``reward=None`` wait as pending) as one explored batch."""
        for e in experiences:
            e.check()
        with self._cond:
            seen: set[str] = set()
            for e in experiences:
                if e.id in seen or e.id in self._ready or e.id in self._pending:
                    raise ValueError(
                        f"put: experience id {e.id!r} is already stored; give each Experience a fresh id."
                    )
                seen.add(e.id)
            batch = {"_event": "batch", "batch": self._next_batch, "size": len(experiences)}
            self._journal([*(e.to_dict() for e in experiences), batch])
            for e in experiences:
                self._add(e)
            self._apply(batch)
            excess = 0 if self.capacity is None else len(self._ready) - self.capacity
            for slot in sorted(self._ready.values(), key=lambda s: s.seq)[: max(excess, 0)]:
                self._gone(self._ready.pop(slot.exp.id))
            self._cond.notify_all()

    def set_rewards(self, rewards: dict[Any, float]) -> int:
        """Fill pending rewards by experience id or ``(task_id, run_id)``; returns how many filled."""
        with self._cond:
            updates: dict[str, float] = {}
            for key, reward in rewards.items():
                if isinstance(key, str):
                    if key in self._pending:
                        updates[key] = float(reward)
                elif isinstance(key, (tuple, list)) and len(key) == 2:
                    for slot in self._pending.values():
                        if (slot.exp.task_id, slot.exp.run_id) == tuple(key):
                            updates[slot.exp.id] = float(reward)
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
        self,
        n: int | None,
        *,
        min_version: int | None = None,
        current_version: int | None = None,
        timeout: float | None = None,
    ) -> list[Experience]:
        """Take ``n`` trainable experiences by the sampling rules, or raise :class:`BufferTimeout`.

        ``min_version`` and ``current_version`` (with ``max_staleness``) set the staleness floor;
        ``current_version`` also gives ``buffer/staleness_*``. Nothing is consumed on timeout.
        ``n=None``: the oldest explored batch not taken yet, whole (see :class:`~trine.buffer.base.Buffer`).
        """
        if n is not None and n <= 0:
            raise ValueError(f"Buffer.get(n={n}): n must be a positive number of experiences.")
        floor = self.rules.floor(min_version, current_version)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                batch = next(iter(self._batches.items()), None) if n is None else None
                size, eligible = (n if batch is None else batch[1]), None
                if size == 0 and batch is not None:  # an explored batch with nothing in it
                    self._record({"_event": "taken", "batch": batch[0]})
                    return []
                if size is not None:
                    self._housekeep(floor)
                    eligible = self._eligible()
                    chosen = arrange(eligible, size, self._group_of if self.rules.whole_groups else None)
                    if chosen is not None:
                        return self._hand_out(chosen, current_version, None if batch is None else batch[0])
                remaining = None if deadline is None else deadline - time.monotonic()
                if self._closed or (remaining is not None and remaining <= 0):
                    raise self._not_ready(size, eligible, timeout)
                self._cond.wait(self._wait_time(remaining))

    def _not_ready(self, n: int | None, eligible: list[_Slot] | None, timeout: float | None) -> BufferTimeout:
        """The error of a get that is giving up (closed, or ``timeout`` passed); ``n`` None: no batch."""
        if eligible is None:
            if self._closed:
                return BufferTimeout("buffer closed with no explored batch waiting for get(None)")
            return BufferTimeout(
                f"no explored batch arrived within {timeout}s; every batch put so far was taken "
                f"({len(self._ready)} experiences ready, {len(self._pending)} pending a reward); "
                "raise buffer.get_timeout or check the explorer."
            )
        if self._closed:
            return BufferTimeout(f"buffer closed with {len(eligible)} of {n} requested experiences ready")
        waiting = len(self._ready) - len(eligible)
        return BufferTimeout(
            f"only {len(eligible)} of {n} experiences were ready after {timeout}s "
            f"({len(self._pending)} pending a reward"
            + (f", {waiting} waiting for a cooldown or their group" if waiting else "")
            + "); raise buffer.get_timeout or check the explorer."
        )

    @staticmethod
    def _group_of(slot: _Slot) -> str:
        return slot.exp.group_id or "\0" + slot.exp.id

    def _housekeep(self, floor: int | None) -> None:
        """Expire pending experiences past the timeout, then drop those below the staleness floor."""
        cutoff = self.rules.expiry_cutoff(self.clock())
        if cutoff is not None:
            expired = [i for i, s in self._pending.items() if s.put_at < cutoff]
            if expired:
                self._record({"_event": "expired", "ids": expired, "reward": self.rules.expired_reward})
        if floor is not None:
            stale = [i for i, s in self._ready.items() if s.exp.policy_version < floor]
            if stale:
                self._record({"_event": "dropped", "ids": stale})

    def _eligible(self) -> list[_Slot]:
        """Trainable experiences that may go out in the next get, in hand-out order."""
        rules, next_get = self.rules, self.gets + 1
        blocked = {s.exp.group_id for s in self._pending.values()} if rules.whole_groups else set()
        slots = [
            s
            for s in self._ready.values()
            if rules.cooled_down(s.last_get, next_get) and not (s.exp.group_id and s.exp.group_id in blocked)
        ]
        if rules.replay:
            slots.sort(key=lambda s: (-rules.priority(s.exp.policy_version, s.uses), s.seq))
        elif rules.oldest_weights_first:
            slots.sort(key=lambda s: (s.exp.policy_version, s.seq))
        else:
            slots.sort(key=lambda s: s.seq)
        return slots

    def _hand_out(
        self, chosen: list[_Slot], current_version: int | None, batch: int | None = None
    ) -> list[Experience]:
        """Record the hand-out of ``chosen`` (and the taking of explored ``batch``, in the same write)."""
        uses = [s.uses + 1 for s in chosen]
        versions = [s.exp.policy_version for s in chosen]
        events = [{"_event": "used" if self.rules.replay else "consumed", "ids": [s.exp.id for s in chosen]}]
        if batch is not None:
            events.append({"_event": "taken", "batch": batch})
        self._journal(events)
        for event in events:
            self._apply(event)
        self.last_batch = batch_metrics(self.rules, uses, versions, current_version)
        return [s.exp for s in chosen]

    def _wait_time(self, remaining: float | None) -> float | None:
        """Wait no longer than until the next pending experience expires."""
        if self.rules.pending_timeout is None or not self._pending:
            return remaining
        first = min(s.put_at for s in self._pending.values())
        until = max(first + self.rules.pending_timeout - self.clock(), 0.0) + 0.01
        return until if remaining is None else min(remaining, until)

    def __len__(self) -> int:
        return len(self._ready)

    def batches_waiting(self) -> int:
        """Explored batches (one per ``put``) not taken by ``get(None)`` yet."""
        with self._cond:
            return len(self._batches)

    def metrics(self) -> dict[str, float]:
        """``buffer/*`` metrics (names in :mod:`trine.buffer.sampling`); expires timed-out pending ones."""
        with self._cond:
            self._housekeep(None)
            out = {
                "buffer/size": float(len(self._ready)),
                "buffer/pending": float(len(self._pending)),
                "buffer/dropped_stale": float(self.dropped_stale),
            }
            if self.rules.pending_timeout is not None:
                out["buffer/pending_expired"] = float(self.pending_expired)
            return {**out, **self.last_batch}

    def take_stale_tasks(self) -> list[int]:
        """The tasks (``info["task_seq"]`` of their rows) whose rows were all dropped as stale, none handed
        out, since the last call: a streaming explorer explores them again (``buffer.stale_retries``). An
        optional method of a storage (:meth:`trine.explorer.side.ExplorerSide.requeue` asks for it)."""
        with self._cond:
            out, self._stale_tasks = self._stale_tasks, []
            return out

    def _counters(self) -> dict[str, Any]:
        return {
            "dropped_stale": self.dropped_stale,
            "consumed": self.consumed,
            "pending_expired": self.pending_expired,
            "gets": self.gets,
            "last_batch": dict(self.last_batch),
            "tasks": {str(k): list(v) for k, v in self._tasks.items()},
            "stale_tasks": list(self._stale_tasks),
        }

    def _load_counters(self, state: dict[str, Any]) -> None:
        self.dropped_stale = int(state.get("dropped_stale", self.dropped_stale))
        self.consumed = int(state.get("consumed", self.consumed))
        self.pending_expired = int(state.get("pending_expired", self.pending_expired))
        self.gets = int(state.get("gets", self.gets))
        self.last_batch = dict(state.get("last_batch", self.last_batch))
        if "tasks" in state:  # a state from before task reports rebuilds them from its rows
            self._tasks = {int(k): list(v) for k, v in state["tasks"].items()}
            self._stale_tasks = [int(t) for t in state.get("stale_tasks", [])]

    def state_dict(self) -> dict[str, Any]:
        """Experiences, their use counts, the explored batches not taken yet (``batches``: ``[id,
        size]`` pairs, and ``next_batch``) and the counters (pending timeouts restart on load)."""
        with self._cond:
            slots = sorted([*self._ready.values(), *self._pending.values()], key=lambda s: s.seq)
            return {
                "ready": [s.exp.to_dict() for s in slots if s.exp.id in self._ready],
                "pending": [s.exp.to_dict() for s in slots if s.exp.id in self._pending],
                "slots": {s.exp.id: [s.seq, s.uses, s.last_get] for s in slots},
                "batches": [[b, size] for b, size in self._batches.items()],
                "next_batch": self._next_batch,
                **self._counters(),
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved (a state from before batch records has none)."""
        with self._cond:
            now, meta = self.clock(), state.get("slots", {})
            self._ready, self._pending = {}, {}
            for key, target in (("ready", self._ready), ("pending", self._pending)):
                for d in state[key]:
                    e = Experience.from_dict(d)
                    seq, uses, last_get = meta.get(e.id, (self._seq, 0, None))
                    target[e.id] = _Slot(e, seq, now, uses, last_get)
                    self._seq = max(self._seq, seq) + 1
            self._batches = {int(b): int(size) for b, size in sorted(state.get("batches", []))}
            self._next_batch = int(state.get("next_batch", max(self._batches, default=0) + 1))
            self._tasks, self._stale_tasks = {}, []
            for slot in [*self._ready.values(), *self._pending.values()]:
                if (task := slot.exp.info.get("task_seq")) is not None:
                    self._tasks.setdefault(int(task), [0, 0, 0])[0] += 1
            self._load_counters(state)

    def close(self) -> None:
        """Stop waiting ``get`` calls."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
