"""The studio's Runs API over real HTTP: run states, stages, notes for half-written runs, incremental
metrics polling, the eval table, buffer counts, and a real short `trine run` watched while it runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi", reason="the studio needs fastapi (pip install -e '.[dev]')")
pytest.importorskip("uvicorn", reason="the studio needs uvicorn (pip install -e '.[dev]')")

from tests.helpers import EXAMPLE, dead_pid, exp, write_arithmetic_config, write_config  # noqa: E402
from trine.studio import run_metrics  # noqa: E402
from trine.studio.server import background  # noqa: E402
from trine.studio.settings import StudioSettings  # noqa: E402

REPO = Path(__file__).resolve().parents[3]
PG_URL = os.environ.get("TRINE_TEST_POSTGRES_URL")
NaN = float("nan")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def stage(name: str = "main", mode: str = "sync", total: int | None = 4, **extra) -> dict:
    return {"name": "x", "stage": name, "mode": mode, "tasks": {"total_steps": total}, **extra}


def make_run(root: Path, name: str, config=None, status=None, metrics=None, **files) -> Path:
    """A run directory by hand: config (dict -> YAML, str as is), status (dict -> JSON, str as is),
    metrics (list of dicts / raw str lines joined as written), other files by name."""
    run = root / name
    run.mkdir(parents=True)
    if config is not None:
        if isinstance(config, str):
            (run / "config.yaml").write_text(config)
        else:
            write_config(run / "config.yaml", config)
    if status is not None:
        (run / "status.json").write_text(status if isinstance(status, str) else json.dumps(status))
    if metrics is not None:
        (run / "metrics.jsonl").write_text(metrics if isinstance(metrics, str) else lines(*metrics))
    for file, text in files.items():
        (run / file.replace("__", ".")).write_text(text)
    return run


def lines(*records) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


def ev(step, stage_name, **tasks) -> dict:
    out = {"step": step, "stage": stage_name}
    for taskset, (acc, avg) in tasks.items():
        out.update(
            {
                f"eval/{taskset.replace('__', '/')}/accuracy": acc,
                f"eval/{taskset.replace('__', '/')}/avg@4": avg,
            }
        )
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    host, pid = socket.gethostname(), os.getpid()
    done_metrics = [
        {"step": 1, "stage": "sft", "trainer/loss": 2.0},
        {"step": 2, "stage": "sft", "trainer/loss": NaN},
        {
            "step": 3,
            "stage": "sft",
            "trainer/loss": 1.0,
            **ev(3, "sft", addition=(0.25, 0.5), gsm__easy=(0.0, 0.1)),
        },
        {"step": 4, "stage": "grpo", "explorer/reward_mean": 0.5},
        {"step": 5, "stage": "grpo", "explorer/reward_mean": 0.75, **ev(5, "grpo", addition=(0.5, 0.625))},
    ]
    bench = lines(
        {
            "step": 3,
            "stage": "sft",
            "checkpoint": "c3",
            "settings": "s",
            "saved_ns": 1,
            "eval/addition/accuracy": 0.3,
        },
        {
            "step": 5,
            "stage": "grpo",
            "checkpoint": "c5",
            "settings": "s",
            "saved_ns": 2,
            "eval/addition/accuracy": 0.6,
        },
    )
    two_stages = {"stages": [stage("sft", "train", 3), stage("grpo", "sync", 2)]}
    finished = {"state": "finished", "step": 5, "pid": 1, "host": host, "ended_at": now()}
    make_run(root, "done", two_stages, finished, done_metrics, bench__jsonl=bench, annotations__db="")
    failed = {
        "state": "failed",
        "step": 1,
        "error": "RuntimeError: boom",
        "traceback": "Traceback ...",
        "pid": 1,
    }
    make_run(root, "broken", stage(total=4), failed)
    live = {"state": "running", "step": 2, "pid": pid, "host": host, "heartbeat": now(), "started_at": now()}
    make_run(root, "live", stage(total=10), live, [{"step": 1}, {"step": 2}])
    gone = {"state": "running", "step": 1, "pid": dead_pid(), "host": host, "heartbeat": now()}
    make_run(root, "dead", stage(), gone)
    stopped = {"state": "stopped", "step": 2, "reason": "stop_after_steps reached; run again to continue"}
    make_run(root, "stopped", stage(), stopped)
    torn = '{"step": 1, "x": 1}\n{not json\n{"step": 2, "x": 2}\n{"step": 3, "x'
    make_run(root, "half", metrics=torn)
    make_run(root, "corrupt", stage(), "{")
    make_run(root, ".studio", stage())  # hidden: not a run
    (root / "empty").mkdir()  # holds no run file: not a run
    (root / "notes.txt").write_text("a file, not a run")
    make_run(root, "bad name", stage())
    return root


@pytest.fixture(scope="module")
def api(runs):
    with background(StudioSettings(runs_dir=runs)) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def test_every_run_is_listed_with_its_state_progress_and_notes(api, runs):
    body = api.get("/api/runs").json()
    assert body["runs_dir"] == str(runs)
    by = {r["name"]: r for r in body["runs"]}
    assert sorted(by) == ["broken", "corrupt", "dead", "done", "half", "live", "stopped"]
    assert body["notes"] == [
        "'bad name' is not shown: a run's name may hold only letters, digits, '_', '-', '.'"
    ]
    done = by["done"]
    assert done["state"] == "finished" and done["why"] == "" and done["notes"] == []
    assert (done["step"], done["total_steps"], done["mode"], done["stages"]) == (
        5,
        5,
        "train/sync",
        ["sft", "grpo"],
    )
    newest = max((runs / "done" / f).stat().st_mtime for f in ("config.yaml", "status.json", "metrics.jsonl"))
    assert done["updated"] == pytest.approx(newest)
    assert (by["broken"]["state"], by["broken"]["why"], by["broken"]["step"]) == (
        "failed",
        "RuntimeError: boom",
        1,
    )
    assert by["live"]["state"] == "running" and f"pid {os.getpid()}" in by["live"]["why"]
    assert (by["live"]["step"], by["live"]["total_steps"], by["live"]["stages"]) == (2, 10, ["main"])
    assert by["dead"]["state"] == "dead" and "is gone" in by["dead"]["why"]
    assert by["stopped"]["state"] == "stopped" and "stop_after_steps" in by["stopped"]["why"]
    half = by["half"]
    assert (half["state"], half["step"], half["total_steps"], half["stages"], half["mode"]) == (
        "unknown",
        2,
        None,
        [],
        None,
    )
    assert any("no status.json" in n for n in half["notes"]) and any(
        "no config.yaml" in n for n in half["notes"]
    )
    assert (
        by["corrupt"]["state"] == "unknown" and "status.json is not valid JSON" in by["corrupt"]["notes"][0]
    )
    updated = [r["updated"] for r in body["runs"]]
    assert updated == sorted(updated, reverse=True)


def test_run_detail_of_a_finished_multi_stage_run(api, runs):
    r = api.get("/api/runs/done")
    assert r.status_code == 200
    d = r.json()
    assert (d["name"], d["state"], d["step"], d["total_steps"]) == ("done", "finished", 5, 5)
    assert d["status"]["state"] == "finished" and d["status"]["step"] == 5
    assert d["stages"] == [
        {"name": "sft", "mode": "train", "total_steps": 3},
        {"name": "grpo", "mode": "sync", "total_steps": 2},
    ]
    assert d["config_yaml"] == (runs / "done" / "config.yaml").read_text()
    assert d["processes"] == [] and d["annotations"] is True and d["notes"] == []
    assert d["buffer"]["storage"] == "memory" and d["buffer"]["counts"] is None
    assert "cannot be counted from outside" in d["buffer"]["note"]


def test_run_detail_of_failed_half_written_and_corrupt_runs(api):
    broken = api.get("/api/runs/broken").json()
    assert broken["state"] == "failed" and broken["why"] == "RuntimeError: boom"
    assert broken["status"]["traceback"] == "Traceback ..." and broken["annotations"] is False
    assert broken["notes"] == ["no metrics.jsonl yet: no step has been logged"]
    half = api.get("/api/runs/half").json()
    assert (half["state"], half["status"], half["config_yaml"], half["stages"], half["buffer"]) == (
        "unknown",
        {},
        None,
        [],
        None,
    )
    assert len(half["notes"]) == 2
    corrupt = api.get("/api/runs/corrupt").json()
    assert corrupt["state"] == "unknown" and corrupt["status"] == {}
    assert corrupt["stages"] == [{"name": "main", "mode": "sync", "total_steps": 4}]
    assert api.get("/api/runs/nope").status_code == 404


def test_an_async_run_with_explorer_processes_lists_each_process(api, runs):
    host = socket.gethostname()
    trainer = {"state": "running", "step": 4, "pid": os.getpid(), "host": host, "heartbeat": now()}
    run = make_run(
        runs, "procs", stage(mode="async", total=8), trainer, [{"step": 4, "trainer/version": 4.0}]
    )
    explorer = {"state": "running", "step": 9, "pid": os.getpid(), "host": host, "heartbeat": now()}
    make_run(run / "explorers", "0", status=explorer, metrics=[{"step": 9, "explorer/version": 3.0}])
    make_run(run / "explorers", "1", status={"state": "failed", "step": 2, "error": "OSError: disk full"})
    (run / "explorers" / "2").mkdir()  # started, no status yet
    got = api.get("/api/runs/procs").json()["processes"]
    brief = [(p["name"], p["state"], p["step"], p["version"], p["lag"]) for p in got]
    assert brief == [
        ("trainer", "running", 4, 4, None),
        ("explorer 0", "running", 9, 3, 1),
        ("explorer 1", "failed", 2, None, None),
        ("explorer 2", "unknown", None, None, None),
    ]
    assert got[2]["why"] == "OSError: disk full" and got[1]["pid"] == os.getpid()


def test_metrics_skip_corrupt_lines_and_wait_for_a_torn_one(api, runs):
    first = api.get("/api/runs/half/metrics").json()
    assert [r["step"] for r in first["rows"]] == [1, 2]
    assert first["notes"] == ["metrics.jsonl line 2: not valid JSON (skipped)"]
    assert first["keys"] == ["x"] and "reset" not in first
    path = runs / "half" / "metrics.jsonl"
    assert first["next"] == path.read_bytes().rindex(b"\n") + 1  # the torn line is not consumed
    again = api.get("/api/runs/half/metrics", params={"after": first["next"]}).json()
    assert again == {"rows": [], "next": first["next"], "keys": [], "notes": []}
    with path.open("a") as out:  # the torn line ends, one more comes, then a corrupt one, then a torn one
        out.write('": 3}\n{"step": 4, "x": 4, "y": 0.5}\n[1, 2]\n{"step": 5')
    new = api.get("/api/runs/half/metrics", params={"after": first["next"]}).json()
    assert [r["step"] for r in new["rows"]] == [3, 4]
    assert new["keys"] == ["x", "y"]
    assert new["notes"] == ["metrics.jsonl line 6: a JSON list, not an object (skipped)"]


def test_metrics_page_by_bytes_nan_becomes_null_and_cut_files_restart(api, runs, monkeypatch):
    whole = api.get("/api/runs/done/metrics").json()
    assert [r["step"] for r in whole["rows"]] == [1, 2, 3, 4, 5]
    assert whole["rows"][1]["trainer/loss"] is None  # NaN in the file: null in JSON
    assert (
        "trainer/loss" in whole["keys"]
        and "eval/addition/accuracy" in whole["keys"]
        and "step" not in whole["keys"]
    )
    sizes = [len(line) + 1 for line in (runs / "done" / "metrics.jsonl").read_bytes().splitlines()]
    longest = max(sizes)
    assert sizes.index(longest) == 2  # the line of step 3 (two tasksets' evals)
    for limit, expected in ((longest, [1, 2, 3, 4, 5]), (longest - 1, [1, 2, 4, 5])):
        monkeypatch.setattr(run_metrics, "MAX_BYTES", limit)  # pages of a line or two
        seen, notes, after, calls = [], [], 0, 0
        while after < whole["next"]:
            page = api.get("/api/runs/done/metrics", params={"after": after}).json()
            seen, notes = seen + [r["step"] for r in page["rows"]], notes + page["notes"]
            after, calls = page["next"], calls + 1
        assert seen == expected and calls >= 3 and after == whole["next"]
    too_long = (
        f"metrics.jsonl: a line at byte {sizes[0] + sizes[1]} is longer than {longest - 1} bytes (skipped)"
    )
    assert notes == [too_long]
    r = api.get("/api/runs/done/metrics", params={"after": 7})
    assert r.status_code == 400 and "not the start of a line" in r.json()["detail"]
    assert api.get("/api/runs/done/metrics", params={"after": -1}).status_code == 422
    path = runs / "live" / "metrics.jsonl"
    end = api.get("/api/runs/live/metrics").json()["next"]
    path.write_text(lines({"step": 1}))  # a resumed run cut it back
    cut = api.get("/api/runs/live/metrics", params={"after": end}).json()
    assert cut["reset"] is True and cut["rows"] == [{"step": 1}] and cut["next"] == len(lines({"step": 1}))
    assert "cut back" in cut["notes"][0]


def test_missing_metrics_give_no_rows_and_a_note(api):
    body = api.get("/api/runs/broken/metrics").json()
    assert body == {
        "rows": [],
        "next": 0,
        "keys": [],
        "notes": ["no metrics.jsonl yet: no step has been logged"],
    }


def test_eval_table_from_metrics_and_bench(api, runs):
    body = api.get("/api/runs/done/evals").json()
    assert body["tasksets"] == ["addition", "gsm/easy"] and body["columns"] == ["accuracy", "avg@4"]
    rows = [
        (r["step"], r["taskset"], r["source"], r["stage"], r["accuracy"], r.get("avg@4"))
        for r in body["rows"]
    ]
    assert rows == [
        (3, "addition", "run", "sft", 0.25, 0.5),
        (3, "addition", "bench", "sft", 0.3, None),
        (3, "gsm/easy", "run", "sft", 0.0, 0.1),
        (5, "addition", "run", "grpo", 0.5, 0.625),
        (5, "addition", "bench", "grpo", 0.6, None),
    ]
    assert body["notes"] == []
    assert api.get("/api/runs/broken/evals").json() == {
        "tasksets": [],
        "columns": [],
        "rows": [],
        "notes": [],
    }


def test_eval_table_follows_a_growing_and_a_rewound_file(api, runs):
    path = make_run(runs, "grow", stage(), metrics=[ev(1, "main", a=(0.1, 0.2))]) / "metrics.jsonl"
    assert [r["step"] for r in api.get("/api/runs/grow/evals").json()["rows"]] == [1]
    with path.open("a") as out:
        out.write(lines({"step": 2}, "oops", ev(3, "main", a=(0.3, 0.4))))
    body = api.get("/api/runs/grow/evals").json()
    assert [(r["step"], r["accuracy"]) for r in body["rows"]] == [(1, 0.1), (3, 0.3)]
    rewound = lines(ev(1, "main", a=(0.9, 0.9)), {"step": 2, "pad": "x" * 40}, ev(3, "main", a=(0.8, 0.8)))
    assert len(rewound) > path.stat().st_size  # cut back and grown past the last read: seen by its content
    path.write_text(rewound)
    body = api.get("/api/runs/grow/evals").json()
    assert [(r["step"], r["accuracy"]) for r in body["rows"]] == [(1, 0.9), (3, 0.8)]


def snapshot(run: Path) -> dict[str, tuple[int, int]]:
    """Every file's size and mtime; a SQLite ``-shm`` file (the WAL index, shared memory that every
    reader of a database in WAL mode updates) only by its presence."""
    return {
        str(p.relative_to(run)): (0, 0)
        if p.name.endswith("-shm")
        else (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(run.rglob("*"))
    }


def test_sql_and_file_buffers_are_counted_without_writing(api, runs):
    from trine.buffer.files import FileBuffer
    from trine.buffer.sql import SQLBuffer

    sql_run = make_run(runs, "sqlrun", stage(buffer={"storage": "sql"}), {"state": "finished", "step": 1})
    buf = SQLBuffer(f"sqlite:///{sql_run / 'buffer.db'}")
    buf.put(
        [exp(i, version=0) for i in range(2)]
        + [exp(i, version=1) for i in range(4)]
        + [exp(9, reward=None, version=1)]
    )
    assert len(buf.get(2, min_version=1)) == 2  # the two version-0 rows are dropped as stale
    buf.close()
    before = snapshot(sql_run)
    detail = api.get("/api/runs/sqlrun").json()
    assert detail["buffer"] == {
        "storage": "sql",
        "counts": {"pending": 1, "ready": 2, "trained": 2, "stale": 2, "expired": 0, "rolled_back": 0},
        "batches_waiting": 1,
        "note": None,
    }
    assert snapshot(sql_run) == before  # read-only: not even a -wal or -shm file appeared
    file_run = make_run(runs, "filerun", stage(buffer={"storage": "file"}))
    buf = FileBuffer(file_run / "buffer.jsonl")
    buf.put([exp(i, version=1) for i in range(3)] + [exp(7, reward=None, version=1)])
    buf.get(1)
    buf.close()
    counts = api.get("/api/runs/filerun").json()["buffer"]["counts"]
    assert counts == {"pending": 1, "ready": 2, "trained": 1, "stale": 0, "expired": 0, "rolled_back": 0}
    make_run(runs, "nodb", stage(buffer={"storage": "sql"}))
    nodb = api.get("/api/runs/nodb").json()["buffer"]
    assert nodb["counts"] is None and "no database yet" in nodb["note"]
    assert not (runs / "nodb" / "buffer.db").exists()


@pytest.mark.skipif(
    not PG_URL,
    reason='PostgreSQL variant: set TRINE_TEST_POSTGRES_URL (export TRINE_TEST_POSTGRES_URL="$(scripts/postgres.sh)")',
)
def test_a_postgresql_buffer_is_counted(api, runs):
    import sqlalchemy as sa

    from trine.buffer.sql import SQLBuffer

    table = f"studio_{uuid.uuid4().hex[:12]}"
    section = {"storage": "sql", "url": PG_URL, "storage_args": {"table": table}}
    make_run(runs, "pgrun", stage(buffer=section), {"state": "finished", "step": 1})
    buf = SQLBuffer(PG_URL, table=table)
    try:
        buf.put([exp(i, version=1) for i in range(3)] + [exp(5, reward=None, version=1)])
        buf.get(2)
        assert api.get("/api/runs/pgrun").json()["buffer"] == {
            "storage": "sql",
            "counts": {"pending": 1, "ready": 1, "trained": 2, "stale": 0, "expired": 0, "rolled_back": 0},
            "batches_waiting": 1,
            "note": None,
        }
    finally:
        buf._engines()
        with buf._engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}"))
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {table}_batches"))
        buf.close()


def test_an_import_path_in_a_run_config_is_never_imported(api, runs):
    marker = runs.parent / "imported.txt"
    plugin = runs.parent / "studio_evil_storage.py"
    plugin.write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\nclass S: pass\n"
    )
    sys.path.insert(0, str(runs.parent))
    try:
        make_run(runs, "evil", stage(buffer={"storage": "studio_evil_storage:S"}))
        note = api.get("/api/runs/evil").json()["buffer"]["note"]
    finally:
        sys.path.remove(str(runs.parent))
    assert "import paths are not loaded" in note and not marker.exists()


@pytest.mark.slow
def test_a_real_short_run_watched_while_it_runs(tmp_path, tiny_model_dir):
    """`python -m trine.cli run` (2 steps, SQL buffer, eval each step), polled as the page polls it."""
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    eval_set = {
        "name": "addition",
        "path": str(EXAMPLE / "data" / "eval.jsonl"),
        "sampling": {"max_tokens": 4},
        "limit": 8,
    }
    extra = {"run_dir": str(runs_dir / "r"), "tasks": {"total_steps": 2, "eval": [eval_set]}}
    config = write_arithmetic_config(
        tmp_path, tiny_model_dir, "r", extra, {"eval": {"every": 1, "k": 1}, "buffer": {"storage": "sql"}}
    )
    states, rows, after = [], [], 0
    with background(StudioSettings(runs_dir=runs_dir)) as url, httpx.Client(base_url=url, timeout=30) as api:
        proc = subprocess.Popen(
            [sys.executable, "-m", "trine.cli", "run", str(config)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            while True:
                finished = proc.poll() is not None
                if any(r["name"] == "r" for r in api.get("/api/runs").json()["runs"]):
                    states.append(api.get("/api/runs/r").json()["state"])
                    page = api.get("/api/runs/r/metrics", params={"after": after}).json()
                    rows, after = rows + page["rows"], page["next"]
                if finished:
                    break
                time.sleep(0.1)
        finally:
            out = proc.communicate(timeout=120)[0]
        assert proc.returncode == 0, out
        run = runs_dir / "r"
        before = snapshot(run)
        detail = api.get("/api/runs/r").json()
        evals = api.get("/api/runs/r/evals").json()
        assert api.get("/api/runs/r/metrics", params={"after": after}).json()["rows"] == []
        assert snapshot(run) == before
    assert "running" in states and states[-1] == "finished"
    assert [r["step"] for r in rows] == [1, 2] and all(r["stage"] == "main" for r in rows)
    assert (detail["step"], detail["total_steps"], detail["notes"]) == (2, 2, [])
    assert detail["stages"] == [{"name": "main", "mode": "sync", "total_steps": 2}]
    assert "eval:" in detail["config_yaml"] and detail["processes"] == []
    assert detail["buffer"]["storage"] == "sql" and detail["buffer"]["counts"]["trained"] == 2 * 4 * 4
    assert evals["tasksets"] == ["addition"] and [r["step"] for r in evals["rows"]] == [1, 2]
    assert {"accuracy", "avg@1", "pass@1"} <= set(evals["columns"])


def test_run_detail_shows_the_alarms_the_run_raised(tmp_path):
    """status.json's ``alarms`` (trine.monitor.alarms) come back in the run's JSON; entries that are not
    objects, or an ``alarms`` that is not a list, are left out."""
    alarm = {
        "kind": "truncation",
        "step": 7,
        "message": "truncation: 95% of responses were cut at max_tokens over the last 5 steps",
        "numbers": {"explorer/truncated_fraction": 0.95, "threshold": 0.9, "window": 5.0},
    }
    finished = {"state": "finished", "step": 8, "pid": 1, "ended_at": now(), "alarms": [alarm, "junk"]}
    make_run(tmp_path, "hacked", stage(total=8), finished)
    make_run(tmp_path, "odd", stage(), {"state": "finished", "step": 1, "alarms": 5})
    make_run(tmp_path, "calm", stage(), {"state": "finished", "step": 1})
    with (
        background(StudioSettings(runs_dir=tmp_path)) as url,
        httpx.Client(base_url=url, timeout=30) as client,
    ):
        assert client.get("/api/runs/hacked").json()["alarms"] == [alarm]
        assert client.get("/api/runs/odd").json()["alarms"] == []
        assert client.get("/api/runs/calm").json()["alarms"] == []
