"""The studio's experience browser over real HTTP: list, filters, paging, order, facets, one experience.

A real SQL buffer (:class:`trine.buffer.sql.SQLBuffer`) is filled in ``tmp_path`` and taken from the way
a run does (a trainer ``get`` consumes some, drops stale ones, expires pending ones); runs point at it
through their ``config.yaml``; a tiny tokenizer is trained and saved as the run's model. The PostgreSQL
variant of the list test runs when ``TRINE_TEST_POSTGRES_URL`` is set.
"""

from __future__ import annotations

import json
import os
import statistics
import uuid

import httpx
import pytest

pytest.importorskip("fastapi", reason="the studio needs fastapi (pip install -e '.[dev]')")
pytest.importorskip("uvicorn", reason="the studio needs uvicorn (pip install -e '.[dev]')")
import torch  # noqa: E402

from tests.helpers import write_config  # noqa: E402
from trine.buffer.files import FileBuffer  # noqa: E402
from trine.buffer.sampling import SamplingRules  # noqa: E402
from trine.buffer.sql import SQLBuffer  # noqa: E402
from trine.studio.server import background  # noqa: E402
from trine.studio.settings import StudioSettings  # noqa: E402
from trine.types import Experience  # noqa: E402

PG_URL = os.environ.get("TRINE_TEST_POSTGRES_URL")
PROMPT = "What is 2+3? "


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make(tok, eid: str, group: str, task: str, reward, *, version: int, batch: int, finish: str = "stop",
         response: str = "The answer is 5.", run_id: str = "", step: int = 0) -> Experience:  # fmt: skip
    prompt, resp = tok.encode(PROMPT), tok.encode(response)
    return Experience(
        tokens=prompt + resp,
        prompt_length=len(prompt),
        action_mask=[1] * len(resp),
        logprobs=[-0.25 * (i + 1) for i in range(len(resp))],
        reward=reward,
        task_id=task,
        group_id=group,
        run_id=run_id or f"run-{eid}",
        step=step,
        policy_version=version,
        info={
            "batch": batch,
            "finish_reason": finish,
            "response": response,
            "reward_parts": {"accuracy": reward},
        },
        id=eid,
    )


def multi_turn(tok, eid: str, reward: float) -> Experience:
    """A two-turn trajectory: model tokens, an observation (action_mask 0), model tokens."""
    prompt = tok.encode(PROMPT)
    first, obs, second = tok.encode("call calc(2+3)"), tok.encode(" result: 5 "), tok.encode("It is 5.")
    response = first + obs + second
    mask = [1] * len(first) + [0] * len(obs) + [1] * len(second)
    logprobs = [-0.5 if m else 0.0 for m in mask]
    info = {"batch": 3, "finish_reason": "stop", "response": "It is 5.", "reward_parts": {"accuracy": reward}}
    return Experience(
        tokens=prompt + response, prompt_length=len(prompt), action_mask=mask, logprobs=logprobs,
        reward=reward, task_id="t4", group_id="g4", run_id=f"run-{eid}", policy_version=3, info=info, id=eid,
    )  # fmt: skip


G1 = [1.0, 0.0, 0.5, 1.0]  # version 0: dropped as stale by the get below
G2 = [0.2, 0.4, 0.6, 0.9]  # taken by the get: trained


def fill(buffer, tok, clock: Clock) -> None:
    """15 rows: 4 stale (g1), 4 trained (g2), 2 expired (g3), 2 multi-turn + 2 multi-step ready, 1 pending."""
    buffer.put([make(tok, f"g1-{i}", "g1", "t1", r, version=0, batch=0,
                     finish="length" if i == 1 else "stop") for i, r in enumerate(G1)])  # fmt: skip
    buffer.put([make(tok, f"g2-{i}", "g2", "t2", r, version=3, batch=1) for i, r in enumerate(G2)])
    buffer.put([make(tok, f"g3-{i}", "g3", "t3", None, version=3, batch=2) for i in range(2)])
    steps = [
        make(tok, f"ms-{i}", "g6", "t6", 0.5, version=3, batch=3, run_id="run-ms", step=i) for i in (1, 0)
    ]
    buffer.put([multi_turn(tok, "mt-0", 1.0), multi_turn(tok, "mt-1", 0.0), *steps])
    clock.now = 100.0  # the g3 rows' pending timeout (10 s) has passed
    buffer.put([make(tok, "p-0", "g5", "t5", None, version=3, batch=4)])
    taken = buffer.get(4, current_version=4, timeout=5)  # drops g1 (stale), expires g3, takes g2
    assert sorted(e.id for e in taken) == [f"g2-{i}" for i in range(4)]


