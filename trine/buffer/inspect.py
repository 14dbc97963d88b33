"""Reading a run's stored experiences for inspection (``trine buffer ...``), whatever the storage.

Every experience comes back with its status: ``pending`` (reward not known yet), ``ready``
(trainable, not taken), ``consumed`` (handed to the trainer), ``dropped`` (stale) or ``rolled_back``
(put after the checkpoint a crashed run resumed from; the resumed run explored it again). SQL storages are
read through their documented table (:mod:`trine.buffer.sql_schema`), file storages by replaying their
log, and in-memory buffers from the run's last checkpoint (which holds what was not trained yet).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from trine.types import Experience

STATUSES = ("pending", "ready", "consumed", "dropped", "rolled_back")


def run_buffer_config(run_dir: str | Path) -> dict[str, Any]:
    """The ``buffer`` section of a run's resolved ``config.yaml`` (first stage when there are several)."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; pass a run directory written by `trine run`.")
    data = yaml.safe_load(path.read_text()) or {}
    stages = data.get("stages") or [data]
    return dict(stages[0].get("buffer") or {})


def open_run_buffer(run_dir: str | Path) -> Any:
    """The run's persistent buffer object (SQL or file storage), for writing rewards or importing."""
    from trine.buffer.files import FileBuffer
    from trine.buffer.sql import SQLBuffer

    cfg, run_dir = run_buffer_config(run_dir), Path(run_dir)
    storage = cfg.get("storage", "memory")
    if storage in ("sql", "sqlite"):
        return SQLBuffer(cfg.get("url") or f"sqlite:///{run_dir / 'buffer.db'}")
    if storage == "file":
        return FileBuffer(run_dir / "buffer.jsonl")
    raise ValueError(
        f"the run in {run_dir} keeps its buffer in memory (buffer.storage={storage!r}); rewards and imports "
        "need a persistent storage: set buffer.storage: sql (or file) in the config."
    )


def read_rows(run_dir: str | Path, status: str | None = None) -> list[tuple[Experience, str]] | None:
    """Every stored experience of a run (or those with ``status``) with its status, oldest first
    (None for an in-memory buffer, which only its checkpoints keep: see :func:`rows_from_state`)."""
    cfg, run_dir = run_buffer_config(run_dir), Path(run_dir)
    storage = cfg.get("storage", "memory")
    if storage in ("sql", "sqlite"):
        return _sql_rows(cfg.get("url") or f"sqlite:///{run_dir / 'buffer.db'}", status)
    if storage == "file":
        return [r for r in _file_rows(run_dir / "buffer.jsonl") if status is None or r[1] == status]
    return None


def _sql_rows(url: str, status: str | None = None) -> list[tuple[Experience, str]]:
    import sqlalchemy as sa

    from trine.buffer.sql import SQLBuffer, normalize_url
    from trine.buffer.sql_schema import build_table, row_to_experience

    SQLBuffer(url).close()  # opening it brings an older table's columns up to date
    engine = sa.create_engine(normalize_url(url))
    try:
        if not sa.inspect(engine).has_table("experiences"):
            return []
        table = build_table(sa.MetaData(), "experiences")
        query = sa.select(table).order_by(table.c.seq)
        if status == "consumed":
            query = query.where(table.c.consumed_at.is_not(None), table.c.reward_status != "dropped")
        elif status is not None:
            query = query.where(table.c.reward_status == status)
            query = query.where(table.c.consumed_at.is_(None)) if status != "dropped" else query
        with engine.connect() as conn:
            rows = conn.execute(query).fetchall()
    finally:
        engine.dispose()
    out = []
    for row in rows:
        status = (
            row.reward_status if row.consumed_at is None or row.reward_status == "dropped" else "consumed"
        )
        out.append((row_to_experience(row), status))
    return out


def _file_rows(path: Path) -> list[tuple[Experience, str]]:
    from trine.buffer.files import _read_jsonl, resolve_rewinds

    if not path.is_file():
        return []
    records = _read_jsonl(path)
    exps = {r["id"]: Experience.from_dict(r) for r in records if "_event" not in r}
    status = dict.fromkeys(exps, "rolled_back")  # unless in effect (see trine.buffer.files)
    for record in resolve_rewinds(records):
        event = record.get("_event")
        if event is None:
            status[record["id"]] = "pending" if record.get("reward") is None else "ready"
        elif event == "reward" and status.get(record["id"], "rolled_back") != "rolled_back":
            exps[record["id"]].reward = float(record["reward"])
            status[record["id"]] = "ready"
        elif event in ("consumed", "dropped"):
            for i in record["ids"]:
                status[i] = event
        elif event == "expired":  # a pending reward that timed out: dropped, or given the default
            for i in record.get("ids", [record.get("id")]):
                if i in exps:
                    reward = record.get("reward")
                    exps[i].reward = reward if reward is not None else exps[i].reward
                    status[i] = "ready" if reward is not None else "dropped"
    return [(e, status[i]) for i, e in exps.items()]


def rows_from_state(state: dict[str, Any]) -> list[tuple[Experience, str]]:
    """The experiences a checkpointed :class:`~trine.buffer.memory.MemoryBuffer` state holds."""
    rows = [(Experience.from_dict(d), "ready") for d in state.get("ready", [])]
    return rows + [(Experience.from_dict(d), "pending") for d in state.get("pending", [])]


def reward_histogram(rewards: list[float], bins: int = 10, width: int = 40) -> list[str]:
    """Lines of a text histogram: ``[lo, hi)  count  ████``."""
    if not rewards:
        return ["(no rewards)"]
    lo, hi = min(rewards), max(rewards)
    if hi == lo:
        return [f"{lo:>8.3g}          {len(rewards):>6}  " + "█" * width]
    step = (hi - lo) / bins
    counts = [0] * bins
    for r in rewards:
        counts[min(bins - 1, int((r - lo) / step))] += 1
    top = max(counts)
    return [
        f"[{lo + i * step:>7.3g}, {lo + (i + 1) * step:>7.3g})  {c:>6}  " + "█" * round(width * c / top)
        for i, c in enumerate(counts)
    ]
