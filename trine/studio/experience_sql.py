"""A run's SQL buffer as the studio reads it: read-only SQLAlchemy Core queries on its table.

The table is the one :mod:`trine.buffer.sql_schema` documents (:func:`build_table`). Filters, order,
``LIMIT``/``OFFSET`` and ``COUNT(*)`` run in the database, so a page never loads more than its rows;
``batch`` and ``finish_reason`` are read from the ``info`` JSON with SQLAlchemy's JSON operators
(``JSON_EXTRACT`` on SQLite, ``->>`` on PostgreSQL). One engine per (url, table) is opened on first
use and kept; its connections are read-only (SQLite ``PRAGMA query_only``, PostgreSQL
``default_transaction_read_only``), and a SQLite file that does not exist yet is never created.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import visitors

from trine.buffer.sql_schema import build_table, row_to_experience
from trine.buffer.states import EXPIRED, STALE, sql_state, sql_state_clause
from trine.studio.experience_rows import FACET_TASKS, PREVIEW, STATUSES, Filters, NoSource, finite
from trine.types import Experience

_ENGINES: dict[tuple[str, str], tuple[Any, Any]] = {}
_LOCK = threading.Lock()


def _engine(url: str, table: str, identity: Any = None) -> Any:
    """The cached read-only engine of ``url`` (for ``table``); a new one when ``identity`` (a SQLite
    file's device and inode) changed: a run started again over a new database file."""
    with _LOCK:
        cached = _ENGINES.get((url, table))
        if cached is None or cached[0] != identity:
            if cached is not None:
                cached[1].dispose()
            cached = _ENGINES[(url, table)] = (identity, _read_only_engine(url))
    return cached[1]


def _read_only_engine(url: str) -> Any:
    parsed = sa.make_url(url)
    if parsed.get_backend_name() != "sqlite":
        options = {"options": "-c default_transaction_read_only=on", "connect_timeout": 5}
        return sa.create_engine(parsed, pool_pre_ping=True, connect_args=options)
    from trine.studio.runs import readonly_engine

    return readonly_engine(url)  # read-only, and leaves no -wal/-shm files in a finished run's directory


def sql_source(url: str, table: str) -> Any:
    """The run's table as a :class:`SqlSource`, or a :class:`NoSource` saying why it cannot be read
    (database file not there yet, table not created yet, not a database, server down)."""
    parsed = sa.make_url(url)
    where = parsed.render_as_string(hide_password=True)
    identity = None
    if parsed.get_backend_name() == "sqlite":
        path = Path(parsed.database or "")
        if not path.is_file():
            return NoSource(
                "sql", [], f"no experience stored yet: the database {parsed.database} does not exist"
            )
        identity = (path.stat().st_dev, path.stat().st_ino)
    engine = _engine(url, table, identity)
    try:
        with engine.connect() as conn:
            if not sa.inspect(conn).has_table(table):
                return NoSource("sql", [], f"no experience stored yet: table {table!r} is not in {where}")
            present = {c["name"] for c in sa.inspect(conn).get_columns(table)}
    except sa.exc.SQLAlchemyError as err:
        return NoSource("sql", [], f"the buffer database {where} cannot be read: {getattr(err, 'orig', err)}")
    return SqlSource(engine, build_table(sa.MetaData(), table), present)


@dataclass
class SqlSource:
    """Read-only queries on one buffer table (``present``: its columns; an older table may lack some)."""

    engine: Any
    table: Any
    present: set[str]
    source: str = "sql"
    note: str | None = None
    batch: Any = field(init=False)
    finish: Any = field(init=False)

    def __post_init__(self) -> None:
        self.batch = _inline_path(self.table.c.info["batch"].as_integer())
        self.finish = _inline_path(self.table.c.info["finish_reason"].as_string())

    def _col(self, name: str) -> Any:
        return self.table.c[name] if name in self.present else sa.null()

    def _summary_columns(self) -> list[Any]:
        t = self.table
        names = ("seq", "id", "task_id", "group_id", "run_id", "step", "policy_version", "reward")
        names += ("reward_status", "consumed_at", "kind", "prompt_length", "response_length")
        preview = sa.func.substr(t.c.info["response"].as_string(), 1, PREVIEW)
        return [
            *(t.c[n] for n in names),
            self._col("expired_at").label("expired_at"),
            self.batch.label("batch"),
            self.finish.label("finish_reason"),
            preview.label("preview"),
        ]

    def _status(self, status: str) -> Any:
        return sql_state_clause(self.table, status, self._col("expired_at"))

    def _where(self, f: Filters) -> list[Any]:
        t = self.table
        out = [self._status(f.status)] if f.status else []
        for column, value in ((t.c.kind, f.kind), (t.c.task_id, f.task), (self.finish, f.finish_reason)):
            if value is not None:
                out.append(column == value)
        for column, lo, hi in (
            (t.c.reward, f.reward_min, f.reward_max),
            (t.c.policy_version, f.version_min, f.version_max),
            (self.batch, f.step_min, f.step_max),
        ):
            out += [column >= lo] if lo is not None else []
            out += [column <= hi] if hi is not None else []
        return out

    def _order(self, order: str, reverse: bool = False) -> list[Any]:
        """ORDER BY of ``order`` (``reverse``: the same order backwards, ties included)."""
        t = self.table
        desc = order.startswith("-") != reverse
        if order in ("seq", "-seq"):
            return [t.c.seq.desc() if desc else t.c.seq]
        unknown = t.c.reward.is_(None)  # rows without a reward last, on every backend
        return [
            unknown.desc() if reverse else unknown,
            t.c.reward.desc() if desc else t.c.reward,
            t.c.seq.desc() if reverse else t.c.seq,
        ]

    def page(self, f: Filters) -> tuple[int, list[dict[str, Any]]]:
        """(``COUNT(*)`` of the rows matching ``f``, the page ``f`` asks for).

        Two steps, so that neither reads the wide rows it does not return: the page's ``seq`` keys
        (filters, order, LIMIT/OFFSET on the narrow columns, which the ``browse`` index covers), then
        those rows. A page past the middle is taken from the other end in reverse order, so at most
        half of the matching rows are skipped (offset 99,000 of 100,000 skips 950).
        """
        t, where = self.table, self._where(f)
        with self.engine.connect() as conn:
            total = conn.execute(sa.select(sa.func.count()).select_from(t).where(*where)).scalar_one()
            limit = max(0, min(f.limit, total - f.offset))
            reverse = f.offset > total // 2
            offset = total - f.offset - limit if reverse else f.offset
            keys = sa.select(t.c.seq).where(*where).order_by(*self._order(f.order, reverse))
            seqs = conn.execute(keys.limit(limit).offset(offset)).scalars().all() if limit else []
            seqs = seqs[::-1] if reverse else seqs
            found = conn.execute(sa.select(*self._summary_columns()).where(t.c.seq.in_(seqs))).fetchall()
        by_seq = {r.seq: r for r in found}
        return total, [_summary(by_seq[s]) for s in seqs if s in by_seq]

    def facets(self) -> dict[str, Any]:
        """Counts by status, kinds, finish reasons, the first tasks, and reward / version / batch ranges.

        Separate queries, each answered from one index on SQLite (``browse``, ``finish``, ``batch``,
        ``task_run``) rather than one scan of the wide rows."""
        t = self.table
        # kind first: no index starts so, and SQLite then reads the covering ``browse`` index
        keys = [t.c.kind, t.c.reward_status, t.c.consumed_at.is_(None).label("open")]
        values = [sa.func.count().label("n")]
        for name, column in (("reward", t.c.reward), ("version", t.c.policy_version)):
            values += [sa.func.min(column).label(f"{name}_lo"), sa.func.max(column).label(f"{name}_hi")]
        grouped = sa.select(*keys, *values).group_by(*keys)
        reasons = sa.select(self.finish).where(self.finish.is_not(None)).distinct()
        tasks = sa.select(t.c.task_id).distinct().order_by(t.c.task_id).limit(FACET_TASKS)
        expired = sa.select(sa.func.count()).select_from(t).where(self._status("expired"))
        with self.engine.connect() as conn:
            out = _facets(conn.execute(grouped).fetchall(), conn.execute(expired).scalar_one())
            out["finish_reasons"] = sorted(conn.execute(reasons).scalars().all())
            out["tasks"] = list(conn.execute(tasks).scalars().all())
            lo = conn.execute(sa.select(sa.func.min(self.batch))).scalar()  # one min / max per query:
            hi = conn.execute(sa.select(sa.func.max(self.batch))).scalar()  # each is an index lookup
        out["batch"] = None if lo is None else [lo, hi]
        return out

    def _rows(self, *where: Any, order: list[Any], limit: int = 500) -> list[tuple[Experience, str, int]]:
        columns = [c for c in self.table.columns if c.name in self.present]
        query = sa.select(*columns).where(*where).order_by(*order).limit(limit)
        with self.engine.connect() as conn:
            rows = conn.execute(query).fetchall()
        out = []
        for row in rows:
            m = row._mapping
            status = sql_state(m["reward_status"], m["consumed_at"], m.get("expired_at"), m["reward"])
            out.append((row_to_experience(row), status, m["seq"]))
        return out

    def one(self, exp_id: str) -> tuple[Experience, str, int] | None:
        """(experience, status, seq) of ``exp_id``, or None."""
        found = self._rows(self.table.c.id == exp_id, order=[self.table.c.seq], limit=1)
        return found[0] if found else None

    def group(self, e: Experience, limit: int = 500) -> list[tuple[Experience, str, int]]:
        """The rows sharing ``e``'s group id (``e`` itself alone when it has none)."""
        t = self.table
        same = t.c.group_id == e.group_id if e.group_id else t.c.id == e.id
        return self._rows(same, order=[t.c.seq], limit=limit)

    def steps(self, e: Experience, limit: int = 500) -> list[tuple[Experience, str, int]]:
        """The rows of ``e``'s multi-step rollout (same task and run id: the task/run index), by step."""
        t = self.table
        if not e.run_id:
            return self._rows(t.c.id == e.id, order=[t.c.seq], limit=1)
        same = sa.and_(t.c.task_id == e.task_id, t.c.run_id == e.run_id)
        return self._rows(same, order=[t.c.step, t.c.seq], limit=limit)


def _inline_path(expr: Any) -> Any:
    """``expr`` (a JSON field of ``info``) with its path written into the SQL instead of bound: SQLite
    uses an index on an expression only for the very same expression, and the indexes ``batch`` and
    ``finish`` of :func:`~trine.buffer.sql_schema.build_table` hold the path as a literal."""

    def inline(bind: Any) -> None:
        bind.literal_execute = True

    return visitors.cloned_traverse(expr, {}, {"bindparam": inline})


def _summary(r: Any) -> dict[str, Any]:
    return {
        "id": r.id,
        "seq": r.seq,
        "task_id": r.task_id,
        "group_id": r.group_id,
        "run_id": r.run_id,
        "step": r.step,
        "batch": r.batch,
        "policy_version": r.policy_version,
        "reward": finite(r.reward),
        "status": sql_state(r.reward_status, r.consumed_at, r.expired_at, r.reward),
        "kind": r.kind,
        "finish_reason": r.finish_reason,
        "prompt_length": r.prompt_length,
        "response_length": r.response_length,
        "preview": r.preview or "",
    }


def _facets(groups: list[Any], expired: int) -> dict[str, Any]:
    """Facets from the (kind, reward_status, not consumed) groups and the count of expired rows."""
    statuses = dict.fromkeys(STATUSES, 0)
    statuses[EXPIRED], statuses[STALE] = expired, -expired  # dropped rows are counted as stale below
    kinds = set()
    spans: dict[str, list[Any]] = {"reward": [], "version": []}
    for g in groups:
        status = sql_state(g.reward_status, None if g.open else 1.0, None)
        statuses[status] = statuses.get(status, 0) + g.n
        kinds.add(g.kind)
        for name in spans:
            spans[name] += [v for v in (getattr(g, f"{name}_lo"), getattr(g, f"{name}_hi")) if v is not None]
    out: dict[str, Any] = {"statuses": statuses, "kinds": sorted(kinds)}
    out.update({name: [min(v), max(v)] if v else None for name, v in spans.items()})
    return out
