"""Buffer → trainer sampling rules on every storage: priority replay, staleness, pending timeout,
whole groups, metrics and their state (trine.buffer.sampling).

The PostgreSQL variants need a server: ``export TRINE_TEST_POSTGRES_URL="$(scripts/postgres.sh)"``.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import uuid
from typing import Any

import pytest

from tests.helpers import exp, ids
from trine.buffer import BufferTimeout, FileBuffer, MemoryBuffer, SQLBuffer
from trine.buffer.sampling import SamplingRules, arrange

PG_URL = os.environ.get("TRINE_TEST_POSTGRES_URL")
KINDS = [
    "memory",
    "file",
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.skipif(not PG_URL, reason="no PG")),
]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def storage_options(clock: Any = None, **rules: Any) -> dict[str, Any]:
    """A storage's keyword arguments: the sampling options as one ``rules`` value (and a test clock)."""
    return {"rules": SamplingRules(**rules), **({} if clock is None else {"clock": clock})}


class Storages:
    """Builds (and reopens) one kind of storage with given sampling options; drops SQL tables."""

    def __init__(self, kind: str, tmp_path: Any, request: pytest.FixtureRequest) -> None:
        self.kind, self.tmp_path, self.request = kind, tmp_path, request
        self.table = f"s_{uuid.uuid4().hex[:10]}"
        self.url = f"sqlite:///{tmp_path}/b.db" if kind == "sqlite" else PG_URL
        self.opened: list[Any] = []
        request.addfinalizer(self.cleanup)

    def __call__(self, **sampling: Any) -> Any:
        options = storage_options(**sampling)
        if self.kind == "memory":
            return MemoryBuffer(**options)
        if self.kind == "file":
            return FileBuffer(self.tmp_path / "b.jsonl", **options)
        buf = SQLBuffer(self.url, table=self.table, poll_interval=0.01, **options)
        self.opened.append(buf)
        return buf

    def cleanup(self) -> None:
        if not self.opened:
            return
        import sqlalchemy as sa

        buf = self.opened[0]
        buf._engines()
        with buf._engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {self.table}"))
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {self.table}_batches"))
        for b in self.opened:
            b.close()

    def sql(self, query: str) -> list[tuple]:
        """Rows of a raw SQL query on the table (named ``T`` in ``query``)."""
        import sqlalchemy as sa

        buf = self.opened[0]
        buf._engines()
        with buf._engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(query.replace(" T", f" {self.table}")))]


@pytest.fixture(params=KINDS)
def make(request: pytest.FixtureRequest, tmp_path) -> Storages:
    return Storages(request.param, tmp_path, request)


# -- priority replay ------------------------------------------------------------------------------


def test_priority_replay_order_cooldown_and_reuse_limit(make):
    buf = make(sampler="priority", reuse_limit=2, reuse_decay=1.0, cooldown=1)
    buf.put([exp(0, version=1), exp(1, version=1), exp(2, version=0), exp(3, version=2)])
    # priorities 1, 1, 0, 2: highest first, ties in put order
    assert ids(buf.get(2, timeout=0)) == [3, 0]
    assert buf.metrics()["buffer/reuse"] == 1.0
    # 3 and 0 cool down for one get; a failed get does not count
    with pytest.raises(BufferTimeout, match="only 2 of 3 .*2 waiting for a cooldown"):
        buf.get(3, timeout=0)
    assert ids(buf.get(2, timeout=0)) == [1, 2]
    # now 3 (2 - 1 = 1) and 0 (1 - 1 = 0) are back; 1 and 2 cool down
    assert ids(buf.get(2, timeout=0)) == [3, 0]
    assert buf.metrics() == {
        "buffer/size": 2.0,  # 3 and 0 reached reuse_limit=2 and are consumed for good
        "buffer/pending": 0.0,
        "buffer/dropped_stale": 0.0,
        "buffer/reuse": 2.0,
    }
    assert ids(buf.get(2, timeout=0)) == [1, 2]
    assert len(buf) == 0 and buf.consumed == 8
    with pytest.raises(BufferTimeout, match="only 0 of 1"):
        buf.get(1, timeout=0)


def test_reuse_decay_trades_freshness_against_use(make):
    buf = make(sampler="priority", reuse_limit=3, reuse_decay=0.5)
    buf.put([exp(0, version=2), exp(1, version=1)])
    got = [ids(buf.get(1, timeout=0)) + [buf.metrics()["buffer/reuse"]] for _ in range(4)]
    # 0: 2 -> 1.5 (still above 1) -> 1.0 (ties with 1, older first) -> consumed after 3 uses
    assert got == [[0, 1.0], [0, 2.0], [0, 3.0], [1, 1.0]]
    # a mixed batch: the mean use count
    buf.put([exp(2, version=0)])
    assert ids(buf.get(2, timeout=0)) == [1, 2] and buf.metrics()["buffer/reuse"] == 1.5


