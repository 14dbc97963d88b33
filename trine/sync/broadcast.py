"""Weight sync by collective transfer (``sync.method: broadcast``): one trainer process sends each new
version **once**, down one process group, to any number of explorer processes over ``torch.distributed``
(gloo on CPU, NCCL on CUDA).

The trainer (:class:`BroadcastSender`) hosts a ``TCPStore`` at ``host:port``; an explorer
(:class:`BroadcastReceiver`) connects to it and takes a **slot**. The trainer's worker thread keeps **one
process group** of the trainer (rank 0) and every explorer that answered (ranks 1..n, explorers of one host
next to each other) and sends each version down a **route** of its ranks: the trainer sends each piece to the
first explorer, each explorer forwards it to the next while it receives the one after
(:func:`trine.sync.collective.relay`). So the trainer uploads a version once whatever the number of
explorers, and a push takes about as long for four explorers as for one.

A process group has a fixed set of ranks, so the group is **formed again** (a new *generation*, under its
own prefix of the store) whenever its membership changes, between two pushes; while it does not change,
every push reuses the group:

- an explorer that joins (or comes back after a restart) is placed in the next generation, formed at once,
  and receives the newest version right away, alone on its route (the others already hold it): it never
  waits for the next training step;
- a transfer that fails (an explorer killed, hung, or too slow: every wait is bounded by
  ``sync.broadcast_timeout``) ends its generation; the next one is formed from the explorers that answer
  within :data:`ANSWER` seconds, and those that missed the version get it at once. An explorer that
  answers later takes a new slot and joins the generation after. ``push`` never waits longer than one
  regroup and one transfer; each explorer lost is counted in ``sync/broadcast_failures``.

The store carries everything but the weights: the generations (``trine/g<g>/call`` the slots asked to
answer, ``ok/<slot>`` their answers, ``members`` the ranks), the messages of a generation (``m<k>``: a
version and its route, a regroup, or the end), the explorers' acknowledgements (``ack<k>``) and failures
(``fail``), and each distinct layout once. Explorers wait for messages by looking at the store (every
:data:`~trine.sync.collective.POLL` seconds when idle), never inside a collective, so a version hours away
holds no socket and ``close()`` is prompt. ``push`` returns once every member acknowledged the version or
its transfer failed; explorers receive in a background thread into fresh buffers and
:meth:`BroadcastReceiver.pull` loads the newest received into the engine between batches.

Every explorer must reach the trainer *and the other explorers* (the group connects them all). Without a
network path from explorers to the trainer, use ``sync.method: published`` (the run directory).
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import socket
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch import Tensor, nn

from trine.models.protocol import RolloutModel
from trine.sync.base import check_fits
from trine.sync.collective import (
    POLL,
    Layout,
    agree_backend,
    form_group,
    on_device,
    pack,
    relay,
    resolve_backend,
    transfer_device,
    wait_key,
)

log = logging.getLogger("trine")
JOINS = "trine/joins"
GENERATION = "trine/generation"
BACKEND = "trine/backend"
CLOSED = "trine/closed"
"""Set in the store by :meth:`BroadcastSender.close`: explorers stop joining a trainer that has finished."""
ANSWER = 5.0
"""Seconds the explorers asked to form a generation have to answer (at most ``sync.broadcast_timeout``);
a live explorer answers in milliseconds, so this only bounds the wait for a dead or hung one."""
_TICK = 0.1
"""Seconds between two looks of the trainer's worker for joiners and failures when nothing is pushed."""
_SETTLE = 2.0
"""``close()`` waits up to this many seconds for its thread to end (see :func:`_close_at_exit`)."""
_HOST = socket.gethostname()
_OPEN: weakref.WeakSet = weakref.WeakSet()
"""Senders and receivers of this process, closed at exit."""

__all__ = ["BroadcastReceiver", "BroadcastSender", "resolve_backend"]


