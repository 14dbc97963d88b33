"""What ``trine serve`` keeps on disk so that a restart loses no session: one SQLite file per server,
``<run_dir>/servers/<i>/sessions.db`` (:meth:`SessionStore.persist <trine.serve.sessions.SessionStore.persist>`).

Experiences go to the run's buffer as before; the journal holds what the buffer does not yet: each
session's state (:func:`~trine.serve.records.session_state`: its open trajectory token for token, its
history, what it wrote) saved before each answer goes out, and which session each response belongs to
(feedback names a response). After a crash (``kill -9``) the next server on the run directory restores
the open sessions and continues them; committed and expired ones are read back when a call names them.

=================  ==============  =====================================================================
table / column     type            meaning
=================  ==============  =====================================================================
sessions
  session_id       text (pk)       the client's ``session_id``
  state            JSON            :func:`~trine.serve.records.session_state`
  open             boolean         ``state == "open"`` (restored at start)
  updated_at       float           unix time of the last save
responses
  response_id      text (pk)       a response of a session
  session_id       text            its session
=================  ==============  =====================================================================

The file is local to one server (its sessions live there); it is opened through
:mod:`trine.sqlstore` (WAL mode), so a transaction that committed survives ``kill -9``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any


class SessionJournal:
    """Sessions and their responses in a SQLite file (see the module docstring). Thread-safe: the store
    calls it from worker threads (:func:`trine.blocking.run_blocking`)."""

    def __init__(self, path: str | Path) -> None:
        import sqlalchemy as sa

        from trine.sqlstore import open_engines

        self.path = Path(path)
        self._read, self._write = open_engines(
            f"sqlite:///{self.path}", 30.0, "SessionJournal", "'sqlite:///runs/x/servers/0/sessions.db'"
        )
        meta = sa.MetaData()
        self._sessions = sa.Table(
            "sessions",
            meta,
            sa.Column("session_id", sa.String(), primary_key=True),
            sa.Column("state", sa.JSON(), nullable=False),
            sa.Column("open", sa.Boolean(), nullable=False),
            sa.Column("updated_at", sa.Float(), nullable=False),
            sa.Index("ix_sessions_open", "open"),
        )
        self._responses = sa.Table(
            "responses",
            meta,
            sa.Column("response_id", sa.String(), primary_key=True),
            sa.Column("session_id", sa.String(), nullable=False),
        )
        try:
            meta.create_all(self._write)
        except sa.exc.DatabaseError as err:
            self._read.dispose()
            raise RuntimeError(
                f"{self.path} is not a session journal trine serve can open ({err.orig}); move it away to "
                "start without the sessions it saved."
            ) from None
        self._lock = threading.Lock()

    def save(self, state: dict[str, Any]) -> None:
        """Replace the session's row with ``state`` and note its responses, in one transaction."""
        import sqlalchemy as sa

        sid = state["session_id"]
        s, r = self._sessions, self._responses
        row = {"session_id": sid, "state": state, "open": state["state"] == "open", "updated_at": time.time()}
        with self._lock, self._write.begin() as conn:
            conn.execute(sa.delete(s).where(s.c.session_id == sid))
            conn.execute(sa.insert(s).values(**row))
            ids = state["response_ids"]
            if ids:
                known = set(
                    conn.execute(sa.select(r.c.response_id).where(r.c.response_id.in_(ids))).scalars()
                )
                new = [{"response_id": i, "session_id": sid} for i in ids if i not in known]
                if new:
                    conn.execute(sa.insert(r), new)

    def load(self, session_id: str) -> dict[str, Any] | None:
        """The saved state of ``session_id`` (None: never saved)."""
        import sqlalchemy as sa

        s = self._sessions
        with self._lock, self._read.connect() as conn:
            return conn.execute(sa.select(s.c.state).where(s.c.session_id == session_id)).scalar()

    def open_sessions(self) -> list[dict[str, Any]]:
        """The saved states of the sessions that were open, oldest save first."""
        import sqlalchemy as sa

        s = self._sessions
        with self._lock, self._read.connect() as conn:
            query = sa.select(s.c.state).where(s.c.open.is_(True)).order_by(s.c.updated_at)
            return list(conn.execute(query).scalars())

    def session_of(self, response_id: str) -> str | None:
        """The session ``response_id`` was an answer of (None: not a session's response)."""
        import sqlalchemy as sa

        r = self._responses
        with self._lock, self._read.connect() as conn:
            return conn.execute(sa.select(r.c.session_id).where(r.c.response_id == response_id)).scalar()

    def close(self) -> None:
        self._read.dispose()


__all__ = ["SessionJournal"]
