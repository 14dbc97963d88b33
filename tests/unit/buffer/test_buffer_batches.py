"""Explored batches: every ``put`` records one, ``get(None)`` hands the oldest out whole.

The trainer asks the buffer for "the next explored batch" instead of keeping a ledger of what was put
beside it, so ``get(None)`` must hand out exactly what ``get(size of that put)`` would, on every
storage, across processes (SQL) and across a resume. The PostgreSQL variants need
``export TRINE_TEST_POSTGRES_URL="$(scripts/postgres.sh)"``.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.helpers import exp, ids
from trine.buffer import BufferTimeout, FileBuffer, MemoryBuffer, SQLBuffer
from trine.buffer.sampling import SamplingRules
from trine.types import Experience

PG_URL = os.environ.get("TRINE_TEST_POSTGRES_URL")
needs_pg = pytest.mark.skipif(not PG_URL, reason="PostgreSQL variant: set TRINE_TEST_POSTGRES_URL")
ALL = ["memory", "file", "sqlite", pytest.param("postgres", marks=needs_pg)]
SQL = ["sqlite", pytest.param("postgres", marks=needs_pg)]

Make = Callable[..., "MemoryBuffer | SQLBuffer"]


def _drop_pg_tables(tables: list[str]) -> None:
    import sqlalchemy as sa

    engine = sa.create_engine(PG_URL)
    with engine.begin() as conn:
        for table in tables:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}_batches"))
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
    engine.dispose()


@pytest.fixture
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Make]:
    """``make(**rules)``: a fresh, empty buffer of the storage ``request.param`` names;
    ``make(_same=True)`` a new object on the storage the last call opened (a restarted process)."""
    kind, opened, tables, count = request.param, [], [], itertools.count()

    def make(_same: bool = False, **rules):
        options = {"rules": SamplingRules(**rules)}
        if kind == "memory":
            buf = MemoryBuffer(**options)
        elif kind == "file":
            buf = FileBuffer(tmp_path / f"buffer{next(count) - _same}.jsonl", **options)
        else:
            if not _same:
                tables.append(f"t_{uuid.uuid4().hex[:10]}")
            url = f"sqlite:///{tmp_path}/buffer.db" if kind == "sqlite" else PG_URL
            buf = SQLBuffer(url, table=tables[-1], poll_interval=0.01, **options)
        opened.append(buf)
        return buf

    yield make
    for buf in opened:
        buf.close()
    if kind == "postgres":
        _drop_pg_tables(tables)


# -- the semantics, identical on every storage ---------------------------------------------------


@pytest.mark.parametrize("factory", ALL, indirect=True)
def test_each_put_is_one_batch_handed_out_whole_and_in_order(factory):
    buf = factory()
    buf.put([exp(0), exp(1), exp(2)])
    buf.put([exp(3), exp(4)])
    assert buf.batches_waiting() == 2
    assert ids(buf.get(None, timeout=1.0)) == [0, 1, 2]
    assert buf.batches_waiting() == 1
    assert ids(buf.get(None, timeout=1.0)) == [3, 4]
    assert buf.batches_waiting() == 0 and len(buf) == 0


@pytest.mark.parametrize("factory", ALL, indirect=True)
def test_an_empty_put_is_an_empty_batch(factory):
    buf = factory()
    buf.put([exp(0)])
    assert ids(buf.get(None, current_version=2, timeout=1.0)) == [0]
    before = buf.metrics()  # incl. buffer/staleness_* of the batch just handed out
    buf.put([])  # every task of that explored batch was skipped or filtered out
    buf.put([exp(1)])
    start = time.monotonic()
    assert buf.get(None, current_version=5, timeout=10.0) == []
    assert time.monotonic() - start < 1.0  # at once
    assert buf.metrics() == {**before, "buffer/size": 1.0}  # the empty hand-out changes no metric
    assert buf.batches_waiting() == 1 and ids(buf.get(None, timeout=1.0)) == [1]


@pytest.mark.parametrize("factory", ALL, indirect=True)
def test_pending_rewards_make_get_none_wait_then_time_out_consuming_nothing(factory):
    buf = factory()
    buf.put([exp(0, reward=None, run_id="r"), exp(1, reward=None, run_id="r")])
    start = time.monotonic()
    with pytest.raises(BufferTimeout, match=r"only 0 of 2 experiences were ready after 0.2s \(2 pending"):
        buf.get(None, timeout=0.2)
    assert time.monotonic() - start >= 0.15
    assert buf.batches_waiting() == 1  # the batch record is still there
    assert buf.metrics()["buffer/pending"] == 2
    assert buf.set_rewards({("t0", "r"): 0.5, ("t1", "r"): 0.25}) == 2
    got = buf.get(None, timeout=1.0)
    assert ids(got) == [0, 1] and [e.reward for e in got] == [0.5, 0.25]


@pytest.mark.parametrize("factory", ALL, indirect=True)
def test_no_batch_times_out_with_a_clear_message_and_int_n_ignores_batches(factory):
    buf = factory()
    with pytest.raises(BufferTimeout, match=r"no explored batch arrived within 0.05s; every batch put"):
        buf.get(None, timeout=0.05)
    buf.put([exp(0), exp(1), exp(2)])
    assert ids(buf.get(2, timeout=1.0)) == [0, 1]  # an integer n leaves the batch record alone
    assert buf.batches_waiting() == 1
    with pytest.raises(BufferTimeout, match="only 1 of 3"):
        buf.get(None, timeout=0.05)
    with pytest.raises(ValueError, match="n=0"):
        buf.get(0)
    buf.put([exp(3), exp(4)])
    assert ids(buf.get(None, timeout=1.0)) == [2, 3, 4]  # the first batch's size, by the usual rules
    assert buf.batches_waiting() == 1  # the second put's record waits: its rows went out above
    with pytest.raises(BufferTimeout, match="only 0 of 2"):
        buf.get(None, timeout=0.05)


@pytest.mark.parametrize("factory", ALL, indirect=True)
def test_get_none_waits_for_a_put_from_another_thread(factory):
    buf = factory()
    thread = threading.Thread(target=lambda: (time.sleep(0.15), buf.put([exp(0), exp(1)])))
    start = time.monotonic()
    thread.start()
    got = buf.get(None, timeout=5.0)
    thread.join()
    assert ids(got) == [0, 1] and 0.1 < time.monotonic() - start < 4.0


RULES = {
    "fifo": {},
    "whole_groups": {"whole_groups": True},
    "staleness": {"max_staleness": 1},
    "priority": {"sampler": "priority", "reuse_limit": 2, "cooldown": 1},
}


def _play(buf, by_batch: bool) -> list:
    """One script of puts, rewards and takes; a take asks ``get(None)`` or, like the old ledger,
    ``get(size of the oldest put not taken yet)``. Returns what each take gave, or its error."""
    sizes: list[int] = []
    log: list = []

    def put(exps: list[Experience]) -> None:
        buf.put(exps)
        sizes.append(len(exps))

    def take(version: int) -> None:
        if not sizes:
            return
        try:
            if by_batch:
                got = buf.get(None, current_version=version, timeout=0.05)
            else:
                got = buf.get(sizes[0], current_version=version, timeout=0.05) if sizes[0] else []
        except BufferTimeout as err:
            log.append(("timeout", str(err)))
            return
        sizes.pop(0)
        log.append((ids(got), [e.reward for e in got], buf.metrics()))

    put(
        [
            exp(0, group_id="g0"),
            exp(1, reward=None, group_id="g0", run_id="r"),
            exp(2, group_id="g1"),
            exp(3, group_id="g1"),
        ]
    )
    take(1)  # too few trainable rows yet: a timeout on every rule set
    put([exp(4, version=1, group_id="g2"), exp(5, version=1, group_id="g2")])
    take(1)
    buf.set_rewards({("t1", "r"): 0.5})
    put([])
    put([exp(6, version=2), exp(7, version=2), exp(8, version=2)])
    for _ in range(4):
        take(3)  # max_staleness=1 drops versions 0 and 1 here
    put([exp(9, version=3)])
    for _ in range(2):
        take(3)
    return log


@pytest.mark.parametrize("factory", ALL, indirect=True)
@pytest.mark.parametrize("rules", list(RULES))
def test_get_none_hands_out_exactly_what_get_of_the_put_size_does(factory, rules):
    by_batch = _play(factory(**RULES[rules]), by_batch=True)
    by_size = _play(factory(**RULES[rules]), by_batch=False)
    assert by_batch == by_size  # same rows, rewards, metrics and errors, take by take
    assert any(isinstance(entry[0], list) and entry[0] for entry in by_batch)  # it did hand rows out


# -- state and resume -----------------------------------------------------------------------------


def test_memory_state_keeps_the_untaken_batches():
    buf = MemoryBuffer()
    buf.put([exp(0)])
    buf.put([exp(1), exp(2)])
    buf.put([])
    assert ids(buf.get(None, timeout=0)) == [0]
    state = buf.state_dict()
    assert state["batches"] == [[2, 2], [3, 0]] and state["next_batch"] == 4

    resumed = MemoryBuffer()
    resumed.load_state_dict(state)
    assert resumed.batches_waiting() == 2
    assert ids(resumed.get(None, timeout=0)) == [1, 2] and resumed.get(None, timeout=0) == []
    resumed.put([exp(3)])
    assert resumed.state_dict()["batches"] == [[4, 1]]  # the counter went on

    older = {k: v for k, v in state.items() if k not in ("batches", "next_batch")}  # an older Trine's
    old = MemoryBuffer()
    old.load_state_dict(older)
    assert old.batches_waiting() == 0 and len(old) == 2


def test_a_reopened_file_buffer_replays_its_batches(tmp_path):
    path = tmp_path / "buffer.jsonl"
    buf = FileBuffer(path)
    buf.put([exp(0)])
    buf.put([exp(1), exp(2)])
    buf.put([])
    assert ids(buf.get(None, timeout=0)) == [0]
    state = buf.state_dict()  # checkpoint: batches 2 and 3 not taken
    buf.put([exp(3)])
    assert ids(buf.get(None, timeout=0)) == [1, 2]  # then a crash
    buf.close()

    reopened = FileBuffer(path)
    assert reopened.batches_waiting() == 2  # the empty batch and exp(3)'s
    reopened.load_state_dict(state)  # rewind: exp(3) and its batch rolled back, batch 2 untaken
    assert reopened.batches_waiting() == 2
    assert ids(reopened.get(None, timeout=0)) == [1, 2] and reopened.get(None, timeout=0) == []
    with pytest.raises(BufferTimeout, match="no explored batch"):
        reopened.get(None, timeout=0)
    assert FileBuffer(path).batches_waiting() == 0  # the takes were logged too


@pytest.mark.parametrize("factory", SQL, indirect=True)
def test_sql_rewind_restores_untaken_batches_and_drops_later_ones(factory):
    buf = factory()
    buf.put([exp(0), exp(1)])
    buf.put([exp(2)])
    buf.put([])
    assert ids(buf.get(None, timeout=1.0)) == [0, 1]
    state = buf.state_dict()
    assert state["batches"] == {"mark": 3, "untaken": [[2, 3]]}
    buf.put([exp(3)])  # after the checkpoint, then a crash
    assert ids(buf.get(None, timeout=1.0)) == [2]
    assert buf.get(None, timeout=1.0) == []
    assert ids(buf.get(None, timeout=1.0)) == [3]
    buf.close()

    resumed = factory(_same=True)
    resumed.load_state_dict(state)
    assert resumed.last_rewind == {"rolled_back": 1, "restored": 1}
    assert resumed.batches_waiting() == 2
    assert ids(resumed.get(None, timeout=1.0)) == [2] and resumed.get(None, timeout=1.0) == []
    with pytest.raises(BufferTimeout, match="no explored batch"):  # exp(3)'s batch is gone
        resumed.get(None, timeout=0.05)
    resumed.put([exp(4)])
    assert ids(resumed.get(None, timeout=1.0)) == [4]


@pytest.mark.parametrize("factory", SQL, indirect=True)
def test_sql_state_from_an_older_trine_rewinds_rows_only(factory):
    buf = factory()
    buf.put([exp(0)])
    state = buf.state_dict()
    del state["batches"]  # a checkpoint written before batch records existed
    buf.put([exp(1)])
    assert ids(buf.get(None, timeout=1.0)) == [0]
    buf.close()
    resumed = factory(_same=True)
    resumed.load_state_dict(state)
    assert resumed.last_rewind == {"rolled_back": 1, "restored": 1}
    assert resumed.batches_waiting() == 1  # the batch records were left as they were: 1 taken, 2 not
    assert ids(resumed.get(None, timeout=1.0)) == [0]  # batch 2's size, the oldest ready rows
    assert resumed.batches_waiting() == 0


def test_a_database_made_before_batch_records_gets_the_table(tmp_path):
    db = tmp_path / "buffer.db"
    buf = SQLBuffer(db)
    buf.put([exp(0), exp(1)])
    buf.close()
    with sqlite3.connect(db) as conn:  # what an older Trine left: rows, no batches table
        conn.execute("DROP TABLE experiences_batches")
    reopened = SQLBuffer(db, poll_interval=0.01)
    assert reopened.batches_waiting() == 0  # created, empty: the old rows have no batch records
    with pytest.raises(BufferTimeout, match="no explored batch arrived"):
        reopened.get(None, timeout=0.05)
    reopened.put([exp(2)])
    assert ids(reopened.get(None, timeout=1.0)) == [0]  # FIFO: the new batch's size, oldest rows
    assert ids(reopened.get(2, timeout=1.0)) == [1, 2]
    reopened.close()


def test_a_database_made_before_trajectory_statuses_gets_the_column(tmp_path):
    db = tmp_path / "buffer.db"
    buf = SQLBuffer(db)
    buf.put([exp(0)])
    buf.close()
    with sqlite3.connect(db) as conn:  # what an older Trine left: no status column
        conn.execute("ALTER TABLE experiences DROP COLUMN status")
    reopened = SQLBuffer(db)
    failed = exp(1)
    failed.status = "env_error"
    reopened.put([failed])
    got = reopened.get(2, timeout=1.0)
    assert [e.status for e in got] == ["ok", "env_error"]  # the old row reads as ok
    reopened.close()


# -- several readers --------------------------------------------------------------------------------


@pytest.mark.parametrize("factory", SQL, indirect=True)
def test_concurrent_readers_take_disjoint_batches(factory, request):
    sizes = [1, 2, 3, 1, 2, 3, 4, 1, 2, 3, 0, 2]
    puts = [[100 * b + j for j in range(size)] for b, size in enumerate(sizes)]
    writer = factory()
    for rows in puts:
        writer.put([exp(i) for i in rows])
    taken: list[list[int]] = []

    def reader() -> None:
        buf = factory(_same=True)  # its own object, engine and connections
        while True:
            try:
                got = buf.get(None, timeout=0.3)
            except BufferTimeout:
                return
            taken.append(ids(got))

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert writer.batches_waiting() == 0 and len(writer) == 0
    assert len(taken) == len(puts)  # each batch taken once, by one reader
    assert sorted(i for batch in taken for i in batch) == sorted(i for rows in puts for i in rows)
    if "sqlite" in request.node.callspec.id:  # claims are serialized: each batch is one put's rows
        assert sorted(taken) == sorted(puts)