@atexit.register
def _close_at_exit() -> None:
    """Close every sender and receiver before the interpreter finalizes: a thread still destroying a
    gloo group while it does aborts the process ("terminate called without an active exception")."""
    for side in list(_OPEN):
        side.close()


def _key(generation: int, what: str) -> str:
    return f"trine/g{generation}/{what}"


def host_port(address: str) -> tuple[str, int]:
    """``(host, port)`` of ``host:port``; a ValueError naming ``sync.address`` otherwise."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"sync.address={address!r}: expected host:port, e.g. 10.0.0.1:29600")
    return host, int(port)


def _slot_key(slot: int | str, what: str = "join") -> str:
    return f"trine/{what}/{slot}"


class TrainerClosed(ConnectionError):
    """The trainer closed its weight broadcast (its run ended): explorers stop receiving from it."""


def _connection(store: Any, host: str, timeout: timedelta) -> Any:
    """A client connection of its own to ``store`` (a TCPStore serializes the calls on one connection)."""
    import torch.distributed as dist

    if hasattr(store, "clone"):  # torch >= 2.5
        return store.clone()
    return dist.TCPStore(host, store.port, is_master=False, timeout=timeout)


@dataclass(frozen=True)
class _Push:
    n: int
    """The push's number in this sender (versions may repeat; numbers do not)."""
    version: int
    layout: Layout
    flats: list[Tensor]
    pieces: list[Tensor]


class BroadcastSender:
    """The trainer's side: hosts the rendezvous store at ``host:port`` (port 0: a free one; ``address``
    says which) and sends every pushed version to the explorers of its group (see the module docstring)."""

    def __init__(
        self, host: str, port: int, bucket_mb: float = 64, backend: str = "auto", timeout: float = 60.0
    ) -> None:
        import torch.distributed as dist

        if bucket_mb <= 0 or timeout <= 0:
            raise ValueError(f"bucket_mb={bucket_mb}, timeout={timeout}: both must be > 0")
        self.backend = resolve_backend(backend)
        self.device = transfer_device(self.backend)
        self.timeout = timedelta(seconds=timeout)
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.host = host
        self.store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False, timeout=self.timeout)
        self.address = f"{host}:{self.store.port}"
        self.store.set(BACKEND, self.backend)
        self.store.add(JOINS, 0)
        self.store.add(GENERATION, 0)
        self.cond = threading.Condition()
        self.current: _Push | None = None
        """The newest push: its buckets, ready to send (a copy: the trainer steps on meanwhile)."""
        self.settled = 0
        """The number of the newest push whose delivery ended (every member holds it, or it failed)."""
        self.members: list[str] = []
        """The names of the explorers of the current group, in rank order."""
        self.failures = 0
        self.regroups = 0
        self.closed = False
        self.stopped: str | None = None
        """Why the worker thread ended before ``close`` (None: it runs)."""
        self.seconds = 0.0
        self._worker = threading.Thread(target=_Coordinator(self).run, name="trine-broadcast", daemon=True)
        self._worker.start()
        _OPEN.add(self)

    def push(self, model: nn.Module, version: int) -> None:
        """Send ``model``'s weights as ``version`` to every explorer of the group; returns when each
        acknowledged it or its transfer failed (the group is then formed again without the explorers that
        do not answer; the others get the version at once)."""
        start = time.perf_counter()
        layout, flats = pack(model, self.bucket_bytes, self.device)
        if self.device != "cpu":  # the worker thread sends them: finish the copies first
            torch.cuda.synchronize(self.device)
        with self.cond:
            n = (self.current.n if self.current else 0) + 1
            self.current = _Push(n, version, layout, flats, layout.pieces(flats))
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.closed or self.stopped or self.settled >= n)
            if self.stopped and not self.closed:
                raise RuntimeError(
                    f"the weight broadcast's thread stopped ({self.stopped}); explorers get no new weights: "
                    "report this with the log, and restart the trainer (or use sync.method: published)"
                )
        self.seconds += time.perf_counter() - start

    def settle(self, n: int) -> None:
        """The worker ended its attempt at push ``n``: release the pushes up to it."""
        with self.cond:
            self.settled = max(self.settled, n)
            self.cond.notify_all()

    def pull(self, engine: RolloutModel, version: int, timeout: float | None = None) -> None:
        raise TypeError("BroadcastSender is the trainer's side: explorers pull with BroadcastReceiver")

    def latest(self) -> int | None:
        with self.cond:
            return None if self.current is None else self.current.version

    def metrics(self) -> dict[str, float]:
        with self.cond:
            return {
                "sync/receivers": float(len(self.members)),
                "sync/broadcast_failures": float(self.failures),
                "sync/regroups": float(self.regroups),
            }

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        """Stop sending and wait (up to 2 s) for the worker to end: an idle one ends at once and tells the
        explorers the trainer finished (they stop joining it); one in a transfer ends within ``timeout``."""
        with self.cond:
            first = not self.closed
            self.closed = True
            self.cond.notify_all()
        if first:
            try:
                self.store.set(CLOSED, "1")
            except Exception as err:  # the store is already gone: nobody can join anyway
                log.debug("weight broadcast: marking %s closed failed: %s", self.address, err)
        if threading.current_thread() is not self._worker:
            self._worker.join(_SETTLE)


