"""Preflight of a SQL buffer's URL (``buffer.storage: sql``): found before the first step, not when a later
stage first puts a batch.

:func:`buffer_problems` takes the URL the run will open (:func:`trine.buffer.open.storage_arguments`:
``buffer.url``, ``buffer.storage_args.url``, or SQLite in the run directory) and checks that it parses as
a SQLAlchemy URL, names a known dialect whose driver is installed, and that the database is there: a
SQLite file must not be in memory and its directory must exist or be creatable (nothing is created
here); any other database is connected to (at most :data:`CONNECT_SECONDS`) and the connection closed.
A URL that passed is not checked again in this process; passwords never appear in a message.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

CONNECT_SECONDS = 10.0
"""How long the check waits for a database server to answer."""
SQL_STORAGES = ("sql", "sqlite")
EXAMPLES = "e.g. sqlite:///runs/x/buffer.db or postgresql+psycopg://user:password@host:5432/db"

_passed: set[str] = set()  # urls that passed (a server is connected to once, a fixed one is seen)


def buffer_problems(cfg: Any) -> list[str]:
    """Problems of ``cfg``'s SQL buffer URL, each naming its key; [] for other storages."""
    buffer = cfg.buffer
    if buffer.storage not in SQL_STORAGES:
        return []
    from trine.buffer.open import storage_arguments

    url = storage_arguments(buffer, cfg.run_path).get("url")
    if not isinstance(url, (str, os.PathLike)):
        return []
    url = os.fspath(url)
    if "url" in buffer.storage_args:
        key = "buffer.storage_args.url"
    elif buffer.url is not None:
        key = "buffer.url"
    else:
        key = "buffer (SQLite in the run directory)"
    if url in _passed:
        return []
    problems = _url_problems(url)
    if not problems:
        _passed.add(url)
    return [f"{key}: {p}" for p in problems]


def _url_problems(text: str) -> list[str]:
    import sqlalchemy as sa

    from trine.sqlstore import normalize_url

    if "\x00" in text:
        return [
            f"{_hidden(text)!r} holds a NUL character, which no database URL or file name may; {EXAMPLES}"
        ]
    try:
        url = sa.make_url(normalize_url(text))
    except (sa.exc.ArgumentError, ValueError) as err:
        return [f"{_hidden(text)!r} is not a database URL ({err}); {EXAMPLES}"]
    shown = url.render_as_string(hide_password=True)
    try:
        dialect = url.get_dialect()
    except sa.exc.NoSuchModuleError:
        return [
            f"{shown!r}: SQLAlchemy knows no database {url.get_backend_name()!r}; use sqlite or postgresql "
            f"({EXAMPLES})"
        ]
    try:
        dialect.import_dbapi()
    except ImportError as err:
        driver = url.get_driver_name()
        return [
            f"{shown!r}: the {driver!r} driver of {url.get_backend_name()} is not installed ({err}); install it, "
            "or for PostgreSQL write postgresql+psycopg://... with pip install 'trine[postgres]'"
        ]
    if url.get_backend_name() == "sqlite":
        return _sqlite_problems(url, shown)
    return _connect_problems(url, shown)


def _sqlite_problems(url: Any, shown: str) -> list[str]:
    database = url.database
    if database in (None, "", ":memory:") or database.startswith("file::memory"):
        return [
            f"{shown!r} is an in-memory SQLite database, which no other process sees; give a file ({EXAMPLES})"
        ]
    directory = Path(database).expanduser().resolve().parent
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return [
            f"{shown!r}: the database's directory {directory} cannot be created ({existing} is a file); fix the path"
        ]
    if not os.access(existing, os.W_OK | os.X_OK):
        made = (
            "is not writable" if existing == directory else f"cannot be created ({existing} is not writable)"
        )
        return [f"{shown!r}: the database's directory {directory} {made}; fix the path or its permissions"]
    return []


def _connect_problems(url: Any, shown: str) -> list[str]:
    """Connect once (in a thread, so that a server that never answers costs at most CONNECT_SECONDS)."""
    import sqlalchemy as sa

    args = {"connect_timeout": int(CONNECT_SECONDS)} if url.get_backend_name() == "postgresql" else {}
    outcome: list[BaseException | None] = []

    def connect() -> None:
        engine = sa.create_engine(url, connect_args=args, poolclass=sa.pool.NullPool)
        try:
            with engine.connect():
                pass
            outcome.append(None)
        except BaseException as err:  # noqa: BLE001 - reported by the caller
            outcome.append(err)
        finally:
            engine.dispose()

    thread = threading.Thread(target=connect, name="trine-preflight-db", daemon=True)
    thread.start()
    thread.join(CONNECT_SECONDS + 1)
    if not outcome:
        return [f"{shown!r}: the database did not answer within {CONNECT_SECONDS:.0f}s; {_fix_server()}"]
    err = outcome[0]
    if err is None:
        return []
    detail = str(getattr(err, "orig", None) or err).strip().splitlines()
    return [f"{shown!r}: cannot connect ({type(err).__name__}: {' '.join(detail)[:300]}); {_fix_server()}"]


def _fix_server() -> str:
    return (
        "start the database server (scripts/postgres.sh starts a local PostgreSQL), fix host, port, user or "
        "password in the URL, or remove buffer.url for SQLite in the run directory"
    )


def _hidden(text: str) -> str:
    """``text`` with the password of a ``scheme://user:password@host`` URL masked."""
    scheme, sep, rest = text.partition("://")
    if not sep or "@" not in rest:
        return text
    credentials, _, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in credentials else text