def write_run(runs, name: str, buffer: dict, model, algorithm: str = "grpo") -> None:
    run = runs / name
    run.mkdir(parents=True)
    config = {"model": {"path": str(model)}, "buffer": buffer, "algorithm": {"name": algorithm}}
    write_config(run / "config.yaml", config)


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from trine.models.tiny import build_tokenizer

    root = tmp_path_factory.mktemp("studio_exps")
    tok = build_tokenizer(512)
    tok.save_pretrained(root / "model")
    runs = root / "runs"
    rules = SamplingRules(max_staleness=1, pending_timeout=10.0)
    url = f"sqlite:///{root / 'buffer.db'}"
    clock = Clock()
    buffer = SQLBuffer(url, rules=rules, clock=clock)
    fill(buffer, tok, clock)
    buffer.close()
    write_run(runs, "sql", {"storage": "sql", "url": url}, root / "model")
    write_run(runs, "ppo", {"storage": "sql", "url": url}, root / "model", algorithm="ppo")
    for algorithm in ("rloo", "reinforce_pp", "multi_step_grpo", "gigpo", "dpo", "sft"):
        write_run(runs, algorithm, {"storage": "sql", "url": url}, root / "model", algorithm=algorithm)
    (runs / "file").mkdir()
    files = FileBuffer(runs / "file" / "buffer.jsonl", rules=rules, clock=clock)
    clock.now = 0.0
    fill(files, tok, clock)
    files.close()
    write_run(runs, "file2", {"storage": "file", "storage_args": {"path": str(runs / "file" / "buffer.jsonl")}},
              root / "model")  # fmt: skip
    with background(StudioSettings(runs_dir=runs)) as base, httpx.Client(base_url=base, timeout=30) as client:
        yield {"client": client, "runs": runs, "root": root, "tok": tok, "url": url}


def get(env, path: str, **params):
    return env["client"].get(path, params=params)


def listed(env, run: str = "sql", **params) -> dict:
    response = get(env, f"/api/runs/{run}/experiences", **params)
    assert response.status_code == 200, response.text
    return response.json()


ALL = 15
FILTERS = [
    ({}, ALL),
    ({"status": "trained"}, {f"g2-{i}" for i in range(4)}),
    ({"status": "stale"}, {f"g1-{i}" for i in range(4)}),
    ({"status": "expired"}, {"g3-0", "g3-1"}),
    ({"status": "ready"}, {"mt-0", "mt-1", "ms-0", "ms-1"}),
    ({"status": "pending"}, {"p-0"}),
    ({"status": "rolled_back"}, set()),
    ({"kind": "rollout"}, ALL),
    ({"kind": "sft"}, set()),
    ({"task": "t2"}, {f"g2-{i}" for i in range(4)}),
    ({"reward_min": 0.6}, {"g1-0", "g1-3", "g2-2", "g2-3", "mt-0"}),
    ({"reward_max": 0.0}, {"g1-1", "mt-1"}),
    ({"reward_min": 0.4, "reward_max": 0.6}, {"g1-2", "g2-1", "g2-2", "ms-0", "ms-1"}),
    ({"version_max": 0}, {f"g1-{i}" for i in range(4)}),
    ({"version_min": 3}, ALL - 4),
    ({"step_min": 3}, {"mt-0", "mt-1", "ms-0", "ms-1", "p-0"}),
    ({"step_min": 1, "step_max": 2}, {f"g2-{i}" for i in range(4)} | {"g3-0", "g3-1"}),
    ({"finish_reason": "length"}, {"g1-1"}),
    ({"status": "ready", "task": "t4", "reward_min": 0.5}, {"mt-0"}),
    ({"version_min": 3, "step_max": 3, "reward_max": 0.5, "finish_reason": "stop"}, {"g2-0", "g2-1", "mt-1", "ms-0", "ms-1"}),
]  # fmt: skip


def check_filters(env, run: str) -> None:
    for params, expected in FILTERS:
        page = listed(env, run, limit=500, **params)
        ids = {r["id"] for r in page["rows"]}
        if isinstance(expected, int):
            assert page["total"] == expected == len(ids), params
        else:
            assert ids == expected and page["total"] == len(expected), (params, ids)