class _Coordinator:
    """The trainer's worker thread: notices joiners and failures, forms the group, delivers each push
    down its route. Only this thread touches the group and the fields below."""

    def __init__(self, sender: BroadcastSender) -> None:
        self.s = sender
        self.conn: Any = None
        self.generation = 0
        self.slots: list[int] = []
        """The members' slots in rank order (rank = index + 1)."""
        self.info: dict[int, dict[str, str]] = {}
        """Each named slot's ``name`` and ``host``."""
        self.holds: dict[int, int] = {}
        """The number of the newest push each member holds."""
        self.group: Any = None
        self.next = 0
        """The index of this generation's next message."""
        self.forgotten = 0
        """This generation's messages below this index were deleted from the store."""
        self.unnamed: dict[int, float] = {}
        """Slots taken but not named yet, and since when (a joiner that died meanwhile never is)."""
        self.seen = 0
        self.broken = False
        self.layouts: set[str] = set()

    def run(self) -> None:
        s = self.s
        try:
            on_device(s.device)
            self.conn = _connection(s.store, s.host, s.timeout)
            while True:
                with s.cond:
                    s.cond.wait_for(
                        lambda: s.closed or (s.current is not None and s.current.n > s.settled), _TICK
                    )
                    if s.closed:
                        return
                    push = s.current
                try:
                    self.step(push)
                except Exception as err:  # the store failed us: try again, never leave a push waiting
                    log.warning("weight broadcast: %s: %s; trying again", type(err).__name__, err)
                    self.broken = True
                    time.sleep(1.0)
                if push is not None:
                    s.settle(push.n)
        except BaseException as err:  # a bug: say so in every push from now on, never let one hang
            with s.cond:
                s.stopped = f"{type(err).__name__}: {err}"
                s.cond.notify_all()
            raise
        finally:
            self.finish()

    def step(self, push: _Push | None) -> None:
        """Place joiners and recover from failures (a new generation), then bring every member to ``push``."""
        joiners = self.joiners()
        if (
            self.group is not None
            and not self.broken
            and int(self.conn.add(_key(self.generation, "fail"), 0))
        ):
            self.broken = True  # an explorer reported a failed transfer, or left
        if joiners or self.broken:
            self.regroup(joiners)
        if push is not None and self.group is not None and not self.broken:
            lacking = [slot for slot in self.slots if self.holds.get(slot, 0) < push.n]
            if lacking:
                self.deliver(push, lacking)

    def joiners(self) -> list[int]:
        """Slots named since the last look (a slot unnamed for ``timeout`` is given up)."""
        now, conn = time.monotonic(), self.conn
        joined = int(conn.add(JOINS, 0))
        self.unnamed.update({slot: now for slot in range(self.seen + 1, joined + 1)})
        self.seen = max(self.seen, joined)
        named = []
        for slot, since in list(self.unnamed.items()):
            if conn.check([_slot_key(slot)]):
                self.info[slot] = json.loads(conn.get(_slot_key(slot)))
                named.append(slot)
                del self.unnamed[slot]
            elif now - since > self.s.timeout.total_seconds():
                del self.unnamed[slot]
        return named

    def regroup(self, joiners: list[int]) -> None:
        """End the current generation and form the next from its members and ``joiners`` that answer."""
        s, conn = self.s, self.conn
        self.leave()
        candidates = [c for c in self.slots + joiners if not conn.check([_slot_key(c, "left")])]
        gone = [c for c in self.slots if c not in candidates]
        g = self.generation + 1
        if candidates:
            conn.set(_key(g, "call"), json.dumps(candidates))
            conn.add(GENERATION, 1)
        answered = self.answers(g, candidates)
        lost = [c for c in candidates if c not in answered]
        if lost:
            log.warning(
                "weight broadcast: %s did not answer within %.0fs; going on without %s",
                ", ".join(self.info[c]["name"] for c in lost),
                self.answer_seconds(),
                "it" if len(lost) == 1 else "them",
            )
        members = sorted(answered, key=lambda c: (self.info[c]["host"] != _HOST, self.info[c]["host"], c))
        if candidates:
            conn.set(_key(g, "members"), json.dumps(members))
            self.generation = g
        for c in lost + gone:
            self.holds.pop(c, None)
            self.info.pop(c, None)
        self.slots, self.next, self.forgotten, self.broken = members, 0, 0, False
        with s.cond:
            s.failures += len(lost)
            s.regroups += bool(members)
            s.members = [self.info[c]["name"] for c in members]
        if members and not s.closed:
            self.form(g, len(members) + 1)

    def form(self, g: int, size: int) -> None:
        try:
            self.group = form_group(self.conn, _key(g, "pg"), 0, size, self.s.backend, self.s.timeout)
        except Exception as err:  # one of them died since it answered: the next generation drops it
            log.warning("weight broadcast: forming generation %d failed: %s", g, err)
            self.broken = True

    def answer_seconds(self) -> float:
        return min(ANSWER, self.s.timeout.total_seconds())

    def answers(self, g: int, candidates: list[int]) -> set[int]:
        """The candidates that answered the call of generation ``g`` within :data:`ANSWER` seconds."""
        deadline = time.monotonic() + self.answer_seconds()
        answered: set[int] = set()
        delay = 0.001
        while True:
            answered |= {c for c in candidates if c not in answered and self.conn.check([_key(g, f"ok/{c}")])}
            if len(answered) == len(candidates) or time.monotonic() > deadline or self.s.closed:
                return answered
            time.sleep(delay)
            delay = min(2 * delay, POLL)

    def leave(self) -> None:
        """Tell the members to move on to the next generation, and drop the group (closing its sockets:
        a member waiting on the trainer hears it at once)."""
        if self.group is not None:
            self.message({"regroup": True})
        self.group = None

    def message(self, body: dict[str, Any]) -> int:
        k, self.next = self.next, self.next + 1
        self.conn.set(_key(self.generation, f"m{k}"), json.dumps(body))
        return k

    def deliver(self, push: _Push, lacking: list[int]) -> None:
        """Send ``push`` down the route of the ``lacking`` members and wait for their acknowledgements; a
        failure breaks the generation (the next step forms another)."""
        route = [self.slots.index(c) + 1 for c in lacking]
        k = self.message({"version": push.version, "route": route, "layout": self.layout_id(push.layout)})
        try:
            relay(self.group, push.pieces, None, route[0], self.s.timeout)
            self.acknowledged(k, len(route))
        except Exception as err:
            log.warning(
                "weight broadcast of version %d to %d explorer(s) failed (%s: %s); forming the group again "
                "with those that answer",
                push.version,
                len(route),
                type(err).__name__,
                err,
            )
            self.broken = True
            return
        for c in lacking:
            self.holds[c] = push.n
        if len(lacking) == len(self.slots):  # every member read every message up to k
            self.forget(k)

    def acknowledged(self, k: int, n: int) -> None:
        """Wait until ``n`` explorers acknowledged message ``k``; raises on a reported failure or after
        ``timeout``."""
        g, conn = self.generation, self.conn
        limit = self.s.timeout.total_seconds()
        deadline = time.monotonic() + limit
        delay = 0.0005
        while (acks := int(conn.add(_key(g, f"ack{k}"), 0))) < n:
            if int(conn.add(_key(g, "fail"), 0)):
                raise ConnectionError("an explorer of the route reported a failed transfer")
            if time.monotonic() > deadline or self.s.closed:
                raise TimeoutError(f"{n - acks} of {n} explorers did not acknowledge within {limit:.0f}s")
            time.sleep(delay)
            delay = min(2 * delay, 0.01)

    def forget(self, k: int) -> None:
        """Delete this generation's messages and acknowledgements up to ``k`` (a week of pushes stays small)."""
        for i in range(self.forgotten, k + 1):
            self.conn.delete_key(_key(self.generation, f"m{i}"))
            self.conn.delete_key(_key(self.generation, f"ack{i}"))
        self.forgotten = k + 1

    def layout_id(self, layout: Layout) -> str:
        """The key of ``layout`` in the store, written there the first time."""
        text = layout.to_json()
        ident = hashlib.sha1(text.encode()).hexdigest()[:16]
        if ident not in self.layouts:
            self.conn.set(_slot_key(ident, "layout"), text)
            self.layouts.add(ident)
        return ident

    def finish(self) -> None:
        """Tell members and explorers waiting for a place that the trainer finished; drop the group."""
        try:
            if self.group is not None:
                self.message({"closed": True})
            self.conn.set(_key(self.generation + 1, "call"), json.dumps("closed"))
        except Exception as err:  # the store is gone: the explorers see that too
            log.debug("weight broadcast: announcing the end failed: %s", err)
        self.group = None


