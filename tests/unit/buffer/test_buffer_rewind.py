"""Persistent buffers rewind to the checkpoint when a crashed run resumes (``load_state_dict``).

A checkpoint keeps the buffer's ``state_dict()``; after a crash the storage also holds what the run
did after it (puts, hand-outs, stale drops, expiries), which the resumed run does again. Each test
opens the storage a second time (a restarted process), loads the checkpoint's state and checks the
exact contents. The PostgreSQL variants need ``export TRINE_TEST_POSTGRES_URL="$(scripts/postgres.sh)"``.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.helpers import exp, ids, write_config
from trine.buffer import BufferTimeout, FileBuffer, SQLBuffer
from trine.buffer.files import import_experiences
from trine.buffer.inspect import read_rows
from trine.buffer.sampling import SamplingRules

PG_URL = os.environ.get("TRINE_TEST_POSTGRES_URL")
needs_pg = pytest.mark.skipif(not PG_URL, reason="PostgreSQL variant: set TRINE_TEST_POSTGRES_URL")


@pytest.fixture(params=["file", "sqlite", pytest.param("postgres", marks=needs_pg)])
def reopen(request: pytest.FixtureRequest, tmp_path: Path):
    """``reopen(**options)``: a new buffer object on the same storage (a restarted process)."""
    kind, table = request.param, f"t_{uuid.uuid4().hex[:10]}"
    opened: list = []

    def make(clock=None, **rules):
        options = {"rules": SamplingRules(**rules), **({} if clock is None else {"clock": clock})}
        if kind == "file":
            buf = FileBuffer(tmp_path / "buffer.jsonl", **options)
        else:
            url = f"sqlite:///{tmp_path}/buffer.db" if kind == "sqlite" else PG_URL
            buf = SQLBuffer(url, table=table, poll_interval=0.01, **options)
        opened.append(buf)
        return buf

    yield make
    for buf in opened:
        buf.close()
    if kind == "postgres":
        import sqlalchemy as sa

        engine = sa.create_engine(PG_URL)
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}_batches"))
        engine.dispose()


def test_crash_after_the_checkpoint_is_rewound(reopen):
    buf = reopen()
    buf.put([exp(i) for i in range(4)])
    assert ids(buf.get(2, timeout=1.0)) == [0, 1]
    buf.put([exp(10, reward=None), exp(11, reward=None)])
    state = buf.state_dict()  # checkpoint: 0, 1 consumed; 2, 3 ready; 10, 11 pending

    buf.put([exp(4), exp(5), exp(6)])  # after the checkpoint, then a crash
    assert ids(buf.get(3, timeout=1.0)) == [2, 3, 4]
    assert buf.set_rewards({("t10", ""): 0.5}) == 1  # a grader answers (it will not send it again)
    assert ids(buf.get(1, timeout=1.0)) == [10]
    buf.close()

    resumed = reopen()
    resumed.load_state_dict(state)
    assert resumed.last_rewind == {"rolled_back": 3, "restored": 3}  # 4, 5, 6 gone; 2, 3, 10 back
    assert len(resumed) == 3
    metrics = resumed.metrics()
    assert (metrics["buffer/size"], metrics["buffer/pending"], metrics["buffer/dropped_stale"]) == (3, 1, 0)
    assert resumed.consumed == 2  # the checkpoint's counter
    got = resumed.get(3, timeout=1.0)
    assert ids(got) == [2, 3, 10] and [e.reward for e in got] == [1.0, 1.0, 0.5]  # the reward stays
    with pytest.raises(BufferTimeout):
        resumed.get(1, timeout=0.05)  # 4, 5, 6 are never handed out again; 11 is still pending
    assert resumed.set_rewards({("t11", ""): 0.25}) == 1
    assert ids(resumed.get(1, timeout=1.0)) == [11]


def test_stale_drops_and_expiries_after_the_checkpoint_are_undone(reopen):
    now = [0.0]
    options = {"pending_timeout": 10.0, "clock": lambda: now[0]}
    buf = reopen(**options)
    buf.put([exp(0, version=0), exp(1, version=1), exp(10, reward=None)])
    state = buf.state_dict()
    now[0] = 20.0  # exp 10 is past its timeout; version 0 is below the floor
    assert ids(buf.get(1, min_version=1, timeout=1.0)) == [1]
    metrics = buf.metrics()
    assert (metrics["buffer/dropped_stale"], metrics["buffer/pending_expired"]) == (1, 1)
    buf.close()

    now[0] = 5.0  # the resumed run's clock: nothing has timed out yet
    resumed = reopen(**options)
    resumed.load_state_dict(state)
    assert resumed.last_rewind == {"rolled_back": 0, "restored": 3}
    metrics = resumed.metrics()
    assert (metrics["buffer/size"], metrics["buffer/pending"]) == (2, 1)
    assert (metrics["buffer/dropped_stale"], metrics["buffer/pending_expired"]) == (0, 0)
    assert ids(resumed.get(2, timeout=1.0)) == [0, 1]


def test_replay_use_counts_are_restored(reopen):
    options = {"sampler": "priority", "reuse_limit": 2}
    buf = reopen(**options)
    buf.put([exp(0), exp(1)])
    assert ids(buf.get(1, timeout=1.0)) == [0]  # 0 used once (priority -1), may replay
    state = buf.state_dict()
    crashed = [ids(buf.get(1, timeout=1.0)) for _ in range(2)]
    assert crashed == [[1], [0]]  # 0 consumed for good (second use)
    buf.close()

    resumed = reopen(**options)
    resumed.load_state_dict(state)
    assert resumed.last_rewind == {"rolled_back": 0, "restored": 2}
    assert [ids(resumed.get(1, timeout=1.0)) for _ in range(3)] == [[1], [0], [1]]  # same order again
    with pytest.raises(BufferTimeout):
        resumed.get(1, timeout=0.05)


def test_a_clean_stop_changes_nothing(reopen, tmp_path):
    buf = reopen()
    buf.put([exp(i) for i in range(3)])
    buf.get(1, timeout=1.0)
    buf.put([exp(10, reward=None)])
    state = buf.state_dict()
    buf.close()
    log = tmp_path / "buffer.jsonl"
    size = log.stat().st_size if log.exists() else None

    resumed = reopen()
    resumed.load_state_dict(state)
    assert resumed.last_rewind == {"rolled_back": 0, "restored": 0}
    assert (log.stat().st_size if log.exists() else None) == size  # no rewind record written
    assert resumed.state_dict() == state
    assert ids(resumed.get(2, timeout=1.0)) == [1, 2]


def test_a_state_without_a_mark_restores_only_counters(reopen):
    buf = reopen()
    buf.put([exp(0), exp(1)])
    state = buf.state_dict()
    for key in ("rewind", "records"):  # a checkpoint written before rewinds existed
        state.pop(key, None)
    buf.get(2, timeout=1.0)
    buf.close()
    resumed = reopen()
    resumed.load_state_dict(state)
    assert resumed.last_rewind == {"rolled_back": 0, "restored": 0} and len(resumed) == 0


def test_sql_rewind_can_be_switched_off_and_records_ranges(tmp_path):
    buf = SQLBuffer(tmp_path / "b.db")
    buf.put([exp(i) for i in range(5)] + [exp(10, reward=None)])
    buf.get(1, timeout=1.0)
    state = buf.state_dict()
    assert state["rewind"] == {"mark": 6, "ready": [[2, 5]], "pending": [[6, 6]], "used": []}
    buf.put([exp(5)])
    buf.close()
    shared = SQLBuffer(tmp_path / "b.db", rewind=False)  # another process keeps writing: leave rows alone
    shared.load_state_dict(state)
    assert shared.last_rewind == {"rolled_back": 0, "restored": 0} and len(shared) == 5
    shared.close()


def _run_dir(tmp_path: Path, storage: str) -> Path:
    write_config(tmp_path / "config.yaml", buffer={"storage": storage})
    return tmp_path


@pytest.mark.parametrize("storage", ["file", "sql"])
def test_inspection_shows_rolled_back_rows_and_no_double_consumption(tmp_path, storage):
    def open_buffer():
        if storage == "file":
            return FileBuffer(tmp_path / "buffer.jsonl")
        return SQLBuffer(f"sqlite:///{tmp_path}/buffer.db")

    buf = open_buffer()
    buf.put([exp(0), exp(1)])
    buf.get(1, timeout=1.0)
    state = buf.state_dict()
    buf.put([exp(2)])
    buf.get(2, timeout=1.0)  # 1 and 2 consumed in the crashed timeline
    buf.close()
    for _ in range(2):  # two crashes in a row at the same point
        resumed = open_buffer()
        resumed.load_state_dict(state)
        resumed.put([exp(2)])  # explored again
        assert ids(resumed.get(2, timeout=1.0)) == [1, 2]
        resumed.close()

    rows = read_rows(_run_dir(tmp_path, storage))
    statuses = [(e.info["i"], s) for e, s in rows]
    assert statuses == [
        (0, "trained"),
        (1, "trained"),
        (2, "rolled_back"),
        (2, "rolled_back"),
        (2, "trained"),
    ]
    consumed = [e.id for e, s in rows if s == "trained"]
    assert len(consumed) == len(set(consumed)) == 3
    assert [e.info["i"] for e, _ in read_rows(tmp_path, "rolled_back")] == [2, 2]
    if storage == "file":  # a rewound log imports without the rolled-back experiences
        assert sorted(ids(import_experiences(tmp_path / "buffer.jsonl"))) == [0, 1, 2]
        assert len(FileBuffer(tmp_path / "buffer.jsonl")) == 0  # reopening replays the rewinds


def test_a_torn_last_record_is_cut_so_the_log_stays_appendable(tmp_path):
    path = tmp_path / "buffer.jsonl"
    buf = FileBuffer(path)
    buf.put([exp(0), exp(1)])
    state = buf.state_dict()
    with path.open("a") as f:
        f.write('{"_event": "consumed", "ids": ["x')  # the crash hit mid-write
    with pytest.warns(UserWarning, match="truncated last line"):
        resumed = FileBuffer(path)
    resumed.load_state_dict(state)
    resumed.put([exp(2)])
    assert ids(FileBuffer(path).get(3, timeout=1.0)) == [0, 1, 2]