@pytest.mark.parametrize("run", ["sql", "file2"])
def test_list_rows_and_every_filter(env, run):
    page = listed(env, run)
    assert page["source"] == ("sql" if run == "sql" else "file") and page["note"] is None
    assert page["total"] == ALL and page["offset"] == 0 and page["limit"] == 50
    assert isinstance(page["query_ms"], float)
    assert [r["seq"] for r in page["rows"]] == sorted(r["seq"] for r in page["rows"])
    first = page["rows"][0]
    assert first == {
        "id": "g1-0", "seq": first["seq"], "task_id": "t1", "group_id": "g1", "run_id": "run-g1-0", "step": 0,
        "batch": 0, "policy_version": 0, "reward": 1.0, "status": "stale", "kind": "rollout",
        "finish_reason": "stop", "prompt_length": len(env["tok"].encode(PROMPT)),
        "response_length": len(env["tok"].encode("The answer is 5.")), "preview": "The answer is 5.",
    }  # fmt: skip
    check_filters(env, run)


def test_paging_and_order(env):
    ids = [r["id"] for r in listed(env, limit=500)["rows"]]
    page = listed(env, offset=5, limit=4)
    assert [r["id"] for r in page["rows"]] == ids[5:9] and page["total"] == ALL
    assert listed(env, offset=12, limit=4)["rows"][0]["id"] == ids[12]
    assert listed(env, offset=40)["rows"] == []
    assert [r["id"] for r in listed(env, order="-seq", limit=3)["rows"]] == ids[::-1][:3]
    rewards = [r["reward"] for r in listed(env, order="reward", limit=500)["rows"]]
    known = [r for r in rewards if r is not None]
    assert known == sorted(known) and rewards[len(known) :] == [None] * 3  # pending / expired last
    desc = [r["reward"] for r in listed(env, order="-reward", limit=500)["rows"]]
    assert desc[: len(known)] == sorted(known, reverse=True) and desc[-1] is None
    top = listed(env, order="-reward", status="ready", limit=1)["rows"][0]
    assert top["id"] == "mt-0"


@pytest.mark.parametrize("run", ["sql", "file2"])
def test_facets(env, run):
    response = get(env, f"/api/runs/{run}/experiences/facets")
    assert response.status_code == 200, response.text
    facets = response.json()
    assert facets["statuses"] == {
        "pending": 1,
        "ready": 4,
        "trained": 4,
        "stale": 4,
        "expired": 2,
        "rolled_back": 0,
    }
    assert facets["kinds"] == ["rollout"] and facets["finish_reasons"] == ["length", "stop"]
    assert facets["tasks"] == ["t1", "t2", "t3", "t4", "t5", "t6"]
    assert facets["reward"] == [0.0, 1.0] and facets["version"] == [0, 3] and facets["batch"] == [0, 4]


def grpo(rewards: list[float]) -> list[float]:
    mean, std = statistics.mean(rewards), statistics.stdev(rewards)
    return [(r - mean) / (std + 1e-6) for r in rewards]


def detail(env, run: str, eid: str) -> dict:
    response = get(env, f"/api/runs/{run}/experiences/{eid}")
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("run", ["sql", "file2"])
def test_one_experience_tokens_logprobs_and_grpo_advantages(env, run):
    tok = env["tok"]
    d = detail(env, run, "g2-2")
    assert d["experience"]["status"] == "trained" and d["experience"]["reward_parts"] == {"accuracy": 0.6}
    assert d["experience"]["info"]["batch"] == 1 and d["tokenizer_note"] is None
    n_prompt = len(tok.encode(PROMPT))
    tokens = d["tokens"]
    assert [t["id"] for t in tokens] == tok.encode(PROMPT) + tok.encode("The answer is 5.")
    assert all(t["prompt"] and not t["action"] and t["logprob"] is None for t in tokens[:n_prompt])
    assert all(t["action"] and not t["prompt"] for t in tokens[n_prompt:])
    assert [t["logprob"] for t in tokens[n_prompt:]] == pytest.approx(
        [-0.25 * (i + 1) for i in range(len(tokens) - n_prompt)]
    )
    assert "".join(t["text"] for t in tokens) == PROMPT + "The answer is 5."
    assert d["prompt_text"] == PROMPT and d["response_text"] == "The answer is 5."
    expected = grpo(G2)[2]
    assert [t["advantage"] for t in tokens[n_prompt:]] == pytest.approx([expected] * (len(tokens) - n_prompt))
    assert all(t["advantage"] is None for t in tokens[:n_prompt])
    assert "grpo" in d["advantage_note"]
    assert [(g["id"], g["reward"], g["status"]) for g in d["group"]] == [
        (f"g2-{i}", pytest.approx(r), "trained") for i, r in enumerate(G2)
    ]
    assert d["steps"] == [{"id": "g2-2", "step": 0, "reward": pytest.approx(0.6), "status": "trained"}]
    assert [t["role"] for t in d["turns"]] == ["prompt", "model"]