@dataclass(frozen=True)
class _Seat:
    """An explorer's place in one generation."""

    generation: int
    rank: int
    size: int
    backend: str
    device: str


class BroadcastReceiver:
    """An explorer's side: joins the trainer's store at ``address`` (``host:port``) as ``name`` and keeps
    receiving versions in a background thread (joining again whenever its place is lost or the trainer
    goes away); :meth:`pull` loads the newest received into the engine. ``find``, when given, says where
    the trainer listens now; it is asked before each join, so a restarted trainer on another port is found.
    """

    def __init__(
        self,
        address: str,
        name: str,
        backend: str = "auto",
        timeout: float = 60.0,
        find: Callable[[], str | None] | None = None,
    ) -> None:
        self.host, self.port = host_port(address)
        if backend != "auto":
            resolve_backend(backend)  # nccl without CUDA fails here, not in the thread
        self.name, self.backend, self.find = name, backend, find
        self.timeout = timedelta(seconds=timeout)
        self.cond = threading.Condition()
        self.received: tuple[int, dict[str, Tensor]] | None = None
        self.error: str | None = None
        self.closed = False
        self.seconds = 0.0
        self._layouts: dict[str, Layout] = {}
        self._thread = threading.Thread(target=self._run, name="trine-broadcast-receive", daemon=True)
        self._thread.start()
        _OPEN.add(self)

    # ----------------------------------------------------------------- background
    def _run(self) -> None:
        import torch.distributed as dist

        while not self.closed:
            try:
                self._follow()
                store = dist.TCPStore(self.host, self.port, is_master=False, timeout=self.timeout)
                while not self.closed:
                    self._take_slot(store)
            except Exception as err:  # the trainer went away, finished or was not up yet: join again
                if self.closed:
                    return
                quiet = isinstance(err, TrainerClosed)  # its run ended: no fault to warn about
                self._failed(f"{type(err).__name__}: {err}".strip(), "joining again", quiet)
                with self.cond:
                    self.cond.wait_for(lambda: self.closed, 1.0)

    def _follow(self) -> None:
        """Take the address ``find`` gives, when it is another one (a restarted trainer)."""
        address = self.find() if self.find is not None else None
        if address is None or address == f"{self.host}:{self.port}":
            return
        host, port = host_port(address)
        log.info("weight broadcast: the trainer now listens at %s (was %s:%d)", address, self.host, self.port)
        with self.cond:
            self.host, self.port = host, port

    def _failed(self, message: str, then: str, quiet: bool = False) -> None:
        repeated = message == self.error
        with self.cond:
            self.error = message  # named by the TimeoutError of wait_for_first / pull
        (log.info if repeated or quiet else log.warning)(
            "weight broadcast from %s:%d: %s; %s", self.host, self.port, message, then
        )

    def _stopped(self) -> bool:
        return self.closed

    def _closed_by_trainer(self) -> TrainerClosed:
        return TrainerClosed(f"the trainer at {self.host}:{self.port} closed its weight broadcast")

    def _take_slot(self, store: Any) -> None:
        """Take a slot and hold places in generations with it; returns when the trainer dropped it."""
        if store.check([CLOSED]):
            raise self._closed_by_trainer()
        backend = agree_backend(self.backend, store.get(BACKEND).decode())
        device = transfer_device(backend)
        on_device(device)
        generation = int(store.add(GENERATION, 0))  # before naming the slot: no later call misses it
        slot = int(store.add(JOINS, 1))
        store.set(_slot_key(slot), json.dumps({"name": self.name, "host": _HOST}))
        while not self.closed:
            placed = self._placement(store, slot, generation)
            if placed is None:
                return
            generation, rank, size = placed
            self._member(store, slot, _Seat(generation, rank, size, backend, device))

    def _placement(self, store: Any, slot: int, after: int) -> tuple[int, int, int] | None:
        """(generation, rank, size) of the first generation after ``after`` that places ``slot``; None
        when closed or when the slot answered too late (it is dropped: take another)."""
        g = after + 1
        while True:
            if not wait_key(store, _key(g, "call"), self._stopped):
                return None
            call = json.loads(store.get(_key(g, "call")))
            if call == "closed":
                raise self._closed_by_trainer()
            if slot in call:
                break
            g += 1
        store.set(_key(g, f"ok/{slot}"), "1")
        limit = self.timeout.total_seconds() + ANSWER
        if not wait_key(store, _key(g, "members"), self._stopped, limit):
            return None
        members = json.loads(store.get(_key(g, "members")))
        return (g, members.index(slot) + 1, len(members) + 1) if slot in members else None

    def _member(self, store: Any, slot: int, seat: _Seat) -> None:
        """Hold ``seat`` until the trainer regroups; a failed transfer is reported to the trainer (which
        forms the next generation) after this explorer's group is gone."""
        failure = None
        try:
            self._serve(store, seat)
        except ConnectionError:
            raise
        except Exception as err:  # only its text is kept: the group it holds must go now
            failure = f"{type(err).__name__}: {err}".strip()
        if self.closed:  # leaving: the trainer regroups at once, without waiting for an answer
            store.set(_slot_key(slot, "left"), "1")
            store.add(_key(seat.generation, "fail"), 1)
        elif failure is not None:
            store.add(_key(seat.generation, "fail"), 1)
            self._failed(failure, f"waiting for generation {seat.generation + 1}")

    def _serve(self, store: Any, seat: _Seat) -> None:
        """Form ``seat``'s group and act on the generation's messages until a regroup (or close)."""
        group = form_group(
            store, _key(seat.generation, "pg"), seat.rank, seat.size, seat.backend, self.timeout
        )
        k = 0
        while wait_key(store, _key(seat.generation, f"m{k}"), self._stopped):
            message = json.loads(store.get(_key(seat.generation, f"m{k}")))
            if "closed" in message:
                raise self._closed_by_trainer()
            if "regroup" in message:
                return
            if seat.rank in message["route"]:
                self._receive(store, group, seat, message)
                store.add(_key(seat.generation, f"ack{k}"), 1)
            k += 1

    def _receive(self, store: Any, group: Any, seat: _Seat, message: dict[str, Any]) -> None:
        """Receive one version from the previous rank of its route, forwarding it to the next."""
        ident = message["layout"]
        if ident not in self._layouts:
            self._layouts[ident] = Layout.from_json(store.get(_slot_key(ident, "layout")).decode())
        layout = self._layouts[ident]
        route = message["route"]
        i = route.index(seat.rank)
        down = route[i + 1] if i + 1 < len(route) else None
        start = time.perf_counter()
        flats = layout.empty(seat.device)
        relay(group, layout.pieces(flats), route[i - 1] if i else 0, down, self.timeout)
        if seat.device != "cpu":  # NCCL's wait() only orders the stream: hold whole versions only
            torch.cuda.synchronize(seat.device)
        with self.cond:
            self.received = (message["version"], layout.unpack(flats))
            self.error = None
            self.seconds += time.perf_counter() - start
            self.cond.notify_all()

    # ----------------------------------------------------------------- explorer side
    def latest(self) -> int | None:
        with self.cond:
            return None if self.received is None else self.received[0]

    def wait_for_first(self, timeout: float | None = None) -> int:
        """Wait until a first version arrived and return it; TimeoutError after ``timeout`` seconds."""
        with self.cond:
            self.cond.wait_for(lambda: self.received is not None or self.closed, timeout)
            if self.received is None:
                raise TimeoutError(
                    f"no weights arrived from the trainer at {self.host}:{self.port} within {timeout}s "
                    "(sync.wait_timeout); is the trainer running, and is that address reachable from here?"
                    + self._last_error()
                )
            return self.received[0]

    def _last_error(self) -> str:
        return f" Last error: {self.error}" if self.error else ""

    def pull(self, engine: RolloutModel, version: int, timeout: float | None = None) -> None:
        """Load the newest received version (>= ``version``, waiting up to ``timeout`` for it)."""
        with self.cond:
            ok = self.cond.wait_for(
                lambda: self.closed or (self.received is not None and self.received[0] >= version), timeout
            )
            if not ok or self.received is None or self.received[0] < version:
                why = "the weight sync was closed" if self.closed else f"within {timeout}s"
                raise TimeoutError(
                    f"weights version {version} did not arrive from {self.host}:{self.port} ({why})"
                    + self._last_error()
                )
            newest, state = self.received
        if engine.policy_version == newest:
            return
        start = time.perf_counter()
        try:
            check_fits(engine, state)
            engine.load_weights(state, newest)
        except (RuntimeError, KeyError) as err:
            raise RuntimeError(
                f"the weights broadcast by the trainer do not fit this explorer's model ({err}); every process "
                "of a run must load the same model.path"
            ) from err
        self.seconds += time.perf_counter() - start

    def push(self, model: nn.Module, version: int) -> None:
        raise TypeError("BroadcastReceiver is an explorer's side: the trainer pushes with BroadcastSender")

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        """Release waiting pulls and end the thread (waiting up to 2 s for it: it ends at once unless it is
        in a transfer, which ends within ``timeout``). The trainer regroups without this explorer."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()
        if threading.current_thread() is not self._thread:
            self._thread.join(_SETTLE)
