"""The task ledger of a SQL buffer (:mod:`trine.buffer.sql_tasks`) and the explorers' claims on it
(:mod:`trine.explorer.claims`): pulled work without overlap or loss, leases that expire, a restart that
reopens its claims, and tasks dropped as stale explored again up to ``stale_retries`` times."""

from __future__ import annotations

import os
import uuid

import pytest

from tests.helpers import exp
from trine.buffer import SQLBuffer
from trine.buffer.sampling import SamplingRules
from trine.explorer.claims import TaskClaims, TaskStream
from trine.tasks import TaskScheduler
from trine.types import Task

PG_URL = os.environ.get("TRINE_TEST_POSTGRES_URL")
needs_pg = pytest.mark.skipif(
    not PG_URL,
    reason='PostgreSQL variant: set TRINE_TEST_POSTGRES_URL (export TRINE_TEST_POSTGRES_URL="$(scripts/postgres.sh)")',
)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=needs_pg)])
def make(request, tmp_path):
    """``make(**kwargs)``: a SQLBuffer on SQLite (a file in tmp_path) or PostgreSQL (a table of its own,
    dropped after the test)."""
    made: list[SQLBuffer] = []

    def build(**kwargs) -> SQLBuffer:
        if request.param == "sqlite":
            buffer = SQLBuffer(tmp_path / "b.db", **kwargs)
        else:
            buffer = SQLBuffer(PG_URL, table=f"t_{uuid.uuid4().hex[:12]}", **kwargs)
        made.append(buffer)
        return buffer

    yield build
    for buffer in made:
        if request.param == "postgres":
            import sqlalchemy as sa

            buffer._engines()
            with buffer._engine.begin() as conn:
                for suffix in ("", "_batches", "_tasks"):
                    conn.execute(sa.text(f"DROP TABLE IF EXISTS {buffer.table_name}{suffix}"))
        buffer.close()


