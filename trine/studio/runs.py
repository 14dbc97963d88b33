"""The studio's Runs API: every run under the runs directory, one run's state, its metrics and evals.

A run is a directory directly under the runs directory that holds a ``config.yaml``, a ``status.json``
or a ``metrics.jsonl`` (hidden directories such as ``.studio`` are not runs). Everything here only
reads: no file is created or changed in a run directory (a SQLite buffer is opened read-only, see
:func:`readonly_engine`). What a half-written run lacks, or a corrupt file holds, comes back as a
``notes`` line, never as an error page.

- ``GET /api/runs``: a summary per run, newest first (:func:`run_summary`).
- ``GET /api/runs/{name}``: state, status, stages, resolved config, processes, buffer counts, the
  alarms the run raised (``status.json``'s ``alarms``, :mod:`trine.monitor.alarms`) (:func:`run_detail`).
- ``GET /api/runs/{name}/metrics?after=BYTES``: the ``metrics.jsonl`` lines from a byte offset on
  (:func:`trine.studio.run_metrics.read_metrics`); ``next`` is where the next poll starts.
- ``GET /api/runs/{name}/evals``: the ``eval/<taskset>/<metric>`` values per step as a table, with the
  rows of ``bench.jsonl`` when the run has one (:func:`trine.studio.run_metrics.eval_table`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import yaml
from fastapi import APIRouter, Depends, HTTPException, Query

from trine.status import describe
from trine.studio.paths import check_name, inside, run_path, run_problem
from trine.studio.run_metrics import eval_table, finite, is_number, read_metrics
from trine.studio.settings import StudioSettings, studio

router = APIRouter()

RUN_FILES = ("config.yaml", "status.json", "metrics.jsonl")
"""A directory holding any of these is a run."""
STATES = ("running", "stuck", "dead", "finished", "stopped", "failed", "unknown")
"""The states a run is known to have; the studio shows whatever name :func:`trine.status.describe` gives."""
MAX_CONFIG_BYTES = 1 << 20
"""A ``config.yaml`` larger than this is not shown (trine writes a few KB per stage)."""
_CACHE_SIZE = 256
_configs: dict[Path, tuple[tuple[int, int], dict[str, Any]]] = {}


def read_config(run_dir: Path) -> dict[str, Any]:
    """``{"text", "stages": [{"name", "mode", "total_steps"}], "notes"}`` from ``run_dir/config.yaml``
    (text None and no stages when it is missing, too large or not a trine config); cached by the
    file's size and mtime."""
    path = run_dir / "config.yaml"
    try:
        stat = path.stat()
    except FileNotFoundError:
        note = "no config.yaml yet: the run is starting, or the directory was not written by `trine run`"
        return {"text": None, "stages": [], "notes": [note]}
    key = (stat.st_mtime_ns, stat.st_size)
    cached = _configs.get(path)
    if cached is not None and cached[0] == key:
        return cached[1]
    if stat.st_size > MAX_CONFIG_BYTES:
        big = f"config.yaml is {stat.st_size} bytes (more than {MAX_CONFIG_BYTES}); not shown"
        result: dict[str, Any] = {"text": None, "stages": [], "notes": [big]}
    else:
        result = _parse_config(path.read_text(encoding="utf-8", errors="replace"))
    if len(_configs) >= _CACHE_SIZE:
        _configs.clear()
    _configs[path] = (key, result)
    return result