def test_multi_turn_observation_tokens_turns_and_steps(env):
    tok = env["tok"]
    d = detail(env, "sql", "mt-0")
    n_prompt = len(tok.encode(PROMPT))
    first, obs = len(tok.encode("call calc(2+3)")), len(tok.encode(" result: 5 "))
    response = d["tokens"][n_prompt:]
    assert [t["action"] for t in response] == [True] * first + [False] * obs + [True] * (
        len(response) - first - obs
    )
    masked = response[first : first + obs]
    assert all(t["logprob"] is None and t["advantage"] is None for t in masked)
    actions = [t["advantage"] for t in response if t["action"]]
    assert actions == pytest.approx([grpo([1.0, 0.0])[0]] * len(actions))
    assert [(t["role"], t["text"]) for t in d["turns"]] == [
        ("prompt", PROMPT), ("model", "call calc(2+3)"), ("observation", " result: 5 "), ("model", "It is 5."),
    ]  # fmt: skip
    steps = detail(env, "sql", "ms-1")["steps"]
    assert [(s["id"], s["step"]) for s in steps] == [("ms-0", 0), ("ms-1", 1)]


def test_advantages_follow_the_run_algorithm(env):
    ppo = detail(env, "ppo", "g2-0")
    assert all(t["advantage"] is None for t in ppo["tokens"]) and "critic" in ppo["advantage_note"]
    rloo = detail(env, "rloo", "g2-0")
    expected = G2[0] - statistics.mean(G2[1:])
    actions = [t["advantage"] for t in rloo["tokens"] if t["action"]]
    assert actions == pytest.approx([expected] * len(actions))
    pending = detail(env, "sql", "p-0")
    assert pending["experience"]["reward"] is None and "pending" in pending["advantage_note"]


@pytest.mark.parametrize(
    ("algorithm", "computed", "words"),
    [
        ("reinforce_pp", True, "whole training batch"),
        ("multi_step_grpo", True, "step_wise_grpo"),
        ("gigpo", True, "gigpo"),
        ("dpo", False, "no advantages"),
        ("sft", False, "no advantages"),
    ],
)
def test_every_kind_of_algorithm_gives_advantages_or_says_why(env, algorithm, computed, words):
    d = detail(env, algorithm, "ms-0")
    actions = [t["advantage"] for t in d["tokens"] if t["action"]]
    assert all(isinstance(a, float) for a in actions) if computed else all(a is None for a in actions)
    assert words in d["advantage_note"], d["advantage_note"]


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"reward_min": "abc"}, ["reward_min", "'abc'", "number"]),
        ({"version_max": "1.5"}, ["version_max", "integer"]),
        ({"reward_min": "nan"}, ["reward_min", "finite"]),
        ({"reward_min": 2, "reward_max": 1}, ["reward_min", "reward_max"]),
        ({"status": "consumed"}, ["status", "trained"]),
        ({"order": "length"}, ["order", "-reward"]),
        ({"limit": 0}, ["limit", "1 to 500"]),
        ({"offset": -1}, ["offset"]),
        ({"stage": "nope"}, ["stage", "'nope'"]),
    ],
)
def test_bad_parameters_are_400_naming_them(env, params, words):
    response = get(env, "/api/runs/sql/experiences", **params)
    assert response.status_code == 400, response.text
    assert all(w in response.json()["detail"] for w in words), response.json()


def test_unknown_run_experience_and_traversal(env):
    assert get(env, "/api/runs/nothere/experiences").status_code == 404
    assert get(env, "/api/runs/..%2E/experiences").status_code in (400, 404)
    assert get(env, "/api/runs/.hidden/experiences/facets").status_code == 400
    missing = get(env, "/api/runs/sql/experiences/nope")
    assert missing.status_code == 404 and "nope" in missing.json()["detail"]


