"""Reading a run's ``metrics.jsonl`` for the studio: incremental polls by byte offset, and the eval table.

:func:`read_metrics` returns the complete lines from a byte offset on (a line still being written waits
for the next poll; a corrupt one is skipped with a note naming its line; at most :data:`MAX_BYTES` a
call, so a long run's file pages). :func:`eval_table` turns the ``eval/<taskset>/<metric>`` keys of
``metrics.jsonl`` and ``bench.jsonl`` (:mod:`trine.launch.bench`) into rows per step and taskset. Both
only read; NaN and infinite values become null (JSON has neither).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

from fastapi import HTTPException

from trine.status import STALE_SECONDS

MAX_BYTES = 4 << 20
"""The most bytes of ``metrics.jsonl`` one metrics call reads (a long run's file pages)."""
_CACHE_SIZE = 256


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (JSON has no NaN; a diverged loss
    must not turn a page into an error)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def is_number(value: Any) -> bool:
    """Whether ``value`` is an int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _lines_before(path: Path, offset: int) -> int:
    """Newlines in the first ``offset`` bytes of ``path`` (for line numbers in notes)."""
    count = 0
    with path.open("rb") as handle:
        while offset > 0:
            chunk = handle.read(min(offset, 1 << 20))
            if not chunk:
                break
            count += chunk.count(b"\n")
            offset -= len(chunk)
    return count


def _parse_lines(
    chunk: bytes, first_line: Any, name: str, needle: bytes = b""
) -> tuple[list[dict[str, Any]], list[str]]:
    """The JSON objects of the complete lines in ``chunk`` (those holding ``needle``); a note per bad
    line. ``first_line()`` gives the number of the chunk's first line (computed only when a note needs it)."""
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    base = None
    for index, line in enumerate(chunk.split(b"\n")[:-1]):
        if not line.strip() or needle not in line:
            continue
        try:
            record = json.loads(line)
            problem = None if isinstance(record, dict) else f"a JSON {type(record).__name__}, not an object"
        except ValueError:
            problem = "not valid JSON"
        if problem is None:
            rows.append(finite(record))
            continue
        base = first_line() if base is None else base
        notes.append(f"{name} line {base + index}: {problem} (skipped)")
    return rows, notes


def read_metrics(path: Path, after: int = 0, max_bytes: int | None = None) -> dict[str, Any]:
    """``{"rows", "next", "keys", "notes"}``: the complete lines of the metrics file ``path`` from byte
    ``after`` on (at most ``max_bytes``, default :data:`MAX_BYTES`). A last line without its newline
    (being written) is left for the next call; corrupt lines are skipped with a note naming their line;
    ``keys`` are the numeric keys of these rows other than ``step``, sorted. A file shorter than
    ``after`` was cut back (a resumed run rewinds it): it is read again from the start, with
    ``"reset": True``. An ``after`` that is not the start of a line is refused (400)."""
    limit = MAX_BYTES if max_bytes is None else max_bytes
    empty: dict[str, Any] = {"rows": [], "next": 0, "keys": [], "notes": []}
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return {**empty, "notes": [f"no {path.name} yet: no step has been logged"]}
    notes: list[str] = []
    with handle:
        size = os.fstat(handle.fileno()).st_size
        mtime = os.fstat(handle.fileno()).st_mtime
        reset = after > size
        if reset:
            notes.append(
                f"{path.name} is {size} bytes, shorter than the offset {after}: it was cut back (a resumed "
                "run rewinds it to its checkpoint); read again from the start"
            )
            after = 0
        if after > 0:
            handle.seek(after - 1)
            if handle.read(1) != b"\n":
                raise HTTPException(
                    400,
                    f"after={after} is not the start of a line of {path.name}; pass 0 or a `next` it returned",
                )
        handle.seek(after)
        data = handle.read(limit)
        end = data.rfind(b"\n") + 1
        rest = len(data) - end
        if end == 0 and len(data) == limit:  # one line longer than the limit: skip it
            end, rest, data = _skip_line(handle, after + limit) - after, 0, b""
            notes.append(f"{path.name}: a line at byte {after} is longer than {limit} bytes (skipped)")
    rows, bad = _parse_lines(data[:end], lambda: _lines_before(path, after) + 1, path.name)
    if rest and after + end + rest >= size and time.time() - mtime > STALE_SECONDS:
        bad.append(
            f"{path.name} ends with an unfinished line ({rest} bytes, unchanged for "
            f"{time.time() - mtime:.0f}s): torn by a crash mid-write; not shown"
        )
    keys = sorted({k for r in rows for k, v in r.items() if k != "step" and is_number(v)})
    out = {"rows": rows, "next": after + end, "keys": keys, "notes": notes + bad}
    return {**out, "reset": True} if reset else out


def _skip_line(handle: Any, position: int) -> int:
    """The offset just after the next newline at or after ``position`` (the file's end if none)."""
    handle.seek(position)
    while chunk := handle.read(1 << 20):
        found = chunk.find(b"\n")
        if found >= 0:
            return position + found + 1
        position += len(chunk)
    return position


_evals: dict[Path, dict[str, Any]] = {}
_evals_lock = threading.Lock()


def _eval_records(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The records of the jsonl file ``path`` that have ``eval/`` keys, and notes on bad lines. Read
    incrementally: a file that only grew since the last call is read from where that call stopped (one
    that was replaced or cut back, as a resumed run cuts its metrics, is read again from the start)."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return [], []
    with _evals_lock, path.open("rb") as handle:
        state = _evals.get(path)
        if state is not None and state["ino"] == stat.st_ino and state["offset"] <= stat.st_size:
            handle.seek(state["offset"] - len(state["tail"]))
            state = state if handle.read(len(state["tail"])) == state["tail"] else None
        if state is None or state["ino"] != stat.st_ino or state["offset"] > stat.st_size:
            state = {"ino": stat.st_ino, "offset": 0, "tail": b"", "lines": 0, "records": [], "notes": []}
        handle.seek(state["offset"])
        data = handle.read(stat.st_size - state["offset"])
        end = data.rfind(b"\n") + 1
        lines = state["lines"]
        rows, notes = _parse_lines(data[:end], lambda: lines + 1, path.name, needle=b'"eval/')
        state["records"] += [r for r in rows if any(k.startswith("eval/") for k in r)]
        state["notes"] += notes
        state["lines"] += data[:end].count(b"\n")
        state["offset"] += end
        state["tail"] = (state["tail"] + data[:end])[-64:]
        if len(_evals) >= _CACHE_SIZE:
            _evals.clear()
        _evals[path] = state
        return list(state["records"]), list(state["notes"])


def eval_table(run_dir: Path) -> dict[str, Any]:
    """``{"tasksets", "columns", "rows": [{"step", "taskset", "source", "stage", col: value}], "notes"}``:
    one row per step and taskset from ``metrics.jsonl`` (source ``run``) and ``bench.jsonl`` (source
    ``bench``); a key ``eval/<taskset>/<metric>`` gives column ``metric``. A step logged twice (a resumed
    run) keeps its last values."""
    table: dict[tuple[int, str, str], dict[str, Any]] = {}
    tasksets: dict[str, None] = {}
    columns: dict[str, None] = {}
    notes: list[str] = []
    for source, name in (("run", "metrics.jsonl"), ("bench", "bench.jsonl")):
        records, bad = _eval_records(run_dir / name)
        notes += bad
        for record in records:
            if not is_number(record.get("step")):
                continue
            for key, value in record.items():
                parts = key.split("/")
                if parts[0] != "eval" or len(parts) < 3 or not (is_number(value) or value is None):
                    continue
                taskset, metric = "/".join(parts[1:-1]), parts[-1]
                tasksets[taskset] = columns[metric] = None
                row = table.setdefault(
                    (int(record["step"]), taskset, source),
                    {"step": int(record["step"]), "taskset": taskset, "source": source},
                )
                row.update({"stage": record.get("stage"), metric: value})
    rows = [table[k] for k in sorted(table, key=lambda k: (k[0], k[1], k[2] != "run"))]
    return {"tasksets": list(tasksets), "columns": list(columns), "rows": rows, "notes": notes}
