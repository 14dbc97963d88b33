"""The studio's experience queries on a 100,000-row SQLite buffer, through the real HTTP API.

A run directory with a SQL buffer (``buffer.db``, the table of :mod:`trine.buffer.sql_schema`) is filled
with ``--rows`` experiences (default 100,000) that look like a long run's: ~200 tokens each (prompt
40-80, response 60-240, with logprobs), 2,000 tasks in groups of 8, 64 rows per explore step (``batch``),
one policy version per 4 batches, varied rewards, ``stop``/``length`` finish reasons, and the statuses of a
run in progress (mostly trained, some stale and expired, the newest ready or pending). Rows go in with one
``executemany`` per 5,000 through the table. The studio (``trine.studio``, uvicorn in a thread) then
answers each query ``--repeats`` times after a warm-up; the table gives the median wall time of the HTTP
request (client to parsed JSON) and the median ``query_ms`` the server reports for the list queries.

Target: every query under ~300 ms (the issue: "100k rows stay responsive").

``--without-indexes`` drops the three indexes the studio's queries use (``ix_experiences_browse``,
``_batch``, ``_finish`` of :func:`trine.buffer.sql_schema.build_table`) first: the before/after of those.

Usage: python benchmarks/studio_query.py [--rows 100000] [--repeats 7] [--rebuild] [--without-indexes]
[--title TEXT] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path

import httpx
import sqlalchemy as sa
import yaml
from common import CACHE, markdown_table, median, report, tiny_model
from sqlalchemy.schema import CreateIndex, DropIndex

from trine.buffer.sql_schema import build_batches_table, build_table, pack
from trine.studio.app import StudioSettings
from trine.studio.server import background

ROWS_PER_BATCH, GROUP, TASKS, CHUNK = 64, 8, 2000, 5000
WORDS = "the answer is so we add carry one then five plus seven equals twelve check again".split()


def row(seq: int, rng: random.Random, total: int, now: float) -> dict:
    """One stored experience (the column values ``experience_to_row`` would give, plus its fate)."""
    batch = seq // ROWS_PER_BATCH
    group = seq // GROUP
    task = f"task-{(group * 7919) % TASKS:04d}"
    prompt, response = rng.randint(40, 80), rng.randint(60, 240)
    finish = "length" if response > 220 else "stop"
    reward = None if seq > total - 300 else round(rng.choice([0.0, 0.0, 1.0, rng.random()]), 3)
    status, consumed, expired = ("pending", None, None) if reward is None else ("ready", None, None)
    age = total - seq
    if age > 2000:
        status, consumed = ("dropped", None) if rng.random() < 0.03 else ("ready", now - age)
    elif age > 300 and rng.random() < 0.01:
        status, reward, expired = "dropped", None, now - age
    text = " ".join(rng.choice(WORDS) for _ in range(response // 3))
    return {
        "seq": seq + 1, "id": f"exp-{seq:06d}", "task_id": task, "taskset": "arith", "group_id": f"{task}@{batch}",
        "run_id": f"run-{seq:06d}", "step": 0, "policy_version": batch // 4, "reward": reward,
        "reward_status": status, "prompt_length": prompt, "response_length": response, "created_at": now - age,
        "consumed_at": consumed, "use_count": int(consumed is not None), "priority": float(batch // 4),
        "last_get": None, "expired_at": expired, "kind": "rollout", "status": "ok", "lineage": [],
        "tokens": pack([rng.randrange(3, 500) for _ in range(prompt + response)], "i"),
        "action_mask": pack([1] * response, "i"),
        "logprobs": pack([-rng.random() * 3 for _ in range(response)], "f"),
        "token_rewards": None,
        "info": {"batch": batch, "finish_reason": finish, "response": text, "reward_parts": {"accuracy": reward},
                 "temperature": 1.0},
    }  # fmt: skip


def build(run_dir: Path, rows: int, model: Path) -> None:
    """Write ``run_dir/config.yaml`` and fill ``run_dir/buffer.db`` with ``rows`` experiences."""
    run_dir.mkdir(parents=True, exist_ok=True)
    db = run_dir / "buffer.db"
    for path in (db, db.with_suffix(".db-wal"), db.with_suffix(".db-shm")):
        path.unlink(missing_ok=True)
    config = {"model": {"path": str(model)}, "buffer": {"storage": "sql"}, "algorithm": {"name": "grpo"}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    engine = sa.create_engine(f"sqlite:///{db}")
    table = build_table(sa.MetaData(), "experiences")
    build_batches_table(table.metadata, "experiences")
    table.metadata.create_all(engine)
    rng, now, start = random.Random(0), time.time(), time.perf_counter()
    with engine.begin() as conn:
        conn.exec_driver_sql("PRAGMA journal_mode=WAL")
    for lo in range(0, rows, CHUNK):
        with engine.begin() as conn:
            conn.execute(sa.insert(table), [row(s, rng, rows, now) for s in range(lo, min(rows, lo + CHUNK))])
    engine.dispose()
    print(f"filled {rows} rows in {time.perf_counter() - start:.1f}s ({db.stat().st_size / 2**20:.0f} MB)")


def set_indexes(run_dir: Path, present: bool) -> None:
    """Create (``present``) or drop the studio's indexes (``browse``, ``batch``, ``finish``) of the buffer
    table: ``--without-indexes`` measures the queries as an older table, made before them, answers them."""
    engine = sa.create_engine(f"sqlite:///{run_dir / 'buffer.db'}")
    table = build_table(sa.MetaData(), "experiences")
    with engine.begin() as conn:
        for index in table.indexes:
            if index.name.rsplit("_", 1)[-1] in ("browse", "batch", "finish"):
                conn.execute(DropIndex(index, if_exists=True))  # an older definition goes too
                if present:
                    conn.execute(CreateIndex(index))
    engine.dispose()


def queries(rows: int) -> list[tuple[str, str, dict]]:
    """(label, path under /api/runs/bench/, params) of every measured request."""
    deep = max(0, rows - 1000)
    return [
        ("list, page 1", "experiences", {}),
        (f"list, offset {deep:,}", "experiences", {"offset": deep}),
        ("status=trained", "experiences", {"status": "trained"}),
        ("status=pending", "experiences", {"status": "pending"}),
        ("status=stale", "experiences", {"status": "stale"}),
        ("kind=rollout", "experiences", {"kind": "rollout"}),
        ("task=task-0042", "experiences", {"task": "task-0042"}),
        ("reward 0.2..0.8", "experiences", {"reward_min": 0.2, "reward_max": 0.8}),
        ("version 100..120", "experiences", {"version_min": 100, "version_max": 120}),
        ("step (batch) 500..510", "experiences", {"step_min": 500, "step_max": 510}),
        ("finish_reason=length", "experiences", {"finish_reason": "length"}),
        ("order=-reward", "experiences", {"order": "-reward"}),
        (f"order=-reward, offset {rows // 2:,}", "experiences", {"order": "-reward", "offset": rows // 2}),
        ("combined (status, reward, version, step, finish)", "experiences",
         {"status": "trained", "reward_min": 0.5, "version_min": 50, "step_max": 1200, "finish_reason": "stop",
          "order": "-reward"}),
        ("facets", "experiences/facets", {}),
        ("one experience (detail view)", f"experiences/exp-{rows // 2:06d}", {}),
    ]  # fmt: skip


def measure(base: str, rows: int, repeats: int) -> list[list[object]]:
    out = []
    with httpx.Client(base_url=f"{base}/api/runs/bench/", timeout=120) as client:
        for label, path, params in queries(rows):
            walls, server, body = [], [], None
            for i in range(repeats + 1):  # the first is a warm-up
                start = time.perf_counter()
                response = client.get(path, params=params)
                body = response.json()
                if response.status_code != 200:
                    raise RuntimeError(f"{label}: HTTP {response.status_code}: {body}")
                if i:
                    walls.append((time.perf_counter() - start) * 1000)
                    server.append(body.get("query_ms", float("nan")))
            total = body.get("total", "-") if isinstance(body, dict) else "-"
            ms = median(server) if "query_ms" in body else "-"
            out.append([label, total, round(median(walls), 1), ms if ms == "-" else round(ms, 1)])
            print(out[-1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=7, help="timed requests per query (medians)")
    parser.add_argument("--rebuild", action="store_true", help="fill the buffer again even if cached")
    parser.add_argument("--dir", type=Path, default=CACHE / "studio_query", help="the runs directory")
    parser.add_argument(
        "--title", default="", help="suffix of the RESULTS.md title (e.g. 'before the index')"
    )
    parser.add_argument("--without-indexes", action="store_true", help="drop the studio's indexes first")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    run_dir = args.dir / "bench"
    marker = run_dir / f".rows-{args.rows}"
    if args.rebuild or not marker.exists():
        for old in run_dir.glob(".rows-*"):
            old.unlink()
        build(run_dir, args.rows, tiny_model("tiny-0.5m"))
        marker.touch()
    set_indexes(run_dir, present=not args.without_indexes)
    with background(StudioSettings(runs_dir=args.dir)) as base:
        table = measure(base, args.rows, args.repeats)
    headers = ["query", "total", "HTTP ms (median)", "server query_ms (median)"]
    size = (run_dir / "buffer.db").stat().st_size / 2**20
    notes = (
        f"{args.rows:,} rows (~200 tokens each, {size:.0f} MB SQLite file, WAL), page size 50, medians of "
        f"{args.repeats} requests after a warm-up, over real HTTP (httpx -> uvicorn in a thread, same process). "
        f"query_ms is the server's time for COUNT + page query. Load average {os.getloadavg()[0]:.1f} at the end. "
        f"Command: `python benchmarks/studio_query.py --rows {args.rows} --repeats {args.repeats}"
        f"{' --without-indexes' if args.without_indexes else ''}`."
    )
    title = f"Studio experience queries, {args.rows:,}-row SQLite buffer" + (
        f" ({args.title})" if args.title else ""
    )
    report(title, markdown_table(headers, table), notes, write=not args.no_write)


if __name__ == "__main__":
    main()