def test_half_written_runs_give_notes(env):
    runs = env["runs"]
    (runs / "starting").mkdir()
    (runs / "nodb").mkdir()
    write_config(runs / "nodb" / "config.yaml", buffer={"storage": "sql"})
    (runs / "garbage").mkdir()
    (runs / "garbage" / "buffer.db").write_bytes(b"this is not a database" * 100)
    write_config(runs / "garbage" / "config.yaml", buffer={"storage": "sql"})
    (runs / "notable").mkdir()
    (runs / "notable" / "buffer.db").write_bytes(b"")
    write_config(runs / "notable" / "config.yaml", buffer={"storage": "sql"})
    (runs / "badyaml").mkdir()
    (runs / "badyaml" / "config.yaml").write_text("buffer: [unclosed")
    (runs / "plugin").mkdir()
    write_config(runs / "plugin" / "config.yaml", buffer={"storage": "os:system"})
    for run, source, words in [
        ("starting", "none", "config.yaml"),
        ("nodb", "sql", "does not exist"),
        ("garbage", "sql", "cannot be read"),
        ("notable", "sql", "table 'experiences'"),
        ("badyaml", "none", "config.yaml"),
        ("plugin", "none", "imports no code"),
    ]:
        for path in ("experiences", "experiences/facets"):
            response = get(env, f"/api/runs/{run}/{path}")
            assert response.status_code == 200, (run, response.text)
            body = response.json()
            assert body["source"] == source and words in body["note"], (run, body)
        assert listed(env, run)["total"] == 0
    assert not (runs / "nodb" / "buffer.db").exists()  # reading never creates the database
    assert get(env, "/api/runs/starting/experiences/x").status_code == 404


def test_memory_buffer_shows_the_last_checkpoint(env):
    runs, tok = env["runs"], env["tok"]
    (runs / "mem").mkdir()
    write_config(runs / "mem" / "config.yaml", buffer={"storage": "memory"})
    body = listed(env, "mem")
    assert body["source"] == "memory" and body["total"] == 0 and "no checkpoint yet" in body["note"]
    step = runs / "mem" / "checkpoints" / "step_2"
    step.mkdir(parents=True)
    kept = make(tok, "m-0", "gm", "tm", 0.5, version=2, batch=2)
    torch.save({}, step / "trainer_state.pt")
    torch.save({"buffer": {"ready": [kept.to_dict()], "pending": []}}, step / "loop_state.pt")
    body = listed(env, "mem")
    assert [r["id"] for r in body["rows"]] == ["m-0"] and "only the 1 not yet trained" in body["note"]
    assert detail(env, "mem", "m-0")["experience"]["status"] == "ready"


def test_sql_reads_are_read_only(env):
    import sqlalchemy as sa

    from trine.studio.experience_sql import sql_source

    source = sql_source(env["url"], "experiences")
    with pytest.raises(sa.exc.OperationalError, match="readonly"), source.engine.connect() as conn:
        conn.execute(sa.text("DELETE FROM experiences"))
    assert listed(env)["total"] == ALL


@pytest.mark.skipif(
    PG_URL is None, reason="PostgreSQL variant: set TRINE_TEST_POSTGRES_URL (scripts/postgres.sh)"
)
def test_postgres_list_and_filters(env):
    import sqlalchemy as sa

    table = f"studio_{uuid.uuid4().hex[:8]}"
    clock = Clock()
    buffer = SQLBuffer(
        PG_URL, table=table, rules=SamplingRules(max_staleness=1, pending_timeout=10.0), clock=clock
    )
    try:
        fill(buffer, env["tok"], clock)
        buffer.close()
        write_run(env["runs"], "pg", {"storage": "sql", "url": PG_URL, "storage_args": {"table": table}},
                  env["root"] / "model")  # fmt: skip
        check_filters(env, "pg")
        assert json.dumps(get(env, "/api/runs/pg/experiences/facets").json()["statuses"])
        assert detail(env, "pg", "mt-0")["turns"][2]["role"] == "observation"
    finally:
        engine = sa.create_engine(PG_URL)
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}, {table}_batches"))
        engine.dispose()


def test_an_older_table_without_expired_at_or_the_new_indexes(env):
    import sqlite3

    old = env["runs"] / "old"
    old.mkdir()
    buffer = SQLBuffer(old / "buffer.db", rules=SamplingRules(max_staleness=1))
    buffer.put(
        [make(env["tok"], f"o-{i}", "go", "to", 1.0, version=v, batch=v) for i, v in enumerate((0, 5))]
    )
    assert [e.id for e in buffer.get(1, current_version=5, timeout=5)] == ["o-1"]  # o-0 dropped as stale
    buffer.close()
    con = sqlite3.connect(old / "buffer.db")
    for index in ("browse", "batch", "finish"):
        con.execute(f"DROP INDEX ix_experiences_{index}")
    con.execute("ALTER TABLE experiences DROP COLUMN expired_at")
    con.commit()
    con.close()
    write_config(old / "config.yaml", buffer={"storage": "sql"})
    assert [r["id"] for r in listed(env, "old", status="stale")["rows"]] == ["o-0"]
    assert listed(env, "old", status="expired")["total"] == 0
    statuses = get(env, "/api/runs/old/experiences/facets").json()["statuses"]
    assert statuses["stale"] == 1 and statuses["trained"] == 1 and statuses["expired"] == 0
