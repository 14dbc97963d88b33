"""File storage: import/export of experiences (jsonl, parquet) and a jsonl-backed buffer.

Formats (one record per Experience; the names are the ``Experience`` fields):

``.jsonl`` — one JSON object per line, ``Experience.to_dict()``: ``id`` (str), ``tokens`` (list of
int), ``prompt_length`` (int), ``action_mask`` (list of int), ``logprobs`` (list of float or null),
``reward`` (float or null), ``token_rewards`` (list of float or null), ``task_id``, ``group_id``,
``run_id`` (str), ``step``, ``policy_version`` (int), ``kind`` (str), ``info`` (object). Floats are
written exactly (Python ``repr``). A :class:`FileBuffer` log adds event lines, recognised by an
``"_event"`` key: ``{"_event": "reward", "id": ..., "reward": ...}`` (a pending reward filled in),
``{"_event": "consumed", "ids": [...]}`` (one FIFO get), ``{"_event": "used", "ids": [...]}`` (one
priority-sampler get: each use count grows by one, those at ``reuse_limit`` are consumed),
``{"_event": "dropped", "ids": [...]}`` (stale) and ``{"_event": "expired", "ids": [...], "reward":
null or a number}`` (pending past ``pending_timeout``: dropped, or given the default reward),
``{"_event": "batch", "batch": id, "size": n}`` (after the experiences of each put, in the same
write: the put was one explored batch of ``n``; ``n`` may be 0) and ``{"_event": "taken", "batch":
id}`` (``get(None)`` took that explored batch; written with the get's hand-out).
``{"_event": "rewind", "to": N}`` (a run resumed from a checkpoint taken when the log held ``N``
records) undoes what the records between the ``N``-th and itself did: experiences put there are
*rolled back* (gone) with their batch records, hand-outs (and batches taken), stale drops and
expiries there are undone; only the rewards filled in there (by a grader, which will not send them
again) stay. :func:`resolve_rewinds` gives the records in effect. :func:`import_experiences`
reads the records in effect, applies the rewards of ``reward`` and ``expired`` events and ignores
the others, so a buffer's log imports as its experiences (without rolled-back ones).

``.parquet`` — columns ``id`` string, ``tokens`` list<int32>, ``prompt_length`` int32,
``action_mask`` list<int32>, ``logprobs`` list<float32> (null when None), ``reward`` float64 (null
when pending), ``token_rewards`` list<float32> (null when None), ``task_id`` / ``group_id`` /
``run_id`` / ``kind`` string, ``step`` / ``policy_version`` int64, ``info`` string (JSON text).
Logprobs and token rewards are rounded to float32. pyarrow is imported only for parquet.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any

from trine.buffer.memory import MemoryBuffer
from trine.types import Experience

_SUFFIXES = (".jsonl", ".parquet")


def _suffix(path: Path) -> str:
    if path.suffix not in _SUFFIXES:
        raise ValueError(f"experience file {str(path)!r}: expected a name ending in one of {_SUFFIXES}.")
    return path.suffix


def _parquet_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.string()),
            ("tokens", pa.list_(pa.int32())),
            ("prompt_length", pa.int32()),
            ("action_mask", pa.list_(pa.int32())),
            ("logprobs", pa.list_(pa.float32())),
            ("reward", pa.float64()),
            ("token_rewards", pa.list_(pa.float32())),
            ("task_id", pa.string()),
            ("group_id", pa.string()),
            ("run_id", pa.string()),
            ("step", pa.int64()),
            ("policy_version", pa.int64()),
            ("kind", pa.string()),
            ("info", pa.string()),
        ]
    )


def export_experiences(experiences: list[Experience], path: str | os.PathLike[str]) -> int:
    """Write ``experiences`` to ``path`` (``.jsonl`` or ``.parquet``); returns how many were written."""
    path = Path(path)
    suffix = _suffix(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".jsonl":
        with path.open("w", encoding="utf-8") as f:
            for e in experiences:
                f.write(json.dumps(e.to_dict(), ensure_ascii=False) + "\n")
        return len(experiences)
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{**e.to_dict(), "info": json.dumps(e.info, ensure_ascii=False)} for e in experiences]
    pq.write_table(pa.Table.from_pylist(rows, schema=_parquet_schema()), path)
    return len(experiences)


def import_experiences(path: str | os.PathLike[str]) -> list[Experience]:
    """Read the experiences stored in a ``.jsonl`` or ``.parquet`` file (see the module docstring)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"experience file {str(path)!r} does not exist; check the path.")
    if _suffix(path) == ".jsonl":
        found: dict[str, Experience] = {}
        for record in resolve_rewinds(_read_jsonl(path)):
            if "_event" not in record:
                e = Experience.from_dict(record)
                found[e.id] = e
            elif record["_event"] == "reward" and record["id"] in found:
                found[record["id"]].reward = record["reward"]
            elif record["_event"] == "expired" and record.get("reward") is not None:
                for exp_id in record["ids"]:
                    if exp_id in found:
                        found[exp_id].reward = record["reward"]
        return list(found.values())
    import pyarrow.parquet as pq

    out = []
    for row in pq.read_table(path).to_pylist():
        info = row.get("info")
        row["info"] = json.loads(info) if isinstance(info, str) else dict(info or {})
        out.append(Experience.from_dict({k: v for k, v in row.items() if v is not None or k == "reward"}))
    return out


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a jsonl file; a torn last line (a crash mid-write) is skipped with a warning."""
    lines = path.read_text(encoding="utf-8").splitlines()
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            if i == len(lines) - 1:
                warnings.warn(f"{path}: skipping a truncated last line ({err})", stacklevel=3)
                continue
            raise ValueError(f"{path}:{i + 1} is not valid JSON ({err}); fix or remove that line.") from err
    return records


def resolve_rewinds(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of a log in effect once its ``rewind`` events are applied (module docstring).

    A rewind to ``N`` keeps the records in effect after the first ``N`` log records plus the
    ``reward`` events logged since; rewinds themselves are not in the result.
    """
    live: list[dict[str, Any]] = []
    at = [0]  # at[i]: len(live) after the first i records of the log
    for record in records:
        if record.get("_event") == "rewind":
            kept = at[min(max(int(record["to"]), 0), len(at) - 1)]
            live = live[:kept] + [r for r in live[kept:] if r.get("_event") == "reward"]
        else:
            live.append(record)
        at.append(len(live))
    return live


