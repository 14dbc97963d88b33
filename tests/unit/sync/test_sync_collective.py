"""The wire of ``sync.method: broadcast`` (:mod:`trine.sync.collective`): buckets, the layout of a version and
its pieces, the relay of pieces down a route (three gloo ranks in threads of this process), the backend an
explorer agrees on, and waiting for a store key."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from trine.sync.collective import (
    MIN_PIECE,
    PIECES,
    Layout,
    agree_backend,
    buckets,
    form_group,
    pack,
    relay,
    resolve_backend,
    wait_key,
)

TIMEOUT = timedelta(seconds=20)


def test_buckets_group_by_dtype_within_the_size_limit():
    layout = [["a", "torch.float32", [10]], ["b", "torch.bfloat16", [4]], ["c", "torch.float32", [20]]]
    layout += [["d", "torch.float32", [100]], ["e", "torch.float32", [5]]]
    # 100 bytes: a (40) + c (80) overflow; d (400) alone however large; b is its own dtype
    assert buckets(layout, 100) == [[0], [2], [3], [4], [1]]
    assert buckets(layout, 10_000) == [[0, 2, 3, 4], [1]]


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(3000, 256)
        self.mid = torch.nn.Linear(256, 256).to(torch.bfloat16)
        self.head = torch.nn.Linear(256, 3000, bias=False)
        self.head.weight = self.embed.weight


def test_a_packed_version_unpacks_to_the_same_tensors_and_a_tied_one_travels_once():
    model = _Tied()
    layout, flats = pack(model, bucket_bytes=2**20, device="cpu")
    assert layout.aliases == {"head.weight": "embed.weight"}
    assert [name for name, _, _ in layout.tensors] == ["embed.weight", "mid.weight", "mid.bias"]
    assert len(flats) == 2 and {f.dtype for f in flats} == {torch.float32, torch.bfloat16}
    assert flats[0].data_ptr() != model.embed.weight.data_ptr()  # a copy: the trainer steps on meanwhile

    again = Layout.from_json(layout.to_json())
    assert again == layout
    received = again.empty("cpu")
    for source, target in zip(layout.pieces(flats), again.pieces(received)):
        target.copy_(source)
    state = again.unpack(received)
    assert list(state) == ["embed.weight", "mid.weight", "mid.bias", "head.weight"]
    for key, value in model.state_dict().items():
        assert torch.equal(state[key], value), key
    assert state["head.weight"].data_ptr() == state["embed.weight"].data_ptr()


def test_pieces_are_small_enough_to_pipeline_and_large_enough_to_be_cheap():
    model = torch.nn.Linear(4096, 4096)  # 64 MiB + 16 KiB
    layout, flats = pack(model, bucket_bytes=64 * 2**20, device="cpu")
    assert layout.piece_bytes == (4096 * 4096 + 4096) * 4 // PIECES
    pieces = layout.pieces(flats)
    assert len(pieces) >= PIECES and all(p.numel() * 4 <= layout.piece_bytes for p in pieces)
    assert all(p.is_contiguous() for p in pieces)
    assert sum(p.numel() for p in pieces) == sum(f.numel() for f in flats)
    assert pack(model, bucket_bytes=2**19, device="cpu")[0].piece_bytes == 2**19  # bucket_mb caps pieces
    assert pack(torch.nn.Linear(64, 64), bucket_bytes=2**26, device="cpu")[0].piece_bytes == MIN_PIECE


def test_relay_moves_every_piece_down_a_route_once(monkeypatch):
    """Ranks 0 → 2 → 1 in three threads: rank 0 sends to rank 2 only, which forwards to rank 1."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    source = [torch.arange(10_000, dtype=torch.float32), torch.arange(300, dtype=torch.int64)]
    layout = Layout([["a", "torch.float32", [10_000]], ["b", "torch.int64", [300]]], {}, 2**20, 4096)
    sent: list[tuple[int, int]] = []  # (rank, peer) of every send
    received: dict[int, list[torch.Tensor]] = {}
    errors: list[BaseException] = []

    def rank(r: int, up: int | None, down: int | None) -> None:
        try:
            group = form_group(store.clone(), "relay", r, 3, "gloo", TIMEOUT)
            real_send = group.send
            flats = source if r == 0 else layout.empty("cpu")

            class Counting:  # the group, counting whom each piece is sent to
                def send(self, tensors, peer, tag):
                    sent.append((r, peer))
                    return real_send(tensors, peer, tag)

                def recv(self, tensors, peer, tag):
                    return group.recv(tensors, peer, tag)

            relay(Counting(), layout.pieces(flats), up, down, TIMEOUT)
            received[r] = flats
        except BaseException as err:  # reported by the test
            errors.append(err)

    threads = [threading.Thread(target=rank, args=a) for a in ((0, None, 2), (2, 0, 1), (1, 2, None))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    pieces = len(layout.pieces(source))
    assert pieces == 11  # 40,000 bytes in 4 KiB pieces (10) + the int64 bucket
    assert sorted(sent) == [(0, 2)] * pieces + [(2, 1)] * pieces
    for r in (1, 2):
        assert all(torch.equal(a, b) for a, b in zip(received[r], source))


def test_an_explorer_follows_the_trainers_backend():
    assert agree_backend("auto", "gloo") == "gloo"
    assert agree_backend("gloo", "gloo") == "gloo"
    with pytest.raises(ValueError, match="this explorer's sync.broadcast_backend is 'gloo' but the trainer"):
        agree_backend("gloo", "nccl")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="broadcasts over nccl.*sees no CUDA.*gloo"):
            agree_backend("auto", "nccl")
        with pytest.raises(ValueError, match="needs CUDA.*use gloo or auto"):
            resolve_backend("nccl")
        assert resolve_backend("auto") == "gloo"


def test_wait_key_returns_on_the_key_on_stop_or_raises_after_its_timeout():
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=TIMEOUT)
    threading.Timer(0.1, lambda: store.set("k", "1")).start()
    assert wait_key(store.clone(), "k", lambda: False, timeout=10)
    assert not wait_key(store, "never", lambda: True)
    with pytest.raises(TimeoutError, match="never did not appear"):
        wait_key(store, "never", lambda: False, timeout=0.2)
