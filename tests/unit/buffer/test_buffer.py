"""MemoryBuffer: FIFO order, blocking get with timeout, pending rewards, staleness, state; Experience.check."""

from __future__ import annotations

import threading
import time

import pytest

from tests.helpers import exp, ids
from trine.buffer import STORAGES, Buffer, BufferTimeout, MemoryBuffer
from trine.types import Experience


def test_memory_buffer_is_the_builtin_and_follows_the_protocol():
    assert STORAGES["memory"] is MemoryBuffer
    assert isinstance(MemoryBuffer(), Buffer)


def test_put_get_is_fifo():
    buf = MemoryBuffer()
    buf.put([exp(0), exp(1), exp(2)])
    buf.put([exp(3)])
    assert ids(buf.get(2)) == [0, 1]
    assert ids(buf.get(2, timeout=0)) == [2, 3]
    assert len(buf) == 0 and buf.consumed == 4


def test_get_blocks_until_a_producer_puts_enough():
    buf = MemoryBuffer()
    buf.put([exp(0)])

    def producer():
        time.sleep(0.15)
        buf.put([exp(1), exp(2)])

    thread = threading.Thread(target=producer)
    start = time.monotonic()
    thread.start()
    got = buf.get(3, timeout=5.0)
    thread.join()
    assert ids(got) == [0, 1, 2]
    assert 0.1 < time.monotonic() - start < 4.0


def test_get_times_out_without_consuming_anything():
    buf = MemoryBuffer()
    buf.put([exp(0), exp(1), exp(2, reward=None)])
    start = time.monotonic()
    with pytest.raises(BufferTimeout) as info:
        buf.get(3, timeout=0.2)
    assert time.monotonic() - start >= 0.19
    assert "2 of 3" in str(info.value) and "1 pending" in str(info.value)
    assert len(buf) == 2 and buf.consumed == 0
    assert ids(buf.get(2, timeout=0)) == [0, 1]


def test_pending_rewards_are_held_back_until_set():
    buf = MemoryBuffer()
    pending = exp(0, reward=None)
    buf.put([pending, exp(1)])
    assert buf.metrics()["buffer/pending"] == 1.0 and buf.metrics()["buffer/size"] == 1.0
    assert ids(buf.get(1, timeout=0)) == [1]
    with pytest.raises(BufferTimeout):
        buf.get(1, timeout=0.05)
    assert buf.set_rewards({pending.id: 0.5, "unknown-id": 1.0}) == 1
    (got,) = buf.get(1, timeout=0)
    assert got.id == pending.id and got.reward == 0.5
    assert buf.metrics()["buffer/pending"] == 0.0


def test_set_rewards_wakes_a_waiting_get():
    buf = MemoryBuffer()
    pending = exp(0, reward=None)
    buf.put([pending])
    timer = threading.Timer(0.1, buf.set_rewards, args=({pending.id: 1.0},))
    timer.start()
    assert ids(buf.get(1, timeout=5.0)) == [0]
    timer.join()


def test_min_version_drops_stale_and_counts_them():
    buf = MemoryBuffer()
    buf.put([exp(0, version=0), exp(1, version=1), exp(2, version=0), exp(3, version=2), exp(4, version=1)])
    assert ids(buf.get(2, min_version=1, timeout=0)) == [1, 3]
    assert buf.dropped_stale == 2
    assert buf.metrics()["buffer/dropped_stale"] == 2.0
    assert ids(buf.get(1, timeout=0)) == [4]


def test_a_late_reward_on_an_old_version_is_still_dropped_as_stale():
    buf = MemoryBuffer()
    old = exp(0, reward=None, version=0)
    buf.put([old, exp(1, version=1)])
    buf.set_rewards({old.id: 1.0})  # the old-version experience becomes ready behind a newer one
    buf.put([exp(2, version=1)])
    assert ids(buf.get(2, min_version=1, timeout=0)) == [1, 2]
    assert buf.dropped_stale == 1 and len(buf) == 0


def test_capacity_evicts_the_oldest():
    buf = MemoryBuffer(capacity=2)
    buf.put([exp(0), exp(1), exp(2)])
    assert ids(buf.get(2, timeout=0)) == [1, 2]


def test_state_dict_round_trip():
    buf = MemoryBuffer()
    pending = exp(9, reward=None)
    buf.put([exp(0, version=0), exp(1, version=0), exp(2, version=3), pending, exp(3, version=4)])
    assert ids(buf.get(1, min_version=1)) == [2]  # drops 0 and 1 as stale
    state = buf.state_dict()

    other = MemoryBuffer()
    other.load_state_dict(state)
    assert (
        other.metrics()
        == buf.metrics()
        == {"buffer/size": 1.0, "buffer/pending": 1.0, "buffer/dropped_stale": 2.0}
    )
    assert other.consumed == buf.consumed == 1
    assert other.get(1, timeout=0)[0].to_dict() == buf.get(1, timeout=0)[0].to_dict()
    assert other.set_rewards({pending.id: 2.0}) == 1
    assert other.get(1, timeout=0)[0].to_dict() == {**pending.to_dict(), "reward": 2.0}


def test_closed_buffer_releases_a_waiting_get():
    buf = MemoryBuffer()
    threading.Timer(0.05, buf.close).start()
    with pytest.raises(BufferTimeout, match="closed"):
        buf.get(1, timeout=5.0)


def test_bad_arguments_and_bad_experiences_are_rejected():
    buf = MemoryBuffer()
    with pytest.raises(ValueError, match="n=0"):
        buf.get(0)
    bad = exp(0)
    bad.action_mask = [1]
    with pytest.raises(ValueError, match="action_mask has 1 entries but the response has 2"):
        buf.put([exp(1), bad])
    assert len(buf) == 0  # nothing of a bad batch is stored


def test_experience_check_errors():
    good = exp(0, tokens=[1, 2, 3, 4], prompt_length=2, logprobs=[-0.5, -0.25])
    good.check()
    cases = [
        ({"prompt_length": 5}, "prompt_length=5 does not fit 4 tokens"),
        ({"prompt_length": -1}, "prompt_length=-1"),
        ({"action_mask": [1, 1, 1]}, "action_mask has 3 entries"),
        ({"logprobs": [-1.0]}, "logprobs has 1 entries"),
        ({"kind": "dpo"}, "kind='dpo'"),
    ]
    for changes, message in cases:
        data = {**good.to_dict(), **changes}
        with pytest.raises(ValueError, match=message.replace("[", r"\[")):
            Experience.from_dict(data).check()
    Experience(tokens=[1, 2], prompt_length=2).check()  # empty response with no logprobs is fine