def test_sql_priority_columns_record_the_uses(tmp_path, request):
    make = Storages("sqlite", tmp_path, request)
    buf = make(sampler="priority", reuse_limit=2, reuse_decay=0.25, cooldown=0)
    buf.put([exp(0, version=3), exp(1, version=1)])
    buf.get(1, timeout=0)
    buf.get(2, timeout=0)
    rows = make.sql("SELECT use_count, priority, last_get, consumed_at IS NOT NULL FROM T ORDER BY seq")
    assert rows == [(2, 2.5, 2, 1), (1, 0.75, 2, 0)]


def test_fifo_hands_out_exactly_once_and_reports_no_reuse(make):
    buf = make(cooldown=3)  # cooldown has no effect without replay
    buf.put([exp(i) for i in range(3)])
    assert ids(buf.get(2, timeout=0)) == [0, 1] and ids(buf.get(1, timeout=0)) == [2]
    assert "buffer/reuse" not in buf.metrics()
    with pytest.raises(BufferTimeout):
        buf.get(1, timeout=0)


def test_fifo_under_a_staleness_bound_hands_out_the_oldest_weights_first(make):
    """Several explorer processes put rows in the order they finish, not the order they sampled in; under
    ``max_staleness`` the rows of the oldest weights go first, so a late put is trained before it passes
    the bound. Without a bound FIFO stays put order."""
    def late_first(first: int) -> list:
        return [exp(first + i, version=v) for i, v in enumerate((3, 3, 1, 2))]

    buf = make(max_staleness=4)
    buf.put(late_first(0))
    assert ids(buf.get(3, timeout=0, current_version=4)) == [2, 3, 0]
    buf.put([exp(4, version=2)])
    assert ids(buf.get(2, timeout=0, current_version=4)) == [4, 1]
    plain = make()  # the same table for the SQL storages: every row above was handed out
    plain.put(late_first(10))
    assert ids(plain.get(4, timeout=0)) == [10, 11, 12, 13]