def _repair_tail(path: Path) -> None:
    """End the log with a newline, cutting a torn last record (a crash mid-write), so appends stay valid."""
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    cut = data.rfind(b"\n") + 1
    try:
        json.loads(data[cut:])
    except ValueError:
        warnings.warn(
            f"{path}: cutting a truncated last line (a torn record: a crash mid-write)", stacklevel=4
        )
        os.truncate(path, cut)
        return
    with path.open("ab") as f:
        f.write(b"\n")


class FileBuffer(MemoryBuffer):
    """A buffer kept as an append-only jsonl log (format in the module docstring).

    Every put (with its explored-batch record), reward, hand-out (with the batch it took), stale
    drop and pending expiry is appended (and flushed) before it takes effect, and opening an
    existing file replays the log, so the buffer survives restarts and its file can be read with
    :func:`import_experiences`. The in-memory state and the sampling options (``**options``:
    ``rules``, ``clock``) are exactly
    :class:`~trine.buffer.memory.MemoryBuffer`'s, without ``capacity``. Pending timeouts restart
    when the file is reopened. Thread-safe, but **single process**: two processes appending to one
    file would each hand out the same experiences; use :class:`~trine.buffer.sql.SQLBuffer` for that.
    """

    def __init__(
        self, path: str | os.PathLike[str] = "buffer.jsonl", *, fsync: bool = False, **options: Any
    ) -> None:
        if "capacity" in options:
            raise ValueError(
                "FileBuffer does not take capacity (evictions are not logged); use storage 'memory' "
                "for a bounded buffer, or drop capacity."
            )
        super().__init__(**options)
        self.path = Path(path)
        if self.path.suffix != ".jsonl":
            raise ValueError(f"FileBuffer path={str(self.path)!r}: expected a '.jsonl' file.")
        self.fsync = fsync
        self._records = 0
        """Records in the log (``state_dict`` keeps it as the high-water mark of a checkpoint)."""
        self.last_rewind: dict[str, int] = {}
        """What the last ``load_state_dict`` undid: ``rolled_back`` puts and ``restored`` experiences."""
        if self.path.exists():
            self._replay()
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _replay(self) -> None:
        _repair_tail(self.path)
        records = _read_jsonl(self.path)
        self._records = len(records)
        for record in resolve_rewinds(records):
            if "_event" in record:
                self._apply(record)
            else:
                self._add(Experience.from_dict(record))

    def _journal(self, records: list[dict[str, Any]]) -> None:
        """Append the change to the log (flushed, optionally fsynced) before it takes effect."""
        if not records:
            return
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        with self.path.open("a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            if self.fsync:
                os.fsync(f.fileno())
        self._records += len(records)

    def state_dict(self) -> dict[str, Any]:
        """The log file is the state; this records its path, its length (``records``) and the counters."""
        with self._cond:
            return {"path": str(self.path), "records": self._records, **self._counters()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Rewind the buffer to the checkpoint that saved ``state``, then restore the counters.

        The experiences were replayed from the file when it was opened. If the log grew after the
        checkpoint (a crash), a ``rewind`` record is appended and the log replayed again: what was
        put after the checkpoint is rolled back, what was handed out, dropped or expired after it is
        back as it was, and rewards filled in after it stay. Nothing happens after a clean stop.
        """
        with self._cond:
            mark = state.get("records")
            self.last_rewind = {"rolled_back": 0, "restored": 0}
            if mark is not None and int(mark) < self._records:
                tail = _read_jsonl(self.path)[int(mark) :]
                added = {r["id"] for r in tail if "_event" not in r}
                undone = {"consumed", "used", "dropped", "expired"}
                touched = {i for r in tail if r.get("_event") in undone for i in r["ids"]} - added
                self._journal([{"_event": "rewind", "to": int(mark)}])
                self._clear()
                self._replay()
                self.last_rewind = {"rolled_back": len(added), "restored": len(touched)}
            self._load_counters(state)
