"""What ``sync.method: broadcast`` puts on the wire (:mod:`trine.sync.broadcast` says when and to whom).

A version travels as its **layout** (names, dtypes and shapes of the distinct tensors, the aliases of tied
ones, the bucket and piece sizes; JSON, through the trainer's store) and its **buckets**: the tensors
flattened into one buffer per dtype of at most ``bucket_bytes`` (a larger tensor alone), cut into
**pieces** of at most ``piece_bytes``. Pieces move down a **route** of ranks of one process group: the
trainer (rank 0) sends each piece to the first explorer of the route, each explorer forwards it to the next
while it receives the one after (:func:`relay`). The trainer uploads every byte once, whatever the number of
explorers, and with many small pieces the last explorer holds the version about as soon as the first.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch import Tensor, nn

from trine.sync.base import split_aliases

PIECES = 64
"""A version travels in at least this many pieces (when ``bucket_mb`` allows): the last explorer of a route
of n lags the first by n - 1 pieces, so more pieces keep a push flat in the number of explorers (every
receive is posted at once, so a piece costs no round trip)."""
MIN_PIECE = 2**20
"""Pieces are at least this many bytes (1 MiB): smaller ones cost more in calls than they save in lag."""
POLL = 0.02
"""Seconds between two looks at the store while waiting for a key, once the first quick looks found
nothing (the store has no wait that can be interrupted, or ended without a warning in the log)."""


def resolve_backend(backend: str) -> str:
    """``auto``: NCCL where CUDA is available, else gloo."""
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl" and not torch.cuda.is_available():
        raise ValueError(
            "sync.broadcast_backend='nccl' needs CUDA, which this process does not see; use gloo or auto"
        )
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"sync.broadcast_backend={backend!r}: expected auto, gloo or nccl")
    return backend


def agree_backend(own: str, trainer: str) -> str:
    """The backend an explorer uses with a trainer that broadcasts over ``trainer``: the same, whatever
    ``own`` says when it is ``auto``; a ValueError naming both when they differ."""
    if own not in ("auto", trainer):
        raise ValueError(
            f"this explorer's sync.broadcast_backend is {own!r} but the trainer broadcasts over {trainer!r}; "
            "every process of a run must use the same backend: set sync.broadcast_backend the same everywhere "
            "(auto follows the trainer)"
        )
    if trainer == "nccl" and not torch.cuda.is_available():
        raise ValueError(
            "the trainer broadcasts over nccl (its CUDA tensors) but this explorer sees no CUDA; set "
            "sync.broadcast_backend: gloo for the run, or give the explorer a GPU"
        )
    return trainer


def transfer_device(backend: str) -> str:
    """Where a process's tensors travel from: the CPU for gloo, its current CUDA device for NCCL (kept
    for the background threads, which would otherwise start on ``cuda:0``)."""
    return f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"


def on_device(device: str) -> None:
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


# --------------------------------------------------------------------- the layout of a version
def buckets(layout: list, bucket_bytes: int) -> list[list[int]]:
    """Indices of ``layout`` (``[name, dtype, shape]`` rows) grouped into buckets: same dtype, at most
    ``bucket_bytes`` each (a larger tensor alone), in layout order within a dtype."""
    out: list[list[int]] = []
    open_: dict[str, tuple[list[int], int]] = {}
    for i, (_, dtype, shape) in enumerate(layout):
        size = numel(shape) * _dtype(dtype).itemsize
        current, used = open_.get(dtype, ([], 0))
        if current and used + size > bucket_bytes:
            out.append(current)
            current, used = [], 0
        current.append(i)
        open_[dtype] = (current, used + size)
    out += [indices for indices, _ in open_.values() if indices]
    return out


def numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.removeprefix("torch."))


@dataclass(frozen=True)
class Layout:
    """How one version's tensors lie in its buckets and pieces (the same on every process of a route)."""

    tensors: list
    """``[name, dtype, shape]`` of each distinct tensor, in state-dict order."""
    aliases: dict[str, str]
    """``{alias key: key it shares}``: tied tensors travel once."""
    bucket_bytes: int
    piece_bytes: int

    @classmethod
    def of(cls, state: dict[str, Tensor], aliases: dict[str, str], bucket_bytes: int) -> Layout:
        tensors = [[k, str(t.dtype), list(t.shape)] for k, t in state.items()]
        total = sum(t.numel() * t.element_size() for t in state.values())
        piece = min(bucket_bytes, max(MIN_PIECE, total // PIECES))
        return cls(tensors, aliases, bucket_bytes, piece)

    def to_json(self) -> str:
        return json.dumps([self.tensors, self.aliases, self.bucket_bytes, self.piece_bytes])

    @classmethod
    def from_json(cls, text: str) -> Layout:
        return cls(*json.loads(text))

    def buckets(self) -> list[list[int]]:
        return buckets(self.tensors, self.bucket_bytes)

    def empty(self, device: str) -> list[Tensor]:
        """Uninitialized buckets to receive a version into."""
        return [
            torch.empty(
                sum(numel(self.tensors[i][2]) for i in b), dtype=_dtype(self.tensors[b[0]][1]), device=device
            )
            for b in self.buckets()
        ]

    def pieces(self, flats: list[Tensor]) -> list[Tensor]:
        """Views of ``flats`` (contiguous slices) of at most ``piece_bytes`` each, in travel order."""
        return [p for flat in flats for p in flat.split(max(1, self.piece_bytes // flat.element_size()))]

    def unpack(self, flats: list[Tensor]) -> dict[str, Tensor]:
        """The state dict held in ``flats`` (views of them), aliases included, in layout order."""
        state: dict[str, Tensor] = {}
        for flat, indices in zip(flats, self.buckets()):
            offset = 0
            for i in indices:
                name, _, shape = self.tensors[i]
                n = numel(shape)
                state[name] = flat[offset : offset + n].view(shape)
                offset += n
        state = {row[0]: state[row[0]] for row in self.tensors}
        state.update({alias: state[key] for alias, key in self.aliases.items()})
        return state


def pack(model: nn.Module, bucket_bytes: int, device: str) -> tuple[Layout, list[Tensor]]:
    """``model``'s rollout weights as a layout and its buckets: a copy (``torch.cat`` always copies) on
    ``device``, so the trainer may step on while they travel; a tied tensor travels once."""
    distinct, aliases = split_aliases(rollout_state(model))
    state = {k: t.detach() for k, t in distinct.items()}
    layout = Layout.of(state, aliases, bucket_bytes)
    tensors = list(state.values())
    flats = [torch.cat([tensors[i].reshape(-1).to(device) for i in b]) for b in layout.buckets()]
    return layout, flats


# --------------------------------------------------------------------- groups and routes
def form_group(store: Any, prefix: str, rank: int, size: int, backend: str, timeout: timedelta) -> Any:
    """A process group of ``size`` ranks under ``prefix`` of ``store``; raises when a rank does not come
    within ``timeout``."""
    import torch.distributed as dist

    scoped = dist.PrefixStore(prefix, store)
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        # NCCL's watchdog ends the whole process when an operation times out, unless told to only abort
        # the group's communicators: a dead explorer must cost the trainer this group, not its run. The
        # group reads the setting when it is built; a value the user set is kept. (Untested: no 2-GPU box.)
        unset = "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in os.environ
        if unset:
            os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"  # CleanUpOnly
        try:
            return dist.ProcessGroupNCCL(scoped, rank, size, options)
        finally:
            if unset:
                del os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"]
    return dist.ProcessGroupGloo(scoped, rank, size, timeout)


def relay(group: Any, pieces: list[Tensor], up: int | None, down: int | None, timeout: timedelta) -> None:
    """Receive ``pieces`` in order from rank ``up`` (None: this rank has them) and send each to rank
    ``down`` (None: the end of the route) as soon as it arrived, while the next one arrives. Every wait is
    bounded by ``timeout``; a dead or stuck neighbour raises (gloo closes the pair that timed out)."""
    receives = [group.recv([piece], up, tag) for tag, piece in enumerate(pieces)] if up is not None else []
    sends = []
    for tag, piece in enumerate(pieces):  # every receive is posted: the previous rank never waits for one
        if receives:
            receives[tag].wait(timeout)
        if down is not None:
            sends.append(group.send([piece], down, tag))
    for work in sends:
        work.wait(timeout)


def wait_key(store: Any, key: str, stop: Callable[[], bool], timeout: float | None = None) -> bool:
    """Wait until ``key`` is in ``store``: True; False as soon as ``stop()``; TimeoutError after
    ``timeout`` seconds (None: no limit). Looks often at first, then every :data:`POLL` seconds."""
    deadline = None if timeout is None else time.monotonic() + timeout
    delay = 0.001
    while not store.check([key]):
        if stop():
            return False
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{key} did not appear in the trainer's store within {timeout:.0f}s")
        time.sleep(delay)
        delay = min(2 * delay, POLL)
    return True
