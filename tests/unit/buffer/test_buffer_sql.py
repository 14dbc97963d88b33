"""Persistent storages: the Buffer semantics on every storage, SQL specifics, and real multi-process use.

The PostgreSQL variants need a server: ``export TRINE_TEST_POSTGRES_URL="$(scripts/postgres.sh)"``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import sqlite3
import threading
import time
import uuid
from typing import Any

import pytest

from tests.helpers import exp, f32, ids
from trine.buffer import STORAGES, Buffer, BufferTimeout, FileBuffer, MemoryBuffer, SQLBuffer
from trine.types import Experience

PG_URL = os.environ.get("TRINE_TEST_POSTGRES_URL")
needs_pg = pytest.mark.skipif(
    not PG_URL,
    reason='PostgreSQL variant: set TRINE_TEST_POSTGRES_URL (export TRINE_TEST_POSTGRES_URL="$(scripts/postgres.sh)")',
)


def rich(i: int, **fields: Any) -> Experience:
    """Experience ``i`` with every field set, to values a lossy storage would change (large token ids,
    float32 logprobs, non-ASCII and nested info); ``fields`` override them."""
    return exp(
        i,
        **{
            "tokens": [7, 100_000 + i, 3, 2**31 - 1, i],
            "prompt_length": 2,
            "action_mask": [1, 0, 1],
            "logprobs": [f32(-0.1 * i - 0.3), 0.0, f32(-2.718281828)],
            "token_rewards": None if i % 2 else [f32(0.1), 0.0, f32(1.0 / 3.0)],
            "task_id": f"task{i % 3}",
            "group_id": f"g{i // 2}",
            "run_id": f"run{i}",
            "step": i % 4,
            "kind": "sft" if i % 5 == 4 else "rollout",
            "info": {
                "i": i,
                "text": "réponse ✓",
                "parts": {"fmt": 0.5},
                "taskset": "math",
                "lineage": ["dedup"],
            },
            **fields,
        },
    )


def _sql(url: str, request: pytest.FixtureRequest) -> SQLBuffer:
    buf = SQLBuffer(url, table=f"t_{uuid.uuid4().hex[:10]}", poll_interval=0.02)

    def drop() -> None:
        import sqlalchemy as sa

        buf._engines()
        with buf._engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE {buf.table_name}"))
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {buf.table_name}_batches"))
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {buf.table_name}_tasks"))
        buf.close()

    request.addfinalizer(drop)
    return buf


def _storage(request: pytest.FixtureRequest, tmp_path) -> Buffer:
    if request.param == "memory":
        return MemoryBuffer()
    if request.param == "file":
        return FileBuffer(tmp_path / "buffer.jsonl")
    return _sql(f"sqlite:///{tmp_path}/buffer.db" if request.param == "sqlite" else PG_URL, request)


@pytest.fixture(params=["memory", "file", "sqlite", pytest.param("postgres", marks=needs_pg)])
def storage(request: pytest.FixtureRequest, tmp_path) -> Buffer:
    return _storage(request, tmp_path)


@pytest.fixture(params=["file", "sqlite", pytest.param("postgres", marks=needs_pg)])
def persistent(request: pytest.FixtureRequest, tmp_path) -> Buffer:
    """The persistent storages (which also accept ``(task_id, run_id)`` keys in set_rewards)."""
    return _storage(request, tmp_path)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=needs_pg)])
def sql_buffer(request: pytest.FixtureRequest, tmp_path) -> SQLBuffer:
    return _sql(f"sqlite:///{tmp_path}/buffer.db" if request.param == "sqlite" else PG_URL, request)


# -- the Buffer semantics, identical on every storage --------------------------------------------


def test_storages_are_registered_and_follow_the_protocol(tmp_path):
    assert STORAGES["memory"] is MemoryBuffer
    assert STORAGES["sql"] is STORAGES["sqlite"] is SQLBuffer
    assert STORAGES["file"] is FileBuffer
    assert isinstance(SQLBuffer(tmp_path / "b.db"), Buffer)
    assert isinstance(FileBuffer(tmp_path / "b.jsonl"), Buffer)


def test_round_trip_keeps_every_field_exactly(storage):
    sent = [rich(i) for i in range(6)]
    sent[1].logprobs = None
    sent[2].action_mask, sent[2].tokens, sent[2].logprobs = [], [5, 6], []  # empty response
    storage.put(sent[:4])
    storage.put(sent[4:])
    got = storage.get(6, timeout=1.0)
    assert got == sent  # dataclass equality: all fields, float32 logprobs bit-exact, order kept
    assert got[1].logprobs is None and got[2].logprobs == [] and got[1].token_rewards is None


def test_pending_rewards_become_trainable_by_task_and_run(persistent):
    storage = persistent
    storage.put(
        [rich(0, reward=None), rich(1, reward=None, run_id="r"), rich(2, reward=None, run_id="r"), rich(3)]
    )
    assert storage.metrics()["buffer/pending"] == 3 and len(storage) == 1
    with pytest.raises(BufferTimeout):
        storage.get(2, timeout=0.05)
    pending_id = storage.get(1, timeout=1.0)[0].id  # rich(3), the only ready one
    assert pending_id != ""
    assert storage.set_rewards({("task1", "r"): 0.25, ("task2", "r"): 0.75}) == 2
    assert storage.metrics()["buffer/pending"] == 1 and len(storage) == 2
    assert storage.set_rewards({"unknown-id": 1.0}) == 0
    got = storage.get(2, timeout=1.0)
    assert ids(got) == [1, 2] and [e.reward for e in got] == [0.25, 0.75]
    with pytest.raises(TypeError, match="task_id, run_id"):
        storage.set_rewards({("a", "b", "c"): 1.0})


def test_set_rewards_by_experience_id(storage):
    pending = rich(0, reward=None)
    storage.put([pending])
    assert storage.set_rewards({pending.id: -1.5}) == 1
    assert storage.set_rewards({pending.id: 2.0}) == 0  # no longer pending
    assert storage.get(1, timeout=1.0)[0].reward == -1.5


def test_min_version_drops_stale_experiences_and_counts_them(storage):
    storage.put([rich(0, version=0), rich(1, version=2), rich(2, version=1), rich(3, version=3)])
    late = rich(4, version=0, reward=None)
    storage.put([late])
    assert ids(storage.get(1, min_version=2, timeout=1.0)) == [1]
    assert storage.metrics()["buffer/dropped_stale"] == 2
    assert storage.set_rewards({late.id: 1.0}) == 1  # filled late, still version 0
    with pytest.raises(BufferTimeout):
        storage.get(2, min_version=2, timeout=0.05)
    assert storage.metrics() == {"buffer/size": 1.0, "buffer/pending": 0.0, "buffer/dropped_stale": 3.0}
    assert ids(storage.get(1, min_version=2, timeout=1.0)) == [3]


def test_get_is_all_or_nothing_and_times_out(storage):
    storage.put([rich(i) for i in range(3)])
    start = time.monotonic()
    with pytest.raises(BufferTimeout, match="only 3 of 5"):
        storage.get(5, timeout=0.3)
    assert 0.25 < time.monotonic() - start < 3.0
    assert len(storage) == 3  # nothing consumed
    with pytest.raises(ValueError, match="n=0"):
        storage.get(0)
    assert ids(storage.get(3, timeout=0)) == [0, 1, 2]


def test_get_waits_for_a_producer_thread(storage):
    storage.put([rich(0)])

    def producer() -> None:
        time.sleep(0.15)
        storage.put([rich(1), rich(2)])

    thread = threading.Thread(target=producer)
    start = time.monotonic()
    thread.start()
    got = storage.get(3, timeout=5.0)
    thread.join()
    assert ids(got) == [0, 1, 2]
    assert 0.1 < time.monotonic() - start < 4.0


# -- SQL specifics --------------------------------------------------------------------------------


def test_rows_are_queryable_with_plain_sql(tmp_path):
    buf = SQLBuffer(f"sqlite:///{tmp_path}/q.db")
    buf.put([rich(i, reward=float(i)) for i in range(4)] + [rich(4, reward=None)])
    buf.get(1, timeout=1.0)
    con = sqlite3.connect(tmp_path / "q.db")
    assert con.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    rows = con.execute(
        "SELECT reward_status, COUNT(*), AVG(reward) FROM experiences GROUP BY reward_status ORDER BY 1"
    ).fetchall()
    assert rows == [("pending", 1, None), ("ready", 4, 1.5)]
    row = con.execute(
        "SELECT task_id, taskset, group_id, run_id, step, policy_version, prompt_length, response_length,"
        " kind, lineage, use_count, consumed_at IS NOT NULL, length(tokens), length(logprobs), priority"
        " FROM experiences ORDER BY seq LIMIT 1"
    ).fetchone()
    assert row == ("task0", "math", "g0", "run0", 0, 0, 2, 3, "rollout", '["dedup"]', 1, 1, 20, 12, 0.0)
    indexed = {r[1] for r in con.execute("PRAGMA index_list(experiences)")}
    assert {"ix_experiences_claim", "ix_experiences_task_run"} <= indexed
    buf.close()


@needs_pg
def test_postgres_rows_are_queryable(request):
    import sqlalchemy as sa

    sql_buffer = _sql(PG_URL, request)
    sql_buffer.put([rich(i, reward=float(i)) for i in range(4)])
    with sql_buffer._engine.connect() as conn:
        avg = conn.execute(sa.text(f"SELECT AVG(reward) FROM {sql_buffer.table_name} WHERE reward > 0"))
        assert avg.scalar() == 2.0


def test_database_is_the_state_across_objects(tmp_path):
    url = f"sqlite:///{tmp_path}/state.db"
    first = SQLBuffer(url)
    first.put([rich(i, version=i) for i in range(4)] + [rich(9, reward=None)])
    first.get(1, min_version=1, timeout=1.0)
    state = first.state_dict()
    first.close()
    second = SQLBuffer(url)
    second.load_state_dict(state)
    assert state["counters"] == {"consumed": 1, "dropped_stale": 1}
    assert second.consumed == 1 and second.dropped_stale == 1
    assert second.metrics() == {"buffer/size": 2.0, "buffer/pending": 1.0, "buffer/dropped_stale": 1.0}
    assert ids(second.get(2, timeout=1.0)) == [2, 3]
    with pytest.raises(ValueError, match="pass table='experiences'"):
        SQLBuffer(url, table="other").load_state_dict(state)


def test_state_dict_hides_the_password():
    buf = SQLBuffer("postgresql+psycopg://u:secret@127.0.0.1:1/db")
    assert "secret" not in str(buf.state_dict()) and "secret" not in repr(buf)


def test_errors_name_the_bad_value(tmp_path):
    with pytest.raises(ValueError, match="in-memory SQLite"):
        SQLBuffer("sqlite://").put([rich(0)])
    with pytest.raises(ValueError, match="identifier"):
        SQLBuffer(tmp_path / "x.db", table="bad name; drop")
    with pytest.raises(ConnectionError, match="could not open 'postgresql.*u:\\*\\*\\*@127.0.0.1:9/db'"):
        SQLBuffer("postgresql+psycopg://u:secret@127.0.0.1:9/db").put([rich(0)])
    buf = SQLBuffer(tmp_path / "x.db")
    e = rich(0)
    buf.put([e])
    with pytest.raises(ValueError, match="already stored"):
        buf.put([e])
    with pytest.raises(ValueError, match="action_mask"):
        buf.put([Experience(tokens=[1, 2], prompt_length=1, action_mask=[])])


def test_pickled_buffer_reopens_the_same_table(sql_buffer):
    sql_buffer.put([rich(0), rich(1)])
    copy = pickle.loads(pickle.dumps(sql_buffer))
    assert ids(copy.get(1, timeout=1.0)) == [0]
    assert ids(sql_buffer.get(1, timeout=1.0)) == [1]
    copy.close()


def test_threads_sharing_one_buffer_take_disjoint_experiences(sql_buffer):
    sql_buffer.put([rich(i) for i in range(80)])
    taken: list[list[int]] = []

    def reader() -> None:
        while True:
            try:
                taken.append(ids(sql_buffer.get(5, timeout=0.1)))
            except BufferTimeout:
                return

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flat = [i for batch in taken for i in batch]
    assert sorted(flat) == list(range(80)) and all(batch == sorted(batch) for batch in taken)


# -- several writer and reader processes on one database ------------------------------------------

WRITERS, PER_WRITER, READERS, BATCH = 3, 200, 3, 10


def _writer(buf: SQLBuffer, w: int) -> None:
    for start in range(0, PER_WRITER, 10):
        batch = [rich(w * PER_WRITER + start + k, reward=None if k < 2 else 1.0) for k in range(10)]
        buf.put(batch)
        assert buf.set_rewards({e.id: 0.5 for e in batch[:2]}) == 2


def _reader(buf: SQLBuffer, ready, done, results) -> None:
    got: list[int] = []
    len(buf)  # open this process's engine before the writers start
    ready.release()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            got.extend(ids(buf.get(BATCH, timeout=0.2)))
        except BufferTimeout:
            if done.is_set() and len(buf) == 0:
                break
    results.put(got)


def test_concurrent_writer_and_reader_processes_consume_each_experience_once(sql_buffer):
    # The buffer's engine was opened in this process before the fork; the readers all run (their
    # own engines open) before the writers start, so they compete for every batch.
    ctx = mp.get_context("fork")
    assert len(sql_buffer) == 0
    ready, done, results = ctx.Semaphore(0), ctx.Event(), ctx.Queue()
    readers = [ctx.Process(target=_reader, args=(sql_buffer, ready, done, results)) for _ in range(READERS)]
    writers = [ctx.Process(target=_writer, args=(sql_buffer, w)) for w in range(WRITERS)]
    for p in readers:
        p.start()
    for _ in readers:
        assert ready.acquire(timeout=30)
    for p in writers:
        p.start()
    for p in writers:
        p.join(60)
    done.set()
    taken = [results.get(timeout=60) for _ in readers]
    for p in readers:
        p.join(10)
    assert [p.exitcode for p in writers + readers] == [0] * (WRITERS + READERS)
    flat = [i for got in taken for i in got]
    total = WRITERS * PER_WRITER
    assert len(flat) == total, f"{total - len(set(flat))} lost, {len(flat) - len(set(flat))} duplicated"
    assert sorted(flat) == list(range(total))
    # The parent's own connection survived the children (nothing closed it behind its back).
    assert sql_buffer.metrics() == {"buffer/size": 0.0, "buffer/pending": 0.0, "buffer/dropped_stale": 0.0}