TASKS = [Task(task_id=str(i), question=f"{i}?", answer=str(i)) for i in range(23)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def explorer(buffer: SQLBuffer, name: str, lease: float = 60.0) -> TaskClaims:
    """An explorer's claims over its own copy of the seeded stream, drawn 4 at a time."""
    return TaskClaims(buffer, TaskStream(TaskScheduler(TASKS, seed=3, epochs=1), 4, name), name, lease)


def rows_of(claims: TaskClaims, tasks: list[Task], version: int = 0) -> list:
    """Two rows per task, tagged with its place in the stream as a streaming explorer tags them."""
    return [
        exp(10 * claims.seq(t) + k, task_id=t.task_id, version=version, info={"task_seq": claims.seq(t)})
        for t in tasks
        for k in range(2)
    ]


def put(buffer: SQLBuffer, claims: TaskClaims, tasks: list[Task], batch: int, version: int = 0) -> None:
    rows = rows_of(claims, tasks, version)
    buffer.put(rows, producer=claims.owner, producer_batch=batch, claims=claims.finish(tasks))


def test_explorers_pull_the_shared_stream_without_overlap_or_loss(make):
    buffer = make()
    fast, slow = explorer(buffer, "explorer-0"), explorer(buffer, "explorer-1")
    order = [t.task_id for t in TaskScheduler(TASKS, seed=3, epochs=1).next_batch(23)]
    got: dict[str, list[str]] = {"explorer-0": [], "explorer-1": []}
    batch = {"explorer-0": 0, "explorer-1": 0}
    while True:  # the fast explorer claims three tasks for each one of the slow one
        took = 0
        for claims, n in ((fast, 3), (slow, 1)):
            tasks = claims.claim(n)
            took += len(tasks)
            got[claims.owner] += [t.task_id for t in tasks]
            if tasks:
                put(buffer, claims, tasks, batch[claims.owner])
                batch[claims.owner] += 1
        if not took:
            break
    assert sorted(got["explorer-0"] + got["explorer-1"]) == sorted(order)  # each task once
    assert len(got["explorer-0"]) > 2 * len(got["explorer-1"])  # pulled, not split: the fast one did more
    assert buffer.task_counts() == {"claimed": 0, "done": 23, "open": 0, "lost": 0, "retried": 0}
    assert len(buffer) == 46


def test_a_dead_explorers_claims_expire_and_its_late_put_stores_nothing(make):
    clock = Clock()
    buffer = make(clock=clock)
    hung, alive = explorer(buffer, "explorer-0", lease=10), explorer(buffer, "explorer-1", lease=10)
    held = hung.claim(2)
    assert alive.claim(2)[0].task_id != held[0].task_id  # held tasks are not handed out twice
    clock.now += 11  # hung's lease ran out
    retaken = alive.claim(2)
    assert [t.task_id for t in retaken] == [t.task_id for t in held]
    put(buffer, hung, held, 0)  # it wakes up and puts: its claims are no longer current
    assert len(buffer) == 0 and buffer.taken_over == 4
    put(buffer, alive, retaken, 0)
    assert len(buffer) == 4


def test_renewed_claims_do_not_expire(make):
    clock = Clock()
    buffer = make(clock=clock)
    slow, other = explorer(buffer, "explorer-0", lease=9), explorer(buffer, "explorer-1", lease=9)
    held = slow.claim(2)
    for _ in range(3):  # a slow explorer whose event loop runs renews its claims
        clock.now += 6
        slow._renewed -= 3
        slow.renew()
    assert {t.task_id for t in other.claim(2)}.isdisjoint(t.task_id for t in held)


def test_a_restarted_explorer_reopens_what_it_never_put(make):
    buffer = make()
    first = explorer(buffer, "explorer-0")
    held = first.claim(3)  # then killed -9
    again = explorer(buffer, "explorer-0")  # the same explorer, started again
    assert again.reopen() == 3
    assert [t.task_id for t in again.claim(3)] == [t.task_id for t in held]


def test_tasks_dropped_as_stale_come_back_until_their_retries_run_out(make):
    rules = SamplingRules(max_staleness=1, stale_retries=1)
    buffer = make(rules=rules)
    claims = explorer(buffer, "explorer-0")
    (task,) = claims.claim(1)
    put(buffer, claims, [task], 0, version=0)
    buffer.put([exp(999, version=5)])  # a fresh row: the get drops the stale ones and takes it
    buffer.get(1, current_version=5, timeout=1)
    assert buffer.dropped_stale == 2 and buffer.tasks_retried == 1
    (again,) = claims.claim(1)  # the same task, explored again with newer weights
    assert again.task_id == task.task_id and claims.retried == 1
    put(buffer, claims, [again], 1, version=2)
    buffer.put([exp(998, version=9)])
    buffer.get(1, current_version=9, timeout=1)  # stale again: out of retries, counted lost
    assert buffer.tasks_lost == 1 and buffer.task_counts()["lost"] == 1
    assert buffer.metrics()["buffer/tasks_lost"] == 1.0
    assert claims.claim(1)[0].task_id != task.task_id


def test_a_rewind_keeps_rows_dropped_as_stale_whose_task_was_explored_again(make):
    """A trainer process resumed from its checkpoint gives back what it dropped since, except rows whose task
    an explorer explored again meanwhile (the newer rows stand for it: nothing is trained twice)."""
    rules = SamplingRules(max_staleness=1)
    buffer = make(rules=rules, rewind="reads")
    claims = explorer(buffer, "explorer-0")
    tasks = claims.claim(2)
    put(buffer, claims, tasks, 0, version=0)
    state = buffer.state_dict()  # the trainer's checkpoint
    buffer.put([exp(999, version=5)])
    buffer.get(1, current_version=5, timeout=1)  # drops the four rows, both tasks open again
    (first,) = claims.claim(1)
    put(buffer, claims, [first], 1, version=5)  # one is explored again; the other is not yet
    buffer.load_state_dict(state)
    # given back: the fresh row taken since and the two rows of the task not explored again (done again);
    # the first task's dropped rows stay dropped, its new rows stand for it
    assert buffer.last_rewind["restored"] == 3 and len(buffer) == 3 + 2
    assert buffer.task_counts() == {"claimed": 0, "done": 2, "open": 0, "lost": 0, "retried": 1}


@pytest.fixture(params=["memory", "file", "sqlite"])
def any_buffer(request, tmp_path):
    """``any_buffer(rules)``: each built-in storage, for the stale-task reports of an explorer in one process."""
    from trine.buffer import FileBuffer, MemoryBuffer

    def build(rules: SamplingRules):
        if request.param == "memory":
            return MemoryBuffer(rules=rules)
        if request.param == "file":
            return FileBuffer(tmp_path / "b.jsonl", rules=rules)
        return SQLBuffer(tmp_path / "b.db", rules=rules)

    return build


def _task_rows(task: int, version: int, n: int = 2) -> list:
    return [exp(100 * task + k, version=version, info={"task_seq": task}) for k in range(n)]


def test_a_task_all_of_whose_rows_were_dropped_as_stale_is_reported_once(any_buffer):
    """What a streaming explorer in one process retries (:meth:`ExplorerSide.requeue`): a task whose rows
    were all dropped as stale, none trained; not one trained in part, nor rows without a task number."""
    buffer = any_buffer(SamplingRules(max_staleness=1))
    buffer.put(_task_rows(1, version=0) + _task_rows(2, version=3) + [exp(7, version=0)])
    buffer.get(1, current_version=3, timeout=1)  # drops task 1's rows and the untagged row; takes one of 2's
    assert buffer.take_stale_tasks() == [1] and buffer.take_stale_tasks() == []
    buffer.put(_task_rows(3, version=4))
    buffer.get(2, current_version=5, timeout=1)  # task 2's other row is dropped, task 3 taken
    assert buffer.take_stale_tasks() == []  # task 2 was trained in part: not explored again


def test_stale_task_reports_survive_a_checkpoint():
    from trine.buffer import MemoryBuffer

    buffer = MemoryBuffer(rules=SamplingRules(max_staleness=0))
    buffer.put(_task_rows(1, version=0) + _task_rows(2, version=0) + [exp(9, version=2)])
    state = buffer.state_dict()
    buffer.get(1, current_version=2, timeout=1)
    restored = MemoryBuffer(rules=SamplingRules(max_staleness=0))
    restored.load_state_dict(state)
    restored.get(1, current_version=2, timeout=1)
    assert sorted(restored.take_stale_tasks()) == sorted(buffer.take_stale_tasks()) == [1, 2]


def test_the_same_row_claimed_twice_in_flight_is_held_twice(make):
    """A taskset hands out the same Task object in every epoch: two claims of one row in flight at once are
    still two claims (held apart, put apart), not one that hides the other until its lease runs out."""
    buffer = make()
    two = TaskScheduler(TASKS[:2], seed=0, epochs=3)
    claims = TaskClaims(buffer, TaskStream(two, 2, "explorer-0"), "explorer-0", 60)
    tasks = claims.claim(4)  # rows 0, 1 of epoch 0 and again of epoch 1
    assert len({t.task_id for t in tasks}) == 2 and len(claims.held) == 4
    assert claims.others_in_flight() == 0
    buffer.put(rows_of(claims, tasks), producer="explorer-0", producer_batch=0, claims=claims.finish(tasks))
    assert buffer.task_counts()["done"] == 4 and not claims.held
