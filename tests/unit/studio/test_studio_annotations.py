"""The studio's Annotations API over real HTTP: two annotators, all-or-nothing answers, landing."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from tests.helpers import pending  # noqa: E402
from trine.buffer.inspect import read_rows  # noqa: E402
from trine.buffer.sql import SQLBuffer  # noqa: E402
from trine.feedback.queue import ANNOTATIONS_FILE, AnnotationQueue, Item, queue_url  # noqa: E402
from trine.studio import annotations  # noqa: E402
from trine.studio.server import background  # noqa: E402
from trine.studio.settings import StudioSettings  # noqa: E402
from trine.types import Experience  # noqa: E402

OWNER = {"Authorization": "Bearer owner-token"}
ALICE = {"X-Annotator-Token": "tok-alice"}
BOB = {"X-Annotator-Token": "tok-bob"}


def make_run(runs: Path, name: str, experiences: list[Experience]) -> Path:
    run = runs / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("buffer:\n  storage: sql\n")
    buffer = SQLBuffer(f"sqlite:///{run / 'buffer.db'}")
    buffer.put(experiences)
    buffer.close()
    return run


def rewards(run: Path) -> dict[str, float | None]:
    return {e.id: e.reward for e, _ in read_rows(run)}


def rate(exp_id: str | None) -> Item:
    return Item("rate", "2+2?", [{"text": f"answer of {exp_id}", "experience_id": exp_id}], scale=(0.0, 1.0))


@pytest.fixture
def studio(tmp_path, monkeypatch):
    monkeypatch.setattr(annotations, "LAND_INTERVAL", 0.2)
    settings = StudioSettings(
        runs_dir=tmp_path, token="owner-token", annotators={"tok-alice": "alice", "tok-bob": "bob"}
    )
    with background(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def test_two_annotators_claim_disjoint_items_and_their_answers_reach_the_buffer(tmp_path, studio):
    run = make_run(tmp_path, "r1", [pending(f"e{i}") for i in range(4)])
    queue = AnnotationQueue(queue_url(run))
    queue.post([rate(f"e{i}") for i in range(4)], timeout=3600)
    assert studio.get("/api/annotator", headers=ALICE).json() == {"name": "alice"}
    assert studio.get("/api/annotator", headers={"X-Annotator-Token": "nope"}).status_code == 401
    assert studio.post("/api/runs/r1/annotations/claim", json={"n": 2}).status_code == 401
    a = studio.post("/api/runs/r1/annotations/claim", json={"n": 2}, headers=ALICE).json()
    b = studio.post("/api/runs/r1/annotations/claim", json={"n": 2}, headers=BOB).json()
    assert a["annotator"] == "alice" and b["annotator"] == "bob"
    assert {i["id"] for i in a["items"]}.isdisjoint(i["id"] for i in b["items"])
    first = a["items"][0]
    assert first["kind"] == "rate" and first["scale"] == [0.0, 1.0] and first["responses"][0]["text"]
    assert first["prompt"] == "2+2?" and first["expires_at"] is not None

    # alice answers one of hers and one of bob's: refused, nothing kept
    mixed = [{"item": first["id"], "rating": 1.0}, {"item": b["items"][0]["id"], "rating": 0.0}]
    refused = studio.post("/api/runs/r1/annotations/answer", json={"answers": mixed}, headers=ALICE)
    assert refused.status_code == 409
    detail = refused.json()["detail"]
    assert [i["item"] for i in detail["items"]] == [b["items"][0]["id"]]
    assert "claimed by bob" in detail["items"][0]["why"] and "nothing was kept" in detail["message"]
    assert set(rewards(run).values()) == {None}

    answers = [{"item": i["id"], "rating": 0.25 * n} for n, i in enumerate(a["items"])]
    kept = studio.post("/api/runs/r1/annotations/answer", json={"answers": answers}, headers=ALICE)
    assert kept.status_code == 200 and kept.json() == {"answered": 2, "landed": 2}
    again = studio.post("/api/runs/r1/annotations/answer", json={"answers": answers[:1]}, headers=BOB)
    assert again.status_code == 409 and "already answered by alice" in again.json()["detail"]["message"]
    answers = [{"item": i["id"], "rating": 1.0} for i in b["items"]]
    assert (
        studio.post("/api/runs/r1/annotations/answer", json={"answers": answers}, headers=BOB).status_code
        == 200
    )
    by_item = {i.id: i.responses[0]["experience_id"] for i in queue.items()}
    expected = {by_item[i["id"]]: 0.25 * n for n, i in enumerate(a["items"])}
    expected |= {by_item[i["id"]]: 1.0 for i in b["items"]}
    assert rewards(run) == expected

    assert studio.get("/api/runs/r1/annotations").status_code == 401  # the overview is the owner's
    overview = studio.get("/api/runs/r1/annotations", headers=OWNER).json()
    assert overview["counts"] | {} == {
        "open": 0, "claimed": 0, "answered": 4, "expired": 0, "landed": 4, "ties": 0, "lost": 0
    }  # fmt: skip
    assert overview["batches"][0]["items"] == 4 and len(overview["recent"]) == 4
    assert "tokens" not in overview["recent"][0]["responses"][0]
    queue.close()


def test_pairs_land_as_preference_rows_and_bad_requests_are_named(tmp_path, studio):
    run = make_run(tmp_path, "r2", [pending("a", (5,)), pending("b", (6, 7))])
    queue = AnnotationQueue(queue_url(run))
    responses = [
        {"text": "five", "experience_id": "a", "tokens": [5]},
        {"text": "six seven", "experience_id": "b", "tokens": [6, 7]},
    ]
    pair = Item("pair", "pick", responses, meta={"prompt_tokens": [1, 2, 3]})
    queue.post([pair])
    (item,) = studio.post("/api/runs/r2/annotations/claim", json={"n": 5}, headers=BOB).json()["items"]
    assert item["kind"] == "pair" and [r["text"] for r in item["responses"]] == ["five", "six seven"]
    bad = studio.post(
        "/api/runs/r2/annotations/answer",
        json={"answers": [{"item": item["id"], "choice": "c"}]},
        headers=BOB,
    )
    assert bad.status_code == 409 and "choice='c'" in bad.json()["detail"]["items"][0]["why"]
    twice = [{"item": item["id"], "choice": "a"}, {"item": item["id"], "choice": "b"}]
    assert (
        studio.post("/api/runs/r2/annotations/answer", json={"answers": twice}, headers=BOB).status_code
        == 400
    )
    ok = studio.post(
        "/api/runs/r2/annotations/answer",
        json={"answers": [{"item": item["id"], "choice": "b"}]},
        headers=BOB,
    )
    assert ok.json() == {"answered": 1, "landed": 1}
    assert rewards(run) == {"a": 0.0, "b": 1.0}
    prefs = SQLBuffer(f"sqlite:///{run / 'buffer.db'}", table="preferences")
    rows = {e.info["chosen"]: e for e in prefs.get(2, timeout=1)}
    assert rows[True].tokens == [1, 2, 3, 6, 7] and rows[False].tokens == [1, 2, 3, 5]
    assert rows[True].kind == "preference" and rows[True].info["annotator"] == "bob"
    prefs.close()
    # names never leave the runs directory; a run without a queue reads as empty and gets no file
    assert studio.get("/api/runs/..%2Fx/annotations", headers=OWNER).status_code in (400, 404)
    assert studio.get("/api/runs/.hidden/annotations", headers=OWNER).status_code == 400
    (tmp_path / "empty").mkdir()
    assert studio.get("/api/runs/empty/annotations", headers=OWNER).json()["counts"]["open"] == 0
    assert not (tmp_path / "empty" / ANNOTATIONS_FILE).exists()
    assert studio.post("/api/runs/nope/annotations/claim", json={"n": 1}, headers=BOB).status_code == 404
    queue.close()


def test_answers_given_before_the_experience_arrives_land_in_the_background(tmp_path, studio):
    run = make_run(tmp_path, "r3", [])
    queue = AnnotationQueue(queue_url(run))
    queue.post([rate("late")], timeout=3600)
    (item,) = studio.post("/api/runs/r3/annotations/claim", json={"n": 1}, headers=ALICE).json()["items"]
    answer = {"answers": [{"item": item["id"], "rating": 0.5}]}
    assert studio.post("/api/runs/r3/annotations/answer", json=answer, headers=ALICE).json() == {
        "answered": 1,
        "landed": 0,
    }
    buffer = SQLBuffer(f"sqlite:///{run / 'buffer.db'}")
    buffer.put([pending("late")])  # the explorer puts it after the answer
    buffer.close()
    deadline = time.monotonic() + 10
    while rewards(run)["late"] is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rewards(run) == {"late": 0.5}
    assert queue.counts()["landed"] == 1
    queue.close()


def test_label_studio_export_and_import_over_http(tmp_path, studio):
    run = make_run(tmp_path, "r4", [pending("x")])
    queue = AnnotationQueue(queue_url(run))
    queue.post([rate("x")])
    tasks = studio.get("/api/runs/r4/annotations/export", headers=OWNER).json()
    assert len(tasks) == 1 and tasks[0]["data"]["response"] == "answer of x" and tasks[0]["annotations"] == []
    tasks[0]["annotations"] = [
        {"completed_by": "eve", "result": [{"type": "rating", "from_name": "rating", "value": {"rating": 5}}]}
    ]
    tasks.append({"data": {"prompt": "q", "response_a": "1", "response_b": "2"}})
    got = studio.post("/api/runs/r4/annotations/import", json=tasks, headers=OWNER).json()
    assert got["posted"] == 1 and got["answered"] == 1 and got["skipped"] == 0
    assert rewards(run) == {"x": 1.0}
    exported = studio.get("/api/runs/r4/annotations/export", headers=OWNER).json()
    assert exported[0]["annotations"][0]["completed_by"] == "eve"
    assert exported[1]["meta"]["kind"] == "pair"
    bad = studio.post("/api/runs/r4/annotations/import", json=[{"data": {"text": "?"}}], headers=OWNER)
    assert bad.status_code == 400 and "expected 'prompt'" in bad.json()["detail"]
    queue.close()


def test_the_background_lander_runs_while_the_studio_serves_and_stops_with_it(tmp_path):
    import threading

    def landers() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name == "trine-studio-lander" and t.is_alive()]

    before = len(landers())
    with background(StudioSettings(runs_dir=tmp_path)):
        assert len(landers()) == before + 1
    assert len(landers()) == before


def test_a_file_buffer_is_left_to_its_run_and_landed_by_the_cli_after_it(tmp_path, studio):
    from typer.testing import CliRunner

    from trine.buffer.files import FileBuffer
    from trine.cli import app

    run = tmp_path / "r5"
    run.mkdir()
    (run / "config.yaml").write_text("buffer:\n  storage: file\n")
    buffer = FileBuffer(run / "buffer.jsonl")
    buffer.put([pending("f1")])
    buffer.close()
    log = (run / "buffer.jsonl").read_bytes()
    queue = AnnotationQueue(queue_url(run))
    queue.post([rate("f1")])
    (item,) = studio.post("/api/runs/r5/annotations/claim", json={"n": 1}, headers=ALICE).json()["items"]
    got = studio.post(
        "/api/runs/r5/annotations/answer",
        json={"answers": [{"item": item["id"], "rating": 1.0}]},
        headers=ALICE,
    ).json()
    assert got["answered"] == 1 and got["landed"] == 0 and "trine annotate land" in got["note"]
    assert (run / "buffer.jsonl").read_bytes() == log  # the studio never writes a run's file log
    result = CliRunner().invoke(app, ["annotate", "land", str(run)])
    assert result.exit_code == 0 and "rated: 1" in result.output, result.output
    assert rewards(run) == {"f1": 1.0}
    queue.close()


def test_annotators_see_the_prompt_as_messages_not_chat_template_markup(tmp_path, studio, tiny_model_dir):
    """`trine annotate rate|pairs` on experiences explored with the chat template (ChatML): the claimed
    items carry the conversation role by role, and a prompt text without `<|im_start|>`."""
    from typer.testing import CliRunner

    from trine.cli import app
    from trine.models import load_tokenizer
    from trine.models.chat import encode_prompt

    tokenizer = load_tokenizer(tiny_model_dir)
    chat = [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "What is 2+3?"},
    ]
    prompt = encode_prompt(tokenizer, chat)
    rows = [
        Experience(
            tokens=prompt + tokenizer.encode(answer), prompt_length=len(prompt), action_mask=[1],
            task_id="add/0", group_id="add/0@0", run_id=f"r{i}", info={"response": answer}, id=f"c{i}",
        )
        for i, answer in enumerate(["5", "6"])
    ]  # fmt: skip
    run = make_run(tmp_path, "chat", rows)
    (run / "config.yaml").write_text(f"buffer:\n  storage: sql\nmodel:\n  path: {tiny_model_dir}\n")
    for command in ("rate", "pairs"):
        result = CliRunner().invoke(app, ["annotate", command, str(run)])
        assert result.exit_code == 0 and "posted" in result.output, result.output
    items = studio.post("/api/runs/chat/annotations/claim", json={"n": 10}, headers=ALICE).json()["items"]
    assert sorted(i["kind"] for i in items) == ["pair", "rate", "rate"]
    for item in items:
        assert item["messages"] == chat, item
        assert item["prompt"] == "system: Answer with a number.\n\nuser: What is 2+3?"
    recent = studio.get("/api/runs/chat/annotations", headers=OWNER).json()["recent"]
    assert all(r["messages"] == chat and "<|" not in r["prompt"] for r in recent)