def test_concurrent_readers_respect_the_reuse_limit(tmp_path, request):
    kinds = ["sqlite"] + (["postgres"] if PG_URL else [])
    for kind in kinds:
        buf = Storages(kind, tmp_path, request)(sampler="priority", reuse_limit=2)
        buf.put([exp(i, version=i % 3) for i in range(40)])
        taken: list[list[int]] = []

        def reader(buf: SQLBuffer = buf, taken: list[list[int]] = taken) -> None:
            while True:
                try:
                    taken.append(ids(buf.get(5, timeout=0.1)))
                except BufferTimeout:
                    return

        threads = [threading.Thread(target=reader) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        flat = [i for batch in taken for i in batch]
        assert sorted(flat) == sorted(list(range(40)) * 2), kind
        assert all(len(set(batch)) == 5 for batch in taken), kind


# -- staleness --------------------------------------------------------------------------------------


def test_max_staleness_drops_and_reports_staleness(make):
    buf = make(max_staleness=1)
    buf.put([exp(i, version=v) for i, v in enumerate([0, 1, 2, 3, 1, 3])])
    assert ids(buf.get(2, current_version=3, timeout=0)) == [2, 3]  # floor 3 - 1 = 2 drops 0, 1 and 4
    m = buf.metrics()
    assert m["buffer/dropped_stale"] == 3.0 and m["buffer/size"] == 1.0
    assert m["buffer/staleness_mean"] == 0.5 and m["buffer/staleness_max"] == 1.0
    buf.put([exp(6, version=2)])
    assert ids(buf.get(1, min_version=3, current_version=3, timeout=0)) == [5]  # min_version wins: 3 > 2
    assert buf.metrics()["buffer/dropped_stale"] == 4.0
    buf.put([exp(7, version=0)])
    assert ids(buf.get(1, timeout=0)) == [7]  # no current_version: no bound, no staleness metrics
    assert "buffer/staleness_mean" not in buf.metrics()


def test_current_version_without_max_staleness_only_measures(make):
    buf = make()
    buf.put([exp(0, version=0), exp(1, version=4)])
    assert ids(buf.get(2, current_version=5, timeout=0)) == [0, 1]
    m = buf.metrics()
    assert (m["buffer/dropped_stale"], m["buffer/staleness_mean"], m["buffer/staleness_max"]) == (
        0.0,
        3.0,
        5.0,
    )


# -- pending timeout ------------------------------------------------------------------------------


def test_pending_timeout_drops_late_rewards(make):
    clock = FakeClock()
    buf = make(pending_timeout=10.0, pending_action="drop", clock=clock)
    p0 = exp(0, reward=None)
    buf.put([p0])
    clock.now = 5.0
    p1 = exp(1, reward=None)
    buf.put([p1, exp(2)])
    clock.now = 10.0  # p0 is exactly 10 s old: not yet expired
    assert ids(buf.get(1, timeout=0)) == [2]
    assert buf.metrics()["buffer/pending"] == 2.0 and buf.metrics()["buffer/pending_expired"] == 0.0
    clock.now = 10.5
    assert buf.metrics() == {
        "buffer/size": 0.0,
        "buffer/pending": 1.0,
        "buffer/dropped_stale": 0.0,  # an expired pending experience is not stale
        "buffer/pending_expired": 1.0,
    }
    assert buf.set_rewards({p0.id: 1.0}) == 0  # too late
    clock.now = 16.0
    with pytest.raises(BufferTimeout, match="only 0 of 1 .*0 pending"):
        buf.get(1, timeout=0)  # get expires p1 too
    assert buf.metrics()["buffer/pending_expired"] == 2.0 and buf.set_rewards({p1.id: 1.0}) == 0


def test_pending_timeout_default_reward_makes_them_trainable(make):
    clock = FakeClock()
    buf = make(pending_timeout=10.0, pending_action="default", default_reward=-1.0, clock=clock)
    buf.put([exp(0, reward=None), exp(1, reward=None, run_id="r1"), exp(2, reward=0.5)])
    assert buf.set_rewards({("t1", "r1"): 2.0}) == 1
    clock.now = 11.0
    got = buf.get(3, timeout=0)
    assert ids(got) == [0, 1, 2] and [e.reward for e in got] == [-1.0, 2.0, 0.5]
    assert buf.metrics()["buffer/pending_expired"] == 1.0 and buf.metrics()["buffer/pending"] == 0.0


def test_sql_expired_rows_are_marked(tmp_path, request):
    clock = FakeClock()
    make = Storages("sqlite", tmp_path, request)
    buf = make(pending_timeout=1.0, clock=clock)
    buf.put([exp(0, reward=None), exp(1, version=0)])
    clock.now = 2.0
    with pytest.raises(BufferTimeout):
        buf.get(1, min_version=1, timeout=0)  # expires 0, drops 1 as stale
    rows = make.sql("SELECT reward_status, reward, expired_at FROM T ORDER BY seq")
    assert rows == [("dropped", None, 2.0), ("dropped", 1.0, None)]
    m = buf.metrics()
    assert (m["buffer/dropped_stale"], m["buffer/pending_expired"]) == (1.0, 1.0)
    assert (buf.dropped_stale, buf.pending_expired) == (1, 1)


# -- whole groups ---------------------------------------------------------------------------------


def test_whole_groups_wait_for_pending_members_and_stay_together(make):
    buf = make(whole_groups=True)
    a1 = exp(1, reward=None, group_id="A")
    buf.put(
        [exp(0, group_id="A"), a1, exp(2, group_id="A"), exp(3, group_id="B"), exp(4), exp(5, group_id="B")]
    )
    with pytest.raises(
        BufferTimeout, match="only 3 of 4 .*1 pending a reward, 2 waiting for a cooldown or their group"
    ):
        buf.get(4, timeout=0)
    assert ids(buf.get(3, timeout=0)) == [3, 5, 4]  # group B together, then the ungrouped 4
    assert buf.set_rewards({a1.id: 0.0}) == 1
    assert ids(buf.get(3, timeout=0)) == [0, 1, 2]
    # only a batch boundary splits a group; the rest keeps its place (by its first member)
    buf.put([exp(6, group_id="C"), exp(7, group_id="D"), exp(8, group_id="C"), exp(9, group_id="C")])
    assert ids(buf.get(2, timeout=0)) == [6, 8]
    assert ids(buf.get(2, timeout=0)) == [7, 9]


def test_whole_groups_with_priority_and_expired_members(make):
    clock = FakeClock()
    buf = make(whole_groups=True, sampler="priority", pending_timeout=5.0, clock=clock)
    buf.put([exp(0, group_id="A", version=0), exp(1, group_id="A", version=0, reward=None)])
    buf.put(
        [exp(2, group_id="B", version=1), exp(3, group_id="C", version=2), exp(4, group_id="B", version=0)]
    )
    # C (priority 2) first, then B (its best member has 1); A waits for its pending member
    assert ids(buf.get(3, timeout=0)) == [3, 2, 4]
    with pytest.raises(BufferTimeout):
        buf.get(1, timeout=0)
    clock.now = 6.0  # the pending member is dropped: the rest of A may go
    assert ids(buf.get(1, timeout=0)) == [0]


# -- options, state --------------------------------------------------------------------------------


def test_bad_options_name_the_value(tmp_path):
    cases = [  # the field, the expectation and the value
        ({"sampler": "lifo"}, "sampler\n.*'fifo' or 'priority'.*input_value='lifo'"),
        ({"reuse_limit": 2}, "reuse_limit=2 needs sampler='priority'"),
        (
            {"sampler": "priority", "reuse_limit": 0},
            "reuse_limit\n.*greater than or equal to 1.*input_value=0",
        ),
        ({"cooldown": -1}, "cooldown\n.*greater than or equal to 0.*input_value=-1"),
        ({"max_staleness": 1.5}, "max_staleness\n.*valid integer.*input_value=1.5"),
        ({"pending_timeout": 0}, "pending_timeout\n.*greater than 0.*input_value=0"),
        ({"pending_action": "keep"}, "pending_action\n.*'drop' or 'default'.*input_value='keep'"),
    ]
    for options, message in cases:
        with pytest.raises(ValueError, match=message):
            SamplingRules(**options)
    with pytest.raises(ValueError, match="capacity"):
        FileBuffer(tmp_path / "x.jsonl", capacity=3)


def test_rules_helpers():
    rules = SamplingRules(sampler="priority", reuse_decay=0.5, cooldown=2, max_staleness=3)
    assert rules.floor(None, None) is None and rules.floor(None, 10) == 7 and rules.floor(8, 10) == 8
    assert rules.priority(4, 3) == 2.5
    assert rules.cooled_down(None, 1) and not rules.cooled_down(1, 3) and rules.cooled_down(1, 4)
    assert arrange([1, 2, 3], 4) is None
    assert arrange(["a1", "b1", "a2", "c1"], 3, lambda s: s[0]) == ["a1", "a2", "b1"]


def _reopen(make: Storages, first: Any, options: dict[str, Any]) -> Any:
    if make.kind == "memory":
        return MemoryBuffer(**storage_options(**options))
    if make.kind == "file":
        first.close()
    return make(**options)


def test_state_round_trip_keeps_counters_and_replay_state(make):
    clock = FakeClock()
    options = dict(
        sampler="priority", reuse_limit=2, cooldown=1, max_staleness=1, pending_timeout=10.0, clock=clock
    )
    buf = make(**options)
    buf.put([exp(0, version=1), exp(1, version=2), exp(2, version=0), exp(3, version=2, reward=None)])
    assert ids(buf.get(1, current_version=2, timeout=0)) == [1]  # drops 2 (version 0 < 2 - 1)
    clock.now = 11.0
    expected = {
        "buffer/size": 2.0,
        "buffer/pending": 0.0,
        "buffer/dropped_stale": 1.0,
        "buffer/pending_expired": 1.0,  # 3 expired
        "buffer/reuse": 1.0,
        "buffer/staleness_mean": 0.0,
        "buffer/staleness_max": 0.0,
    }
    assert buf.metrics() == expected
    state = buf.state_dict()
    again = _reopen(make, buf, options)
    again.load_state_dict(state)
    assert again.metrics() == expected
    # 1 is still cooling down from get 1; then it goes with priority 1 (ties: older 0 has 1 too)
    assert [ids(again.get(1, timeout=0)) for _ in range(3)] == [[0], [1], [0]]
    assert again.metrics()["buffer/reuse"] == 2.0 and len(again) == 0


def test_sql_adds_columns_missing_from_an_older_table(tmp_path):
    path = tmp_path / "old.db"
    SQLBuffer(path).put([exp(0)])
    con = sqlite3.connect(path)
    con.execute("DROP INDEX ix_experiences_last_get")
    con.execute("ALTER TABLE experiences DROP COLUMN last_get")
    con.execute("ALTER TABLE experiences DROP COLUMN expired_at")
    con.commit()
    buf = SQLBuffer(path, rules=SamplingRules(sampler="priority", reuse_limit=2))
    assert ids(buf.get(1, timeout=0)) == [0] and ids(buf.get(1, timeout=0)) == [0]
    columns = {r[1] for r in con.execute("PRAGMA table_info(experiences)")}
    assert {"last_get", "expired_at"} <= columns
    buf.close()
