"""Weight sync by collective broadcast (``sync.method: broadcast``): one trainer process sends each new
version to any number of explorer processes over ``torch.distributed`` (gloo on CPU, NCCL on CUDA).

The trainer (:class:`BroadcastSender`) hosts a ``TCPStore`` at ``host:port``. An explorer
(:class:`BroadcastReceiver`) connects to it, takes a slot, and the two build a **process group of their
own** (two ranks: trainer 0, explorer 1) under the slot's prefix of the store. So an explorer that dies
breaks only its own channel (the trainer counts it and goes on), and one that (re)joins gets a new channel
and at once the newest version the trainer pushed: it never waits for the next training step.

On a channel, the trainer first sends a one-number hello (so that NCCL forms its communicator while both
ends are there, not at the first version), then the *layout* (names, dtypes, shapes of the tensors, and the
aliases of tied tensors, which travel once; as a byte tensor), then for each version a header ``[version, layout bytes or 0]`` and the tensors flattened into
buckets of at most ``bucket_mb`` MB per dtype (:func:`buckets`); a tensor larger than a bucket goes alone.
``push`` returns once every live explorer holds the version (or its channel failed, within ``timeout``
seconds); the explorer keeps receiving in a background thread and :meth:`BroadcastReceiver.pull` loads the
newest version received into its engine between batches.

Without a network path from explorers to the trainer, use ``sync.method: published`` (the run directory).
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
import time
import weakref
from datetime import timedelta
from typing import Any

import torch
from torch import Tensor, nn

from trine.models.protocol import RolloutModel
from trine.sync.base import check_fits, split_aliases

log = logging.getLogger("trine")
JOINS = "trine/joins"
CLOSED = "trine/closed"
"""Set in the store by :meth:`BroadcastSender.close`: explorers stop joining a trainer that has finished."""
_FOREVER = timedelta(days=7)
"""A receiver waits this long for the next version (trainer steps may take hours; a dead trainer closes
the connection at once). Joining, and every transfer once a version started, take at most ``timeout``."""
_SETTLE = 2.0
"""``close()`` waits up to this many seconds for its threads to end (see :func:`_close_at_exit`)."""
_OPEN: weakref.WeakSet = weakref.WeakSet()
"""Senders and receivers of this process, closed at exit."""


@atexit.register
def _close_at_exit() -> None:
    """Close every sender and receiver before the interpreter finalizes: a thread still destroying a
    gloo group while it does aborts the process ("terminate called without an active exception")."""
    for side in list(_OPEN):
        side.close()


def resolve_backend(backend: str) -> str:
    """``auto``: NCCL where CUDA is available, else gloo."""
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError(
            "sync.broadcast_backend='nccl' needs CUDA, which this process does not see; use gloo or auto"
        )
    return backend


def transfer_device(backend: str) -> str:
    """Where a process's tensors travel from: the CPU for gloo, its current CUDA device for NCCL (kept
    for the background threads, which would otherwise start on ``cuda:0``)."""
    return f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"


def _on(device: str) -> None:
    """Make ``device`` the current CUDA device of the calling thread (nothing for the CPU)."""
    if device.startswith("cuda"):
        torch.cuda.set_device(device)


def rollout_state(model: nn.Module) -> dict[str, Tensor]:
    """The weights a rollout engine loads (:func:`trine.models.export.rollout_state_dict` where it exists)."""
    try:
        from trine.models.export import rollout_state_dict
    except ImportError:
        return {k: v.detach() for k, v in model.state_dict().items()}
    return rollout_state_dict(model)


def buckets(layout: list[tuple[str, str, list[int]]], bucket_bytes: int) -> list[list[int]]:
    """Indices of ``layout`` grouped into buckets: same dtype, at most ``bucket_bytes`` each (a larger
    tensor alone), in layout order within a dtype."""
    out: list[list[int]] = []
    open_: dict[str, tuple[list[int], int]] = {}
    for i, (_, dtype, shape) in enumerate(layout):
        size = _numel(shape) * torch.empty((), dtype=_dtype(dtype)).element_size()
        current, used = open_.get(dtype, ([], 0))
        if current and used + size > bucket_bytes:
            out.append(current)
            current, used = [], 0
        current.append(i)
        open_[dtype] = (current, used + size)
    out += [indices for indices, _ in open_.values() if indices]
    return out


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


def _group(store: Any, prefix: str, rank: int, backend: str, timeout: timedelta) -> Any:
    import torch.distributed as dist

    scoped = dist.PrefixStore(prefix, store)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(scoped, rank, 2, options)
    return dist.ProcessGroupGloo(scoped, rank, 2, timeout)


def _broadcast(group: Any, tensor: Tensor, timeout: timedelta | None = None) -> None:
    """Broadcast ``tensor`` from rank 0 of ``group``; ``timeout`` (None: the group's) bounds this one."""
    import torch.distributed as dist

    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    if timeout is not None:
        opts.timeout = timeout
    group.broadcast([tensor], opts).wait()


def _connection(store: Any, host: str, timeout: timedelta) -> Any:
    """A client connection of its own to ``store`` (a TCPStore serializes the calls on one connection: a
    joiner that died before finishing would otherwise hold every other join for ``timeout``)."""
    import torch.distributed as dist

    if hasattr(store, "clone"):  # torch >= 2.5
        return store.clone()
    return dist.TCPStore(host, store.port, is_master=False, timeout=timeout)


class _Channel:
    """The trainer's end of one explorer's process group, with its own sender thread."""

    def __init__(self, sender: BroadcastSender, slot: int) -> None:
        self.sender, self.slot = sender, slot
        self.name = "?"
        self.joined = False
        self.sent = -1
        self.layout_sent: str | None = None
        self.alive = True
        self.thread = threading.Thread(target=self._run, name=f"trine-broadcast-{slot}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        s = self.sender
        failed = False
        try:
            if s.closed:
                return
            _on(s.device)
            store = _connection(s.store, s.host, s.timeout)
            self.name = store.get(f"trine/join/{self.slot}").decode()
            group = _group(store, f"trine/ch/{self.slot}", 0, s.backend, s.timeout)
            _broadcast(group, torch.ones(1, dtype=torch.int64, device=s.device))  # hello
            self.joined = True
            while not s.closed:
                with s.cond:
                    s.cond.wait_for(lambda: s.closed or (s.current is not None and s.current[0] > self.sent))
                    if s.closed:
                        return
                    version, layout, tensors = s.current  # type: ignore[misc]
                self._send(group, version, layout, tensors)
                with s.cond:
                    self.sent = version
                    s.cond.notify_all()
        except Exception as err:  # a dead or hung explorer: only its channel ends
            failed = not s.closed
            if failed:
                log.warning("weight broadcast to %s (slot %d) failed: %s", self.name, self.slot, err)
        finally:
            with s.cond:
                self.alive = False
                s.failures += failed
                s.cond.notify_all()

    def _send(self, group: Any, version: int, layout: str, flats: list[Tensor]) -> None:
        device = self.sender.device
        encoded = b"" if layout == self.layout_sent else layout.encode()
        _broadcast(group, torch.tensor([version, len(encoded)], dtype=torch.int64, device=device))
        if encoded:
            _broadcast(group, torch.frombuffer(bytearray(encoded), dtype=torch.uint8).to(device))
            self.layout_sent = layout
        for flat in flats:
            _broadcast(group, flat)


class BroadcastSender:
    """The trainer's side: hosts the rendezvous store at ``host:port`` (port 0: a free one; ``address``
    says which) and sends every pushed version to every joined explorer (see the module docstring)."""

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
        self.store.add(JOINS, 0)
        self.cond = threading.Condition()
        self.current: tuple[int, str, list[Tensor]] | None = None
        """The newest pushed version: (version, layout as JSON, its buckets flattened, ready to send)."""
        self.channels: list[_Channel] = []
        self.failures = 0
        self.closed = False
        self.seconds = 0.0
        self._acceptor = threading.Thread(target=self._accept, name="trine-broadcast-accept", daemon=True)
        self._acceptor.start()
        _OPEN.add(self)

    def _accept(self) -> None:
        seen = 0
        while not self.closed:
            try:
                joined = int(self.store.add(JOINS, 0))
            except Exception:  # the store is gone (closing)
                return
            for slot in range(seen + 1, joined + 1):
                with self.cond:
                    self.channels.append(_Channel(self, slot))
            seen = max(seen, joined)
            time.sleep(0.05)

    def push(self, model: nn.Module, version: int) -> None:
        """Send ``model``'s weights as ``version`` to every live explorer; returns when each holds it or
        its channel failed (a failure costs only that explorer, counted in ``sync/broadcast_failures``)."""
        start = time.perf_counter()
        distinct, aliases = split_aliases(rollout_state(model))  # a tied embedding travels once
        tensors = [t.detach() for t in distinct.values()]
        tensors_layout = [[k, str(t.dtype), list(t.shape)] for k, t in zip(distinct, tensors)]
        layout = json.dumps(
            {"bucket_bytes": self.bucket_bytes, "tensors": tensors_layout, "aliases": aliases}
        )
        # one copy (torch.cat always copies), shared by every channel: the trainer may step on at once
        flats = [
            torch.cat([tensors[i].reshape(-1).to(self.device) for i in indices])
            for indices in buckets(tensors_layout, self.bucket_bytes)
        ]
        with self.cond:
            self.current = (version, layout, flats)
            self.cond.notify_all()
            self.cond.wait_for(lambda: all(c.sent >= version or not c.alive for c in self._ready()))
        self.seconds += time.perf_counter() - start

    def _ready(self) -> list[_Channel]:
        """Channels that finished joining (a channel still forming its group does not hold up a push)."""
        return [c for c in self.channels if c.joined]

    def pull(self, engine: RolloutModel, version: int, timeout: float | None = None) -> None:
        raise TypeError("BroadcastSender is the trainer's side: explorers pull with BroadcastReceiver")

    def latest(self) -> int | None:
        with self.cond:
            return None if self.current is None else self.current[0]

    def metrics(self) -> dict[str, float]:
        with self.cond:
            live = sum(c.alive for c in self.channels)
        return {"sync/receivers": float(live), "sync/broadcast_failures": float(self.failures)}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        """Stop accepting and sending, and wait (up to 2 s) for the channels to end: idle ones end at
        once, closing their connections; one in a transfer ends within ``timeout``. Explorers that try
        to join again are told the trainer finished."""
        with self.cond:
            first = not self.closed
            self.closed = True
            self.cond.notify_all()
        if first:
            try:
                self.store.set(CLOSED, "1")
            except Exception as err:  # the store is already gone: nobody can join anyway
                log.debug("weight broadcast: marking %s closed failed: %s", self.address, err)
        deadline = time.monotonic() + _SETTLE
        self._acceptor.join(_SETTLE)  # first: it starts no channel after this
        for channel in list(self.channels):
            channel.thread.join(max(0.0, deadline - time.monotonic()))


class BroadcastReceiver:
    """An explorer's side: joins the trainer's store at ``address`` (``host:port``) as ``name`` and keeps
    receiving versions in a background thread (reconnecting if the trainer goes away); :meth:`pull` loads
    the newest received into the engine."""

    def __init__(self, address: str, name: str, backend: str = "auto", timeout: float = 60.0) -> None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"sync.address={address!r}: expected host:port, e.g. 10.0.0.1:29600")
        self.host, self.port, self.name = host, int(port), name
        self.backend = resolve_backend(backend)
        self.device = transfer_device(self.backend)
        self.timeout = timedelta(seconds=timeout)
        self.cond = threading.Condition()
        self.received: tuple[int, dict[str, Tensor]] | None = None
        self.error: str | None = None
        self.closed = False
        self.seconds = 0.0
        self._parked = False
        """The thread waits for the trainer's next version (it cannot be woken: close leaves it there)."""
        self._thread = threading.Thread(target=self._run, name="trine-broadcast-receive", daemon=True)
        self._thread.start()
        _OPEN.add(self)

    # ----------------------------------------------------------------- background
    def _run(self) -> None:
        _on(self.device)
        while not self.closed:
            try:
                self._receive_all(self._join())
            except Exception as err:  # the trainer went away or was not up yet: join again
                if self.closed:
                    return
                message = f"{type(err).__name__}: {err}".strip()
                repeated = message == self.error
                with self.cond:
                    self.error = message  # named by the TimeoutError of wait_for_first / pull
                    self.cond.wait_for(lambda: self.closed, 1.0)
                (log.info if repeated else log.warning)(
                    "weight broadcast from %s:%d: %s; joining again", self.host, self.port, message
                )

    def _join(self) -> Any:
        """Take a slot in the trainer's store and form this explorer's group with it (within ``timeout``)."""
        import torch.distributed as dist

        store = dist.TCPStore(self.host, self.port, is_master=False, timeout=self.timeout)
        if store.check([CLOSED]):
            raise ConnectionError(f"the trainer at {self.host}:{self.port} closed its weight broadcast")
        slot = int(store.add(JOINS, 1))
        store.set(f"trine/join/{slot}", self.name)
        group = _group(store, f"trine/ch/{slot}", 1, self.backend, self.timeout)
        _broadcast(group, torch.zeros(1, dtype=torch.int64, device=self.device))  # the trainer's hello
        return group

    def _receive_all(self, group: Any) -> None:
        device = self.device
        layout: list[tuple[str, str, list[int]]] = []
        aliases: dict[str, str] = {}
        bucket_bytes = 1
        while True:
            header = torch.zeros(2, dtype=torch.int64, device=device)
            with self.cond:
                if self.closed:
                    return
                self._parked = True
            try:
                _broadcast(group, header, _FOREVER)  # the next version may be hours away
            finally:
                with self.cond:
                    self._parked = False
            version, size = int(header[0]), int(header[1])
            start = time.perf_counter()
            if size:
                raw = torch.zeros(size, dtype=torch.uint8, device=device)
                _broadcast(group, raw)
                message = json.loads(raw.cpu().numpy().tobytes().decode())
                layout, bucket_bytes = message["tensors"], message["bucket_bytes"]
                aliases = message.get("aliases", {})
            state: dict[str, Tensor] = {}
            for indices in buckets(layout, bucket_bytes):
                self._receive_bucket(group, layout, indices, state, device)
            state.update({alias: state[key] for alias, key in aliases.items()})
            if device != "cpu":  # NCCL's wait() only orders the stream: hold whole versions only
                torch.cuda.synchronize(device)
            with self.cond:
                self.received = (version, state)
                self.error = None
                self.seconds += time.perf_counter() - start
                self.cond.notify_all()

    def _receive_bucket(
        self, group: Any, layout: list, indices: list[int], state: dict[str, Tensor], device: str
    ) -> None:
        dtype = _dtype(layout[indices[0]][1])
        flat = torch.empty(sum(_numel(layout[i][2]) for i in indices), dtype=dtype, device=device)
        _broadcast(group, flat)
        offset = 0
        for i in indices:
            name, _, shape = layout[i]
            n = _numel(shape)
            state[name] = flat[offset : offset + n].view(shape)
            offset += n

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
        """Release waiting pulls and end the thread (waiting up to 2 s for it). A thread waiting for the
        trainer's next version cannot be woken: it ends when the version arrives or the trainer closes."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()
            parked = self._parked
        if not parked and threading.current_thread() is not self._thread:
            self._thread.join(_SETTLE)