def _parse_config(text: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        return {
            "text": text,
            "stages": [],
            "notes": [f"config.yaml is not valid YAML ({first}); no stages shown"],
        }
    if not isinstance(data, dict):
        note = (
            f"config.yaml holds a {type(data).__name__}, expected a mapping (a trine config); no stages shown"
        )
        return {"text": text, "stages": [], "notes": [note]}
    raw = data.get("stages") if isinstance(data.get("stages"), list) else [data]
    stages = []
    for entry in raw:
        entry = entry if isinstance(entry, dict) else {}
        tasks = entry.get("tasks") if isinstance(entry.get("tasks"), dict) else {}
        total = tasks.get("total_steps")
        stages.append(
            {
                "name": str(entry.get("stage", "main")),
                "mode": str(entry.get("mode", "sync")),
                "total_steps": total if isinstance(total, int) and not isinstance(total, bool) else None,
            }
        )
    return {"text": text, "stages": stages, "notes": []}


def read_state(run_dir: Path) -> tuple[dict[str, Any], str, str, list[str]]:
    """``(status.json as a dict, state, why, notes)``; state as :func:`trine.status.describe` says it
    (``running`` with a live pid and fresh heartbeat, ``dead`` otherwise, ...), or ``unknown`` with a
    note when there is no readable ``status.json``."""
    path = run_dir / "status.json"
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        note = "no status.json: the run has not started yet, or was not written by `trine run`; state unknown"
        return {}, "unknown", "", [note]
    try:
        record = json.loads(text)
    except ValueError as err:
        note = (
            f"status.json is not valid JSON ({err}); state unknown. trine replaces it atomically, so "
            "another program wrote it: delete it, or run the run again to rewrite it"
        )
        return {}, "unknown", "", [note]
    if not isinstance(record, dict):
        return (
            {},
            "unknown",
            "",
            [f"status.json holds a {type(record).__name__}, expected an object; state unknown"],
        )
    record = finite(record)
    try:
        state, why = describe(record)
    except (ValueError, TypeError) as err:  # a hand-edited heartbeat or pid
        return record, "unknown", "", [f"status.json has a bad pid or heartbeat ({err}); state unknown"]
    if not isinstance(state, str) or not state:  # any other name describe gives is shown as it is
        return (
            record,
            "unknown",
            str(why),
            [f"status.json has state {state!r}, expected a name such as {list(STATES)}"],
        )
    return record, state, str(why), []


def _step(run_dir: Path, status: dict[str, Any]) -> int | None:
    """The run's step: the status's, else the last ``step`` in ``metrics.jsonl``."""
    from trine.inspect.report import last_value

    step = status.get("step")
    if is_number(step):
        return int(step)
    found = last_value(run_dir / "metrics.jsonl", "step")
    return None if found is None else int(found)


def _updated(run_dir: Path) -> float:
    times = []
    for name in RUN_FILES:
        try:
            times.append((run_dir / name).stat().st_mtime)
        except OSError:
            pass
    return max(times) if times else run_dir.stat().st_mtime


def _total(stages: list[dict[str, Any]]) -> int | None:
    totals = [s["total_steps"] for s in stages]
    return None if not totals or None in totals else sum(totals)


def run_summary(run_dir: Path) -> dict[str, Any]:
    """One line of the runs table: name, state, why, step, total_steps, mode, stage names, updated
    (unix time of the newest of its files) and notes."""
    status, state, why, notes = read_state(run_dir)
    config = read_config(run_dir)
    stages = config["stages"]
    return {
        "name": run_dir.name,
        "state": state,
        "why": why,
        "step": _step(run_dir, status),
        "total_steps": _total(stages),
        "mode": "/".join(dict.fromkeys(s["mode"] for s in stages)) or None,
        "stages": [s["name"] for s in stages],
        "updated": _updated(run_dir),
        "notes": notes + config["notes"],
    }


def _alarms(status: dict[str, Any]) -> list[dict[str, Any]]:
    """The alarms ``status.json`` holds (a hand-edited entry that is not an object is left out)."""
    found = status.get("alarms")
    return [a for a in found if isinstance(a, dict)] if isinstance(found, list) else []


def run_detail(run_dir: Path) -> dict[str, Any]:
    """Everything the run page's header shows (see the module docstring)."""
    status, state, why, notes = read_state(run_dir)
    config = read_config(run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        notes.append("no metrics.jsonl yet: no step has been logged")
    buffer = run_buffer(run_dir) if config["stages"] else None
    return {
        "name": run_dir.name,
        "state": state,
        "why": why,
        "status": status,
        "step": _step(run_dir, status),
        "total_steps": _total(config["stages"]),
        "stages": config["stages"],
        "config_yaml": config["text"],
        "processes": processes(run_dir),
        "buffer": buffer,
        "annotations": (run_dir / "annotations.db").is_file(),
        "alarms": _alarms(status),
        "notes": notes + config["notes"],
    }


def processes(run_dir: Path) -> list[dict[str, Any]]:
    """The trainer and each explorer of an async run with explorer processes (an ``explorers/``
    directory), as ``trine status`` reports them (:mod:`trine.inspect.report`); [] for other runs.
    The buffer is not counted here (:func:`run_buffer` does it, read-only)."""
    from dataclasses import asdict

    from trine.inspect.report import process_status, published_version

    if not (run_dir / "explorers").is_dir():
        return []
    trainer = process_status("trainer", run_dir, "trainer/version")
    if trainer.version is None:
        trainer.version = published_version(run_dir)
    found = [p for p in (run_dir / "explorers").iterdir() if p.is_dir() and p.name.isdigit()]
    out = [trainer]
    for path in sorted(found, key=lambda p: int(p.name)):
        explorer = process_status(f"explorer {path.name}", path, "explorer/version")
        if explorer.version is not None and trainer.version is not None:
            explorer.lag = trainer.version - explorer.version
        out.append(explorer)
    return [finite(asdict(p)) for p in out]


# -- the buffer ------------------------------------------------------------------------------------

MAX_FILE_BUFFER_BYTES = 64 << 20
"""A file buffer's log larger than this is not replayed to count its rows."""


def readonly_engine(url: str) -> Any:
    """A SQLAlchemy engine that reads the database at ``url`` without writing anything: a SQLite file
    is opened read-only, and ``immutable`` when it has no ``-wal`` file (no process has it open), so
    that not even the ``-wal``/``-shm`` files SQLite makes for a reader appear (while a run writes it,
    a reader, as any, marks its place in the ``-shm`` shared-memory index). Other backends: as is (use
    it for SELECTs only; PostgreSQL sessions are read-only)."""
    import sqlite3
    from urllib.parse import quote

    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "postgresql":
        return sa.create_engine(parsed, connect_args={"options": "-c default_transaction_read_only=on"})
    if parsed.get_backend_name() != "sqlite":
        return sa.create_engine(parsed)
    path = Path(parsed.database or "").absolute()

    def connect() -> sqlite3.Connection:  # decided per connection: a finished run may be resumed later
        flag = "mode=ro" if Path(f"{path}-wal").exists() else "immutable=1"
        connection = sqlite3.connect(
            f"file:{quote(str(path))}?{flag}", uri=True, timeout=10.0, check_same_thread=False
        )
        connection.execute("PRAGMA busy_timeout=10000")
        return connection

    # no pool: each use opens a fresh connection (about a millisecond), so a cached engine never reads
    # an "immutable" file that a resumed run has started writing again
    return sa.create_engine("sqlite://", creator=connect, poolclass=sa.pool.NullPool)


def sql_counts(url: str, table_name: str) -> dict[str, int] | None:
    """Rows of a SQL buffer table by state (:data:`trine.buffer.states.STATES`, the names ``trine
    buffer`` and ``trine status`` use too) plus ``batches_waiting``; None when the SQLite file does not
    exist. SQLAlchemy errors propagate."""
    from trine.buffer.sql_sampling import batches_waiting
    from trine.buffer.sql_schema import build_batches_table, build_table
    from trine.buffer.states import STATES, sql_state_counts

    parsed = sa.make_url(url)
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").is_file():
        return None
    engine = readonly_engine(url)
    try:
        with engine.connect() as conn:
            tables = sa.inspect(conn)
            if not tables.has_table(table_name):
                return dict.fromkeys(STATES, 0)
            t = build_table(sa.MetaData(), table_name)
            found: dict[str, int] = sql_state_counts(conn, t)
            b = build_batches_table(t.metadata, table_name)
            found["batches_waiting"] = batches_waiting(conn, b) if tables.has_table(b.name) else 0
    finally:
        engine.dispose()
    return found


def run_buffer(run_dir: Path) -> dict[str, Any]:
    """``{"storage", "counts": {status: n} | None, "batches_waiting", "note"}`` of the run's buffer (the
    stage :func:`trine.buffer.inspect.run_stage_config` picks: the last persistent one)."""
    from trine.buffer.inspect import run_buffer_config
    from trine.registry import no_imports

    out: dict[str, Any] = {"storage": None, "counts": None, "batches_waiting": None, "note": None}
    # validating the section resolves buffer.storage: an import path there is refused, never imported
    with no_imports("the studio (it reads a run's buffer; it never imports the code a config names)"):
        try:
            config = run_buffer_config(run_dir)
        except (ValueError, TypeError, FileNotFoundError) as err:
            return {**out, "note": f"unreadable: {err}"}
        out["storage"] = config.storage
        try:
            _count(run_dir, config, out)
        except (ValueError, TypeError, KeyError, OSError) as err:
            out["note"] = f"could not count the buffer ({type(err).__name__}: {err})"
        except sa.exc.SQLAlchemyError as err:  # a half-written, locked or foreign database
            out["note"] = f"could not read the buffer ({type(err).__name__}: {str(err).splitlines()[0]})"
    return out


def _count(run_dir: Path, config: Any, out: dict[str, Any]) -> None:
    from trine.buffer.files import FileBuffer
    from trine.buffer.inspect import read_rows
    from trine.buffer.open import open_buffer, storage_arguments, storage_class
    from trine.buffer.sql import SQLBuffer
    from trine.buffer.states import STATES

    cls = storage_class(config)
    if issubclass(cls, SQLBuffer):
        buffer = open_buffer(config, run_dir)  # connects only when used: this takes its url and table
        counts = sql_counts(buffer.url, buffer.table_name)
        if counts is None:
            out["note"] = "no database yet (the run has not put anything)"
            return
        out["batches_waiting"] = counts.pop("batches_waiting")
        out["counts"] = counts
    elif issubclass(cls, FileBuffer):
        path = Path(storage_arguments(config, run_dir).get("path", "buffer.jsonl"))
        if path.is_file() and path.stat().st_size > MAX_FILE_BUFFER_BYTES:
            out["note"] = f"{path} is over {MAX_FILE_BUFFER_BYTES >> 20} MB; not replayed to count its rows"
            return
        counts = dict.fromkeys(STATES, 0)
        for _, status in read_rows(run_dir) or []:
            counts[status] += 1
        out["counts"] = counts
    else:
        out["note"] = (
            f"buffer.storage {config.storage!r} keeps the buffer in the run's process: it cannot be "
            "counted from outside (its checkpoints keep what was not trained yet)"
        )


# -- routes ----------------------------------------------------------------------------------------


def _is_run(path: Path) -> bool:
    return path.is_dir() and any((path / name).is_file() for name in RUN_FILES)


@router.get("/runs")
def list_runs(settings: StudioSettings = Depends(studio)) -> dict[str, Any]:
    """Every run under the runs directory, newest first."""
    root = Path(settings.runs_dir)
    if not root.is_dir():
        return {"runs_dir": str(root), "runs": [], "notes": [f"the runs directory {root} does not exist"]}
    runs, notes = [], []
    for entry in sorted(root.iterdir()):
        try:
            if entry.name.startswith(".") or not inside(root, entry) or not _is_run(entry):
                continue  # a run directory linked from outside is not listed (named, it is refused)
        except OSError:  # unreadable: not shown, as any directory that is not a run
            continue
        try:
            check_name(entry.name)
            problem = run_problem(root, entry)
            if problem is not None:
                notes.append(f"{entry.name!r} is not shown: {problem}")
                continue
            runs.append(run_summary(entry))
        except HTTPException:
            notes.append(
                f"{entry.name!r} is not shown: a run's name may hold only letters, digits, '_', '-', '.'"
            )
        except OSError as err:  # a directory this user may not read
            notes.append(f"{entry.name!r} is not shown: {err}")
    runs.sort(key=lambda r: -r["updated"])
    return {"runs_dir": str(root), "runs": runs, "notes": notes}


@router.get("/runs/{name}")
def get_run(name: str, settings: StudioSettings = Depends(studio)) -> dict[str, Any]:
    """One run's state, status, stages, resolved config, processes, buffer counts and notes."""
    return run_detail(run_path(settings.runs_dir, name))


@router.get("/runs/{name}/metrics")
def get_metrics(
    name: str,
    after: int = Query(0, ge=0, description="Byte offset to read from: 0, then the `next` of the last call."),
    settings: StudioSettings = Depends(studio),
) -> dict[str, Any]:
    """The run's ``metrics.jsonl`` lines from byte ``after`` on (see :func:`read_metrics`)."""
    return read_metrics(run_path(settings.runs_dir, name) / "metrics.jsonl", after)


@router.get("/runs/{name}/evals")
def get_evals(name: str, settings: StudioSettings = Depends(studio)) -> dict[str, Any]:
    """The run's eval table (see :func:`eval_table`)."""
    return eval_table(run_path(settings.runs_dir, name))
