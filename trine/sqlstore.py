"""What every SQL store of Trine shares (the buffer's table, the annotation queue): URLs, engines that
several processes can share, and which errors are worth a retry.

SQLite files are opened in WAL mode with a busy timeout, every transaction begins explicitly, and the
*write* engine begins ``IMMEDIATE`` (it takes the write lock at once, so a read-then-write transaction is
atomic); PostgreSQL engines ping their pooled connections. A base module: imports SQLAlchemy only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

RETRY_MESSAGES = ("database is locked", "database is busy", "deadlock detected", "could not serialize")
"""Error texts of transient conflicts between processes: the transaction may simply be run again."""


def is_retryable(err: BaseException) -> bool:
    """Whether ``err`` is a transient lock / deadlock / serialization conflict."""
    text = str(err).lower()
    return any(m in text for m in RETRY_MESSAGES)


def normalize_url(url: str | os.PathLike[str]) -> str:
    """A SQLAlchemy URL; a plain file path (no ``://``) means a SQLite file there."""
    text = os.fspath(url)
    return text if "://" in text else f"sqlite:///{Path(text).expanduser().resolve()}"


def open_engines(url: str, busy_timeout: float, owner: str, example: str) -> tuple[Any, Any]:
    """``(engine, write_engine)`` for ``url``, shareable between processes (see the module doc). An
    in-memory SQLite database is refused (``owner`` and ``example`` name the store and a file URL in the
    message); a SQLite file's directory is created."""
    import sqlalchemy as sa

    parsed = sa.make_url(url)
    if parsed.get_backend_name() != "sqlite":
        engine = sa.create_engine(parsed, pool_pre_ping=True)
        return engine, engine
    if parsed.database in (None, "", ":memory:") or parsed.database.startswith("file::memory"):
        raise ValueError(
            f"{owner} url={url!r}: an in-memory SQLite database cannot be shared; give a file, e.g. {example}."
        )
    Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(parsed, connect_args={"timeout": busy_timeout})
    configure_sqlite(engine, busy_timeout)
    return engine, engine.execution_options(sqlite_begin="IMMEDIATE")


def configure_sqlite(engine: Any, busy_timeout: float) -> None:
    """WAL mode and busy timeout on every connection; explicit BEGIN (IMMEDIATE for writes)."""
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # let SQLAlchemy's "begin" event emit BEGIN itself
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql(f"BEGIN {conn.get_execution_options().get('sqlite_begin', 'DEFERRED')}")
