"""The annotation queue (trine.feedback.queue), landing answers in a real SQL buffer, Label Studio JSON.

The queue's own tests run on a SQLite file and, with ``export TRINE_TEST_POSTGRES_URL="$(scripts/postgres.sh)"``,
on PostgreSQL too.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
import uuid

import pytest

from tests.helpers import pending
from trine.buffer.sql import SQLBuffer
from trine.feedback.labelstudio import PAIR_CONFIG, RATE_CONFIG, export_tasks, import_tasks
from trine.feedback.landing import land
from trine.feedback.queue import AnnotationQueue, AnswerConflict, Item, queue_url
from trine.types import Experience


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


PG_URL = os.environ.get("TRINE_TEST_POSTGRES_URL")
needs_pg = pytest.mark.skipif(not PG_URL, reason="PostgreSQL variant: set TRINE_TEST_POSTGRES_URL")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=needs_pg)])
def where(request, tmp_path) -> tuple[str, str]:
    """(url, table) of a fresh queue: a SQLite file, or a new table in the PostgreSQL test database."""
    if request.param == "sqlite":
        yield queue_url(tmp_path), "annotation_items"
        return
    table = f"ann_{uuid.uuid4().hex[:10]}"
    yield PG_URL, table
    import sqlalchemy as sa

    engine = sa.create_engine(PG_URL)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"DROP TABLE IF EXISTS {table}")
    engine.dispose()


@pytest.fixture
def queue(where, clock) -> AnnotationQueue:
    q = AnnotationQueue(where[0], clock=clock, table=where[1])
    yield q
    q.close()


def rate_item(text: str = "4", exp_id: str | None = None, scale=(0.0, 1.0)) -> Item:
    return Item("rate", "2+2?", [{"text": text, "experience_id": exp_id}], scale=scale)


def pair_item(a: str = "4", b: str = "5", ids=(None, None), tokens=((7, 8), (9,))) -> Item:
    responses = [
        {"text": a, "experience_id": ids[0], "tokens": list(tokens[0])},
        {"text": b, "experience_id": ids[1], "tokens": list(tokens[1])},
    ]
    return Item("pair", "2+2?", responses, meta={"prompt_tokens": [1, 2, 3], "task_id": "t0"})


def test_post_is_one_transaction_and_checks_items(queue):
    first = rate_item()
    batch = queue.post([first, rate_item()], timeout=60)
    assert queue.counts()["open"] == 2
    assert queue.batches() == [
        {"batch": batch, "created": 1000.0, "items": 2, "open": 2, "claimed": 0, "answered": 0, "expired": 0}
    ]
    # the second item reuses an id: the insert fails and the new first item is not kept either
    again = Item("rate", "p", [{"text": "x"}], id=first.id)
    with pytest.raises(ValueError, match="(?s)is already in the queue .*nothing was posted"):
        queue.post([rate_item(), again])
    assert queue.counts()["open"] == 2 and len(queue.batches()) == 1
    with pytest.raises(ValueError, match="needs exactly 2 response"):
        queue.post([rate_item(), Item("pair", "p", [{"text": "only one"}])])
    with pytest.raises(ValueError, match="kind='grade'"):
        queue.post([Item("grade", "p", [{"text": "x"}])])
    assert sum(queue.counts()[s] for s in ("open", "claimed", "answered", "expired")) == 2


def test_claims_are_disjoint_and_own_claims_come_back_first(queue):
    queue.post([rate_item(str(i)) for i in range(5)])
    alice = queue.claim("alice", 2)
    bob = queue.claim("bob", 2)
    assert {i.id for i in alice}.isdisjoint(i.id for i in bob)
    assert [i.responses[0]["text"] for i in alice] == ["0", "1"]  # oldest first
    again = queue.claim("alice", 3)
    assert [i.id for i in again[:2]] == [i.id for i in alice]  # her own claims first, then the last open one
    assert again[2].responses[0]["text"] == "4"
    assert queue.claim("carol", 5) == []
    assert queue.counts()["claimed"] == 5


def test_answering_twice_is_a_conflict_and_changes_nothing(queue, clock):
    queue.post([rate_item()])
    (item,) = queue.claim("alice", 1)
    assert queue.answer("alice", {item.id: {"rating": 0.5}})[0].answer == {"rating": 0.5}
    clock.now += 5
    with pytest.raises(AnswerConflict) as info:
        queue.answer("alice", {item.id: {"rating": 1.0}})
    assert info.value.items == [item.id] and "already answered by alice" in info.value.why[item.id]
    (stored,) = queue.items()
    assert stored.answer == {"rating": 0.5} and stored.answered_at == 1000.0


def test_a_batch_with_one_bad_answer_keeps_nothing(queue):
    queue.post([rate_item(), rate_item(), pair_item(), rate_item()])
    mine = queue.claim("alice", 3)
    (theirs,) = queue.claim("bob", 1)
    answers = {
        mine[0].id: {"rating": 0.25},
        mine[1].id: {"rating": 7},  # outside the scale
        mine[2].id: {"choice": "a"},
        theirs.id: {"rating": 1.0},  # claimed by bob
        "ann-nope": {"rating": 1.0},
    }
    with pytest.raises(AnswerConflict) as info:
        queue.answer("alice", answers)
    assert set(info.value.items) == {mine[1].id, theirs.id, "ann-nope"}
    assert "outside the item's scale [0.0, 1.0]" in info.value.why[mine[1].id]
    assert "claimed by bob" in info.value.why[theirs.id]
    assert queue.counts()["answered"] == 0 and queue.counts()["claimed"] == 4
    with pytest.raises(AnswerConflict, match="choice='c'"):
        queue.answer("alice", {mine[2].id: {"choice": "c"}})
    assert len(queue.answer("alice", {mine[0].id: {"rating": 0.25}, mine[2].id: {"choice": "tie"}})) == 2
    assert queue.counts() | {} == {
        "open": 0, "claimed": 2, "answered": 2, "expired": 0, "landed": 0, "ties": 1, "lost": 0
    }  # fmt: skip


def test_claims_past_their_lease_go_back_to_open(queue, clock):
    queue.post([rate_item(), rate_item()])
    alice = queue.claim("alice", 2, lease=10)
    clock.now += 11
    assert queue.counts()["open"] == 2
    bob = queue.claim("bob", 2)
    assert [i.id for i in bob] == [i.id for i in alice]
    with pytest.raises(AnswerConflict, match="claimed by bob"):
        queue.answer("alice", {alice[0].id: {"rating": 1.0}})
    assert len(queue.answer("bob", {bob[0].id: {"rating": 1.0}})) == 1


def test_items_past_their_timeout_expire_and_are_counted(queue, clock):
    queue.post([rate_item(), rate_item(), rate_item()], timeout=5)
    queue.post([rate_item()])  # no timeout: never expires
    (claimed,) = queue.claim("alice", 1)
    clock.now += 6
    assert queue.counts()["expired"] == 3  # counted before anyone expires them
    with pytest.raises(AnswerConflict, match="expired"):
        queue.answer("alice", {claimed.id: {"rating": 1.0}})
    assert queue.expire() == 3
    assert queue.expire() == 0
    left = queue.claim("bob", 5)
    assert len(left) == 1 and left[0].expires_at is None
    assert queue.counts()["expired"] == 3 and [b["expired"] for b in queue.batches()] == [3, 0]


def _claimer(url: str, table: str, name: str, start, results) -> None:
    queue = AnnotationQueue(url, table=table)  # opens its own connections
    start.wait(30)  # both processes are connected: they compete for every claim
    got = []
    while True:
        items = queue.claim(name, 2)
        if not items:
            break
        time.sleep(0.002)  # a person reads the items; the other process claims meanwhile
        queue.answer(name, {i.id: {"rating": 1.0} for i in items})
        got += [i.id for i in items]
    results.put(got)


def test_two_processes_claiming_at_once_never_get_the_same_item(where):
    url, table = where
    queue = AnnotationQueue(url, table=table)
    items = [rate_item(str(i)) for i in range(120)]
    for i in range(0, 120, 30):
        queue.post(items[i : i + 30])
    ctx = mp.get_context("fork")
    start, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(url, table, f"p{i}", start, results)) for i in range(2)]
    for p in procs:
        p.start()
    got = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0]
    assert got[0] and got[1], "both processes should have claimed some items"
    assert set(got[0]).isdisjoint(got[1])
    assert sorted(got[0] + got[1]) == sorted(i.id for i in items)
    assert queue.counts()["answered"] == 120
    queue.close()


def _rewards(url: str) -> dict[str, float | None]:
    from trine.buffer.inspect import _sql_rows

    return {e.id: e.reward for e, _ in _sql_rows(url, "experiences")}


def test_landing_ratings_pairs_ties_retries_and_losses(tmp_path, queue, clock):
    buffer = SQLBuffer(f"sqlite:///{tmp_path / 'buffer.db'}", clock=clock)
    prefs = SQLBuffer(buffer.url, table="preferences", clock=clock)
    buffer.put([pending("e1", group_id="g"), pending("e2", group_id="g"), pending("e3", (9,), group_id="g")])
    rated, later, never = rate_item(exp_id="e1"), rate_item(exp_id="e9"), rate_item(exp_id="e-gone")
    pair, tie = pair_item(ids=("e2", "e3")), pair_item(ids=("e4", "e5"))
    queue.post([rated, later, never, pair, tie], timeout=100)
    items = queue.claim("alice", 5)
    queue.answer(
        "alice",
        {rated.id: {"rating": 0.75}, later.id: {"rating": 0.25}, never.id: {"rating": 1.0},
         pair.id: {"choice": "b"}, tie.id: {"choice": "tie"}},
    )  # fmt: skip
    assert len(items) == 5
    counts = land(queue, buffer, prefs, grace=30)
    assert counts == {
        "rated": 1,
        "pairs": 1,
        "preferences": 2,
        "ties": 1,
        "waiting": 2,
        "lost": 0,
        "skipped": 0,
    }
    assert _rewards(buffer.url) == {"e1": 0.75, "e2": 0.0, "e3": 1.0}  # b (e3) chosen
    rows = prefs.get(2, timeout=1)
    by_id = {e.id: e for e in rows}
    assert set(by_id) == {f"{pair.id}-chosen", f"{pair.id}-rejected"}
    chosen = by_id[f"{pair.id}-chosen"]
    assert chosen.tokens == [1, 2, 3, 9] and chosen.prompt_length == 3 and chosen.action_mask == [1]
    assert chosen.kind == "preference" and chosen.group_id == f"pair:{pair.id}" and chosen.reward == 0.0
    assert chosen.info["chosen"] is True and chosen.info["annotator"] == "alice"
    assert by_id[f"{pair.id}-rejected"].tokens == [1, 2, 3, 7, 8]
    # the explorer puts e9 after the answer: the next pass lands it; nothing lands twice
    buffer.put([pending("e9", group_id="g")])
    again = land(queue, buffer, prefs, grace=30)
    assert again == {
        "rated": 1,
        "pairs": 0,
        "preferences": 0,
        "ties": 0,
        "waiting": 1,
        "lost": 0,
        "skipped": 0,
    }
    assert _rewards(buffer.url)["e9"] == 0.25
    assert len(SQLBuffer(buffer.url, table="preferences")) == 0  # the two rows were taken; none added
    # e-gone never arrives: after the item's expiry (and the grace after the answer) it is lost
    clock.now += 101
    assert land(queue, buffer, prefs, grace=30)["lost"] == 1
    assert queue.counts() | {} == {
        "open": 0, "claimed": 0, "answered": 5, "expired": 0, "landed": 3, "ties": 1, "lost": 1
    }  # fmt: skip
    assert queue.unlanded() == []
    assert land(queue, buffer, prefs) == dict.fromkeys(counts, 0)
    buffer.close()
    prefs.close()


def test_a_pair_put_by_another_lander_is_not_put_twice(tmp_path, queue):
    prefs = SQLBuffer(f"sqlite:///{tmp_path / 'buffer.db'}", table="preferences")
    pair = pair_item()
    pair.meta["await_rewards"] = False
    queue.post([pair])
    queue.claim("alice", 1)
    queue.answer("alice", {pair.id: {"choice": "a"}})
    other = AnnotationQueue(
        queue.url, table=queue.table_name
    )  # another process's view, landing the same item first
    assert land(other, None, prefs)["preferences"] == 2
    assert land(queue, None, prefs)["preferences"] == 0
    assert len(prefs) == 2
    prefs.close()


def test_label_studio_export_import_round_trip(tmp_path, queue):
    pair, tie, rated, waiting = pair_item(), pair_item("x", "y"), rate_item(scale=(1.0, 5.0)), rate_item()
    queue.post([pair, tie, rated, waiting])
    queue.claim("alice", 3)
    queue.answer("alice", {pair.id: {"choice": "b"}, tie.id: {"choice": "tie"}, rated.id: {"rating": 4.0}})
    tasks = json.loads(json.dumps(export_tasks(queue)))
    assert [t["meta"]["trine_item"] for t in tasks] == [pair.id, tie.id, rated.id, waiting.id]
    assert tasks[0]["data"] == {"prompt": "2+2?", "response_a": "4", "response_b": "5"}
    (result,) = tasks[0]["annotations"][0]["result"]
    assert result["type"] == "pairwise" and result["value"] == {"selected": "right"}
    assert tasks[2]["annotations"][0]["result"][0]["value"] == {"rating": 4}
    assert tasks[3]["annotations"] == [] and tasks[3]["data"]["response"] == "4"
    assert "<Pairwise" in PAIR_CONFIG and "<Rating" in RATE_CONFIG
    # someone answers the waiting item in Label Studio (0.75 on (0, 1) is star 4 of 5)
    tasks[3]["annotations"] = [
        {"completed_by": {"id": 3, "email": "dana@example.org"}, "was_cancelled": False,
         "result": [{"from_name": "rating", "to_name": "response", "type": "rating", "value": {"rating": 4}}]}
    ]  # fmt: skip
    assert import_tasks(queue, tasks) == {"posted": 0, "answered": 1, "skipped": 0, "errors": []}
    (answered,) = queue.items(ids=[waiting.id])
    assert answered.answer == {"rating": 0.75} and answered.annotator == "dana@example.org"
    # into an empty queue: the same items and answers
    fresh = AnnotationQueue(queue_url(tmp_path / "other"))
    assert import_tasks(fresh, tasks)["posted"] == 4
    got = {i.id: (i.kind, i.answer, i.annotator) for i in fresh.items()}
    assert got == {
        pair.id: ("pair", {"choice": "b"}, "alice"),
        tie.id: ("pair", {"choice": "tie"}, "alice"),
        rated.id: ("rate", {"rating": 4.0}, "alice"),
        waiting.id: ("rate", {"rating": 0.75}, "dana@example.org"),
    }
    # a task made in Label Studio (no trine_item) becomes a new item; a cancelled annotation is no answer
    made = [
        {"id": 9, "data": {"prompt": "p", "response_a": "x", "response_b": "y"},
         "annotations": [{"was_cancelled": True, "completed_by": 1,
                          "result": [{"type": "pairwise", "value": {"selected": "left"}}]}]},
        {"id": 10, "data": {"prompt": "p", "response": "r"},
         "annotations": [{"completed_by": 2, "result": [{"type": "number", "value": {"number": 0.3}}]}]},
    ]  # fmt: skip
    assert import_tasks(fresh, made) == {"posted": 2, "answered": 1, "skipped": 0, "errors": []}
    new = fresh.items(limit=2, newest_first=True)
    assert [(i.kind, i.answer, i.annotator) for i in new] == [
        ("rate", {"rating": 0.3}, "labelstudio-2"),
        ("pair", None, None),
    ]
    with pytest.raises(ValueError, match="data keys \\['text'\\]"):
        import_tasks(fresh, [{"data": {"text": "?"}}])
    fresh.close()


def test_trine_annotate_posts_once_lands_and_round_trips_label_studio(tmp_path, tiny_model_dir):
    from typer.testing import CliRunner

    from trine.cli import app
    from trine.models import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    prompt = tok.encode("2+2=")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(f"model:\n  path: {tiny_model_dir}\nbuffer:\n  storage: sql\n")
    buffer = SQLBuffer(f"sqlite:///{run / 'buffer.db'}")
    group = [
        Experience(
            tokens=prompt + r, prompt_length=len(prompt), action_mask=[1] * len(r),
            group_id="g0", id=f"x{i}", info={"response": f"resp {i}"},
        )
        for i, r in enumerate([[5, 6], [7], [5, 6], [8, 9]])
    ]  # fmt: skip
    buffer.put(group)
    runner = CliRunner()

    def cli(*args: str) -> str:
        result = runner.invoke(app, ["annotate", *args])
        assert result.exit_code == 0, result.output
        return result.output

    assert "posted 3 items in 2 batch(es)" in cli("rate", str(run), "--limit", "3", "--batch-size", "2")
    assert "posted 1 items in 1 batch(es)" in cli("rate", str(run))  # the fourth only: never twice
    assert "nothing to post" in cli("rate", str(run))
    queue = AnnotationQueue(queue_url(run))
    items = queue.items()
    assert items[0].prompt == tok.decode(prompt) and items[0].responses[0]["text"] == "resp 0"
    assert "posted 1 items" in cli("pairs", str(run))  # x0 and x2 share a response: x0-x1 only
    assert "posted 1 items" in cli("pairs", str(run))  # then x2-x3
    assert "nothing to post" in cli("pairs", str(run))
    pair, _ = queue.items(status="open", limit=10)[-2:]
    assert pair.kind == "pair" and [r["experience_id"] for r in pair.responses] == ["x0", "x1"]
    assert pair.meta["prompt_tokens"] == prompt and pair.meta["await_rewards"] is True
    assert "open: 6" in cli("status", str(run))

    ratings = [i for i in queue.claim("alice", 4) if i.responses[0]["experience_id"] in ("x2", "x3")]
    queue.answer("alice", {i.id: {"rating": 0.5} for i in ratings})  # x0, x1: claimed, not answered
    assert "rated: 2" in cli("land", str(run))
    out = tmp_path / "ls.json"
    assert "wrote 6 Label Studio tasks" in cli("export", str(run), str(out))
    tasks = json.loads(out.read_text())
    pair_task = next(t for t in tasks if t["meta"]["trine_item"] == pair.id)
    pair_task["annotations"] = [
        {"completed_by": 7, "result": [{"type": "pairwise", "value": {"selected": "left"}}]}
    ]
    out.write_text(json.dumps(tasks))
    assert "answered 1" in cli("import", str(run), str(out))
    assert _rewards(buffer.url) == {"x0": 1.0, "x1": 0.0, "x2": 0.5, "x3": 0.5}
    prefs = SQLBuffer(buffer.url, table="preferences")
    assert len(prefs) == 2 and {e.info["annotator"] for e in prefs.get(2, timeout=1)} == {"labelstudio-7"}
    prefs.close()
    buffer.close()
    queue.close()
