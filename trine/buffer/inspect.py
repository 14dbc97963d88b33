"""Reading a run's stored experiences for inspection (``trine buffer ...``), whatever the storage.

Every experience comes back with its status: ``pending`` (reward not known yet), ``ready``
(trainable, not taken), ``consumed`` (handed to the trainer), ``dropped`` (stale) or ``rolled_back``
(put after the checkpoint a crashed run resumed from; the resumed run explored it again). SQL storages are
read through their documented table (:mod:`trine.buffer.sql_schema`), file storages by replaying their
log, and in-memory buffers from the run's last checkpoint (which holds what was not trained yet).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from trine.buffer.base import Buffer
from trine.buffer.files import FileBuffer
from trine.buffer.memory import MemoryBuffer
from trine.buffer.open import open_buffer, storage_arguments, storage_class
from trine.buffer.sql import SQLBuffer
from trine.types import Experience

if TYPE_CHECKING:
    from trine.config import BufferConfig

STATUSES = ("pending", "ready", "consumed", "dropped", "rolled_back")


def run_stage_config(run_dir: str | Path, stage: str | None = None) -> dict[str, Any]:
    """One stage of a run's resolved ``config.yaml`` (written by the run): the stage named ``stage``;
    by default the last stage whose buffer is persistent (``buffer.storage`` other than ``memory``),
    else the last stage. A single-stage run's config is that stage."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; pass a run directory written by `trine run`.")
    data = yaml.safe_load(path.read_text()) or {}
    stages = data.get("stages") or [data]
    if stage is not None:
        names = [s.get("stage", "main") for s in stages]
        if stage not in names:
            raise ValueError(f"--stage {stage!r}: the run in {run_dir} has stages {names}; pass one of them.")
        return stages[names.index(stage)]
    persistent = [s for s in stages if (s.get("buffer") or {}).get("storage", "memory") != "memory"]
    return (persistent or stages)[-1]


def run_buffer_config(run_dir: str | Path, stage: str | None = None) -> BufferConfig:
    """The validated ``buffer`` section of one stage of a run (chosen by :func:`run_stage_config`)."""
    from pydantic import ValidationError

    from trine.config import BufferConfig

    section = run_stage_config(run_dir, stage).get("buffer") or {}
    try:  # operators act on the way in, not on opening: their (maybe plugin) names need no check here
        return BufferConfig.model_validate({**section, "operators": []})
    except ValidationError as err:
        raise ValueError(
            f"the buffer section of {Path(run_dir) / 'config.yaml'} is not valid: {err}. If the run loaded "
            "plugins, load them here too: trine buffer --plugin FILE ..."
        ) from None


def _in_memory(config: BufferConfig) -> bool:
    cls = storage_class(config)
    return issubclass(cls, MemoryBuffer) and not issubclass(cls, FileBuffer)


def open_run_buffer(run_dir: str | Path, stage: str | None = None) -> Buffer:
    """The run's persistent buffer, opened exactly as the run opened it (:func:`trine.buffer.open.
    open_buffer` on its resolved config), for writing rewards or importing."""
    config = run_buffer_config(run_dir, stage)
    if _in_memory(config):
        raise ValueError(
            f"the run in {run_dir} keeps its buffer in memory (buffer.storage={config.storage!r}); rewards "
            "and imports need a persistent storage: set buffer.storage: sql (or file) in the config."
        )
    return open_buffer(config, run_dir)


def read_rows(
    run_dir: str | Path, status: str | None = None, stage: str | None = None
) -> list[tuple[Experience, str]] | None:
    """Every stored experience of a run (or those with ``status``) with its status, oldest first
    (None for an in-memory buffer, which only its checkpoints keep: see :func:`rows_from_state`).

    The storage is the run's own (:func:`run_buffer_config`: same database, table and file). A file
    log is read, not opened: opening repairs a torn last line, which a reader must not do to the log
    of a run that is still writing it.
    """
    config = run_buffer_config(run_dir, stage)
    cls = storage_class(config)
    if issubclass(cls, FileBuffer):
        path = Path(storage_arguments(config, run_dir).get("path", "buffer.jsonl"))
        return [r for r in _file_rows(path) if status is None or r[1] == status]
    if issubclass(cls, SQLBuffer):
        buffer = open_buffer(config, run_dir)  # connects only when used: this takes its url and table
        buffer.close()
        return _sql_rows(buffer.url, buffer.table_name, status)
    if issubclass(cls, MemoryBuffer):
        return None
    raise ValueError(
        f"buffer.storage={config.storage!r} ({cls.__name__}) is not a SQL, file or memory storage; "
        "`trine buffer` reads only those (subclasses included)."
    )


def _sql_rows(url: str, table_name: str, status: str | None = None) -> list[tuple[Experience, str]]:
    import sqlalchemy as sa

    from trine.buffer.sql_schema import build_table, row_to_experience

    engine = sa.create_engine(url)
    try:
        if not sa.inspect(engine).has_table(table_name):
            return []
        table = build_table(sa.MetaData(), table_name)
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
