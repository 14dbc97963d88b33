"""Reading a run's stored experiences for inspection (``trine buffer ...``), whatever the storage.

Every experience comes back with its status, one of :data:`trine.buffer.states.STATES` (``pending``,
``ready``, ``trained``, ``stale``, ``expired``, ``rolled_back``: the vocabulary ``trine status`` and the
studio show too). SQL storages are
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
from trine.buffer.states import EXPIRED, PENDING, READY, ROLLED_BACK, STALE, STATES, TRAINED
from trine.types import Experience

if TYPE_CHECKING:
    from trine.config import BufferConfig

STATUSES = STATES
"""The statuses rows come back with (:mod:`trine.buffer.states`)."""


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


def memory_buffer_note(run_dir: str | Path, kept: int, has_checkpoint: bool) -> str:
    """What can be shown of a run whose buffer lived in memory (``kept``: the untrained experiences its
    last checkpoint holds), and how to keep every experience."""
    if not has_checkpoint:
        shown = "it has no checkpoint yet (a checkpoint keeps the experiences not trained yet), so none can be shown"
    elif kept == 0:
        shown = "its last checkpoint holds no experience that was not trained yet, so none can be shown"
    else:
        shown = f"only the {kept} not yet trained at its last checkpoint can be shown"
    return (
        f"note: {run_dir} kept its buffer in memory (buffer.storage: memory, the default), so the "
        f"experiences it trained on were never stored; {shown}. To keep every experience, run with "
        "buffer.storage: sql (or file); explorer.dump_rollouts: true also writes each sampled response "
        "and reward to rollouts.jsonl."
    )


def key_states(
    run_dir: str | Path, keys: list[Any], stage: str | None = None
) -> dict[Any, list[tuple[str, str]]]:
    """``(id, state)`` of the rows each key names: an experience id, or a ``(task_id, run_id)`` pair
    (every step of that rollout), as ``Buffer.set_rewards`` takes them; ``[]`` for a key that names
    none. A SQL table is asked for those rows' narrow columns only."""
    config = run_buffer_config(run_dir, stage)
    if issubclass(storage_class(config), SQLBuffer):
        buffer = open_buffer(config, run_dir)  # connects only when used: this takes its url and table
        buffer.close()
        found = _sql_key_rows(buffer.url, buffer.table_name, keys)
    else:
        found = [((e.id, e.task_id, e.run_id), s) for e, s in read_rows(run_dir, stage=stage) or []]
    by_id: dict[str, list[tuple[str, str]]] = {}
    by_pair: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for (exp_id, task_id, run_id), state in found:
        by_id.setdefault(exp_id, []).append((exp_id, state))
        by_pair.setdefault((task_id, run_id), []).append((exp_id, state))
    return {k: by_id.get(k, []) if isinstance(k, str) else by_pair.get(tuple(k), []) for k in keys}


def _sql_key_rows(url: str, table_name: str, keys: list[Any]) -> list[tuple[tuple[str, str, str], str]]:
    import sqlalchemy as sa

    from trine.buffer.sql_schema import build_table
    from trine.buffer.states import sql_state

    ids = [k for k in keys if isinstance(k, str)]
    tasks = sorted({str(k[0]) for k in keys if not isinstance(k, str)})
    engine = sa.create_engine(url)
    out: dict[str, tuple[tuple[str, str, str], str]] = {}  # by id: a row may match an id and a pair
    try:
        if not sa.inspect(engine).has_table(table_name):
            return []
        t = build_table(sa.MetaData(), table_name)
        columns = (
            t.c.id,
            t.c.task_id,
            t.c.run_id,
            t.c.reward_status,
            t.c.consumed_at,
            t.c.expired_at,
            t.c.reward,
        )
        with engine.connect() as conn:
            for column, values in ((t.c.id, ids), (t.c.task_id, tasks)):
                for i in range(0, len(values), 500):
                    for r in conn.execute(sa.select(*columns).where(column.in_(values[i : i + 500]))):
                        state = sql_state(r.reward_status, r.consumed_at, r.expired_at, r.reward)
                        out[r.id] = ((r.id, r.task_id, r.run_id), state)
    finally:
        engine.dispose()
    return list(out.values())


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
    from trine.buffer.states import sql_state, sql_state_clause

    engine = sa.create_engine(url)
    try:
        if not sa.inspect(engine).has_table(table_name):
            return []
        table = build_table(sa.MetaData(), table_name)
        query = sa.select(table).order_by(table.c.seq)
        if status is not None:
            query = query.where(sql_state_clause(table, status))
        with engine.connect() as conn:
            rows = conn.execute(query).fetchall()
    finally:
        engine.dispose()
    return [
        (row_to_experience(row), sql_state(row.reward_status, row.consumed_at, row.expired_at, row.reward))
        for row in rows
    ]


def _file_rows(path: Path) -> list[tuple[Experience, str]]:
    from trine.buffer.files import _read_jsonl, resolve_rewinds

    if not path.is_file():
        return []
    records = _read_jsonl(path)
    exps = {r["id"]: Experience.from_dict(r) for r in records if "_event" not in r}
    status = dict.fromkeys(exps, ROLLED_BACK)  # unless in effect (see trine.buffer.files)
    for record in resolve_rewinds(records):
        event = record.get("_event")
        if event is None:
            status[record["id"]] = PENDING if record.get("reward") is None else READY
        elif event == "reward" and status.get(record["id"], ROLLED_BACK) != ROLLED_BACK:
            exps[record["id"]].reward = float(record["reward"])
            status[record["id"]] = READY
        elif event in ("consumed", "dropped"):
            for i in record["ids"]:
                status[i] = TRAINED if event == "consumed" else STALE
        elif event == "expired":  # a pending reward that timed out: dropped, or given the default
            for i in record.get("ids", [record.get("id")]):
                if i in exps:
                    reward = record.get("reward")
                    exps[i].reward = reward if reward is not None else exps[i].reward
                    status[i] = READY if reward is not None else EXPIRED
    return [(e, status[i]) for i, e in exps.items()]


def rows_from_state(state: dict[str, Any]) -> list[tuple[Experience, str]]:
    """The experiences a checkpointed :class:`~trine.buffer.memory.MemoryBuffer` state holds."""
    rows = [(Experience.from_dict(d), READY) for d in state.get("ready", [])]
    return rows + [(Experience.from_dict(d), PENDING) for d in state.get("pending", [])]


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
