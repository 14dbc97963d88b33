"""The one pacing rule of mode async (:class:`trine.explorer.pacing.Pacing`), by hand-computed cases of
``admit iff trainer_at + (rows_queued + tasks_in_flight × rows_per_task) // batch_rows - version <=
max_staleness``."""

from __future__ import annotations

import pytest

from trine.explorer.pacing import Pacing, rows_queued

BOUND_1 = Pacing(max_staleness=1, batch_rows=16, rows_per_task=4)  # 4 tasks × 4 samples per step
BOUND_0 = Pacing(max_staleness=0, batch_rows=16, rows_per_task=4)


def test_the_issue_deadlock_12_rows_queued_of_16_is_no_extra_step():
    """Trainer at v3 waits for 16 rows, 12 are queued (4 dropped stale), nothing in flight: old rule
    ceil(12/16) = 1 queued step + a deferred task's step = 2 > 1 refused it for good; 12 // 16 = 0 admits."""
    assert BOUND_1.batches_ahead(rows_queued=12) == 0
    assert BOUND_1.admits(version=3, trainer_at=3, rows_queued=12)
    # one task in flight: 16 // 16 = 1, 3 + 1 - 3 = 1
    assert BOUND_1.admits(version=3, trainer_at=3, rows_queued=12, tasks_in_flight=1)
    assert not BOUND_1.admits(version=3, trainer_at=3, rows_queued=12, tasks_in_flight=5)  # 32 // 16 = 2


def test_whole_batches_count_as_steps_as_they_always_did():
    # one whole batch queued: lands in batch 1, trained at v1 with v0 weights: staleness 1
    assert BOUND_1.admits(version=0, trainer_at=0, rows_queued=16)
    assert not BOUND_0.admits(version=0, trainer_at=0, rows_queued=16)
    # two whole batches queued: staleness 2
    assert not BOUND_1.admits(version=0, trainer_at=0, rows_queued=32)
    # one batch queued and a whole batch of tasks (4) in flight: (16 + 16) // 16 = 2
    assert not BOUND_1.admits(version=0, trainer_at=0, rows_queued=16, tasks_in_flight=4)
    # the 4th task of a batch still lands in batch 0: (0 + 3 × 4) // 16 = 0
    assert BOUND_0.admits(version=0, trainer_at=0, rows_queued=0, tasks_in_flight=3)
    assert not BOUND_0.admits(version=0, trainer_at=0, rows_queued=0, tasks_in_flight=4)


def test_a_step_in_flight_and_older_weights_count():
    # the trainer steps (v2 -> v3): its next get is at 3; weights v2 and nothing queued: 3 + 0 - 2 = 1
    assert BOUND_1.admits(version=2, trainer_at=3, rows_queued=0)
    assert not BOUND_0.admits(version=2, trainer_at=3, rows_queued=0)
    # newer weights than the trainer's (never in practice) only make it easier
    assert BOUND_0.admits(version=4, trainer_at=3, rows_queued=16)


def test_a_filter_that_dropped_rows_leaves_a_batch_to_fill():
    """A filter kept 12 of 16 rows, ``max_staleness: 0``: old ceil(12/16) = 1 > 0 refused for good."""
    assert BOUND_0.admits(version=0, trainer_at=0, rows_queued=12)  # 12 // 16 = 0
    assert not BOUND_0.admits(version=0, trainer_at=0, rows_queued=12, tasks_in_flight=1)  # 16 // 16 = 1


def test_pending_rows_count_until_they_expire():
    """12 ready + 4 pending a reward that never comes (``max_staleness: 0``): held back while the 4 wait
    (they may still be trained), admitted once ``pending_timeout`` dropped them (old: ceil(12/16) = 1)."""
    assert not BOUND_0.admits(version=0, trainer_at=0, rows_queued=12 + 4)
    assert BOUND_0.admits(version=0, trainer_at=0, rows_queued=12)


def test_trainer_batches_of_another_size_count_in_their_own_rows():
    half = Pacing(max_staleness=1, batch_rows=8, rows_per_task=4)  # trainer.batch_size 8: 2 tasks a step
    assert half.batches_ahead(rows_queued=8, tasks_in_flight=1) == 1
    assert half.admits(version=0, trainer_at=0, rows_queued=8, tasks_in_flight=1)
    assert not half.admits(version=0, trainer_at=0, rows_queued=8, tasks_in_flight=2)  # 16 // 8 = 2


def test_no_bound_admits_everything():
    free = Pacing(max_staleness=None, batch_rows=16, rows_per_task=4)
    assert free.admits(version=0, trainer_at=100, rows_queued=10_000, tasks_in_flight=100)


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"max_staleness": 1, "batch_rows": 0, "rows_per_task": 4}, "batch_rows=0"),
        ({"max_staleness": 1, "batch_rows": 16, "rows_per_task": 0}, "rows_per_task=0"),
        ({"max_staleness": -1, "batch_rows": 16, "rows_per_task": 4}, "max_staleness=-1"),
    ],
)
def test_sizes_that_make_no_rule_are_refused_by_name(kwargs, word):
    with pytest.raises(ValueError, match=word):
        Pacing(**kwargs)


def test_rows_queued_counts_ready_and_pending_rows():
    class Buffer:
        def metrics(self):
            return {"buffer/size": 12.0, "buffer/pending": 4.0, "buffer/dropped_stale": 4.0}

    assert rows_queued(Buffer()) == 16
