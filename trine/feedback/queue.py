"""The annotation queue: items that people answer, in a SQL database shared by processes.

A workflow (or ``trine annotate``) *posts* items in batches: ``rate`` items (one response, a number in
a scale) and ``pair`` items (two responses, ``a`` | ``b`` | ``tie``). People *claim* a few at a time
(a lease: unanswered claims go back to ``open`` when it runs out) and *answer* them; answers are then
*landed* in the run's buffer (:mod:`trine.feedback.landing`). An item not answered before its
``expires_at`` becomes ``expired`` (counted, never answered).

Guarantees, from any number of threads and processes sharing the database:

- ``post`` inserts a batch in one transaction (all items or none);
- ``claim`` hands an open item to one annotator at a time (SQLite: ``BEGIN IMMEDIATE``, one writer;
  PostgreSQL: ``SELECT ... FOR UPDATE SKIP LOCKED``);
- ``answer`` is all or nothing: every item must be claimed by that annotator, not expired, not answered,
  with an answer valid for its kind, else :class:`AnswerConflict` names every bad item and nothing is
  kept; each UPDATE is conditional on ``status='claimed' AND annotator=me`` and its row count is checked,
  so no item is ever answered twice.

Tables: ``annotation_items`` (one row per item; the columns mirror :class:`~trine.feedback.items.Item`,
``responses``, ``meta``, ``answer`` and ``progress`` as JSON text, ``choice`` / ``rating`` copies of the
answer for queries; layout in :func:`trine.feedback.items.build_table`). SQLite files run in WAL mode with a busy timeout; "database is locked" is retried.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from trine.feedback.items import (
    ANSWERED,
    CHOICES,
    CLAIMED,
    DEFAULT_SCALE,
    EXPIRED,
    KINDS,
    OPEN,
    STATUSES,
    AnswerConflict,
    Item,
    build_table,
    check_answer,
    check_item,
    item_row,
    row_item,
)
from trine.sqlstore import is_retryable, normalize_url, open_engines
from trine.types import new_id

ANNOTATIONS_FILE = "annotations.db"
__all__ = [  # the queue's interface (the nouns live in trine.feedback.items)
    "ANNOTATIONS_FILE", "ANSWERED", "CHOICES", "CLAIMED", "DEFAULT_SCALE", "EXPIRED", "KINDS", "OPEN",
    "STATUSES", "AnnotationQueue", "AnswerConflict", "Item", "check_answer", "check_item", "normalize_url",
    "queue_url",
]  # fmt: skip


def queue_url(run_dir: str | os.PathLike[str]) -> str:
    """The queue of a run: ``sqlite:///<run_dir>/annotations.db``."""
    return f"sqlite:///{Path(run_dir).expanduser().resolve() / ANNOTATIONS_FILE}"


class AnnotationQueue:
    """Items in the table ``table`` of the database at ``url`` (created if missing); see the module doc.

    Args:
        url: SQLAlchemy URL (``sqlite:///run/annotations.db``, ``postgresql+psycopg://...``) or a file
            path (SQLite). :func:`queue_url` gives a run's.
        clock: unix time by default (compared across processes; inject a fake one in tests).
        table: table name; several queues may share a database under different names.
        busy_timeout: seconds SQLite waits for the write lock before "database is locked".
    """

    def __init__(
        self,
        url: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
        table: str = "annotation_items",
        busy_timeout: float = 30.0,
    ) -> None:
        if not table.isidentifier():
            raise ValueError(f"AnnotationQueue table={table!r}: expected a plain identifier.")
        self.url = normalize_url(url)
        self.clock = clock
        self.table_name = table
        self.busy_timeout = busy_timeout
        self._init_process_state()
        self._engines()  # create the table now: errors show where the queue is opened

    # -- connections ------------------------------------------------------------------------------

    def _init_process_state(self) -> None:
        self._pid = os.getpid()
        self._engine: Any = None
        self._write: Any = None
        self._lock = threading.Lock()
        self.t = build_table(sa.MetaData(), self.table_name)

    def __getstate__(self) -> dict[str, Any]:
        return {
            k: v for k, v in self.__dict__.items() if k not in ("_engine", "_write", "_lock", "t", "_pid")
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_process_state()

    def _engines(self) -> tuple[Any, Any]:
        if self._pid != os.getpid():  # forked: open our own connections
            self._init_process_state()
        if self._engine is None:
            with self._lock:
                if self._engine is None:
                    self._open()
        return self._engine, self._write

    def _open(self) -> None:
        url = sa.make_url(self.url)
        engine, write = open_engines(self.url, self.busy_timeout, "AnnotationQueue", "queue_url(run_dir)")
        try:
            _retry(lambda: self.t.metadata.create_all(write), creating=True)
        except sa.exc.OperationalError as err:
            engine.dispose()
            raise ConnectionError(
                f"AnnotationQueue could not open {url.render_as_string(hide_password=True)!r}: {err.orig}; "
                "start the database server or fix the url."
            ) from err
        self._engine, self._write = engine, write

    def _in_write(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(conn)`` in one write transaction, retried on lock errors."""
        _, write = self._engines()

        def run() -> Any:
            with write.begin() as conn:
                return fn(conn)

        return _retry(run)

    def _in_read(self, fn: Callable[[Any], Any]) -> Any:
        read, _ = self._engines()

        def run() -> Any:
            with read.connect() as conn:
                return fn(conn)

        return _retry(run)

    # -- posting, claiming, answering -------------------------------------------------------------

    def post(self, items: list[Item], timeout: float | None = None) -> str:
        """Insert ``items`` as one batch in one transaction (all or none); returns the batch id.

        ``timeout``: seconds until unanswered items expire (None: never).
        """
        batch = new_id("batch-")
        now = self.clock()
        for item in items:
            check_item(item)
        rows = []
        for item in items:
            item.batch, item.status, item.created_at = batch, OPEN, now
            item.expires_at = None if timeout is None else now + float(timeout)
            item.annotator = item.answer = item.claimed_until = item.answered_at = item.landed_at = None
            rows.append(item_row(item))
        try:
            self._in_write(lambda conn: conn.execute(sa.insert(self.t), rows) if rows else None)
        except sa.exc.IntegrityError as err:
            raise ValueError(
                f"post: an item id in {[i.id for i in items][:5]} is already in the queue ({err.orig}); "
                "nothing was posted; give each Item a fresh id."
            ) from err
        return batch

    def claim(self, annotator: str, n: int, lease: float = 600.0) -> list[Item]:
        """Up to ``n`` items for ``annotator``: its own unexpired claims first, then the oldest open
        items; each is held for ``lease`` seconds (claims past their lease go back to open)."""
        if n <= 0:
            return []
        t = self.t

        def take(conn: Any) -> list[Item]:
            now = self.clock()
            _release_and_expire(conn, t, now)
            mine = sa.select(t.c.id).where(t.c.status == CLAIMED, t.c.annotator == annotator)
            ids = [
                r.id for r in conn.execute(mine.order_by(t.c.seq).limit(n).with_for_update(skip_locked=True))
            ]
            if len(ids) < n:
                free = sa.select(t.c.id).where(t.c.status == OPEN).order_by(t.c.seq).limit(n - len(ids))
                ids += [r.id for r in conn.execute(free.with_for_update(skip_locked=True))]
            if not ids:
                return []
            mine_or_open = (t.c.status == OPEN) | ((t.c.status == CLAIMED) & (t.c.annotator == annotator))
            conn.execute(
                sa.update(t)
                .where(t.c.id.in_(ids), mine_or_open)
                .values(status=CLAIMED, annotator=annotator, claimed_until=now + lease)
            )
            rows = conn.execute(
                sa.select(t).where(t.c.id.in_(ids), t.c.annotator == annotator).order_by(t.c.seq)
            )
            return [row_item(r) for r in rows]

        return self._in_write(take)

    def claim_items(self, annotator: str, ids: list[str], lease: float = 600.0) -> list[Item]:
        """Claim these items for ``annotator`` (an import answering known items): those open or already
        its own; the others (answered, expired, claimed by someone else, unknown) are left out."""
        if not ids:
            return []
        t = self.t

        def take(conn: Any) -> list[Item]:
            now = self.clock()
            _release_and_expire(conn, t, now)
            mine_or_open = (t.c.status == OPEN) | ((t.c.status == CLAIMED) & (t.c.annotator == annotator))
            stmt = sa.update(t).where(t.c.id.in_(list(ids)), mine_or_open)
            conn.execute(stmt.values(status=CLAIMED, annotator=annotator, claimed_until=now + lease))
            query = sa.select(t).where(
                t.c.id.in_(list(ids)), t.c.status == CLAIMED, t.c.annotator == annotator
            )
            return [row_item(r) for r in conn.execute(query.order_by(t.c.seq))]

        return self._in_write(take)

    def answer(self, annotator: str, answers: dict[str, dict[str, Any]]) -> list[Item]:
        """Keep ``answers`` ({item id: {"choice": ...} | {"rating": ...}}) all or nothing.

        Raises :class:`AnswerConflict` naming every item that is unknown, not claimed by ``annotator``,
        expired, already answered, or whose answer is not valid for its kind; then nothing is kept.
        A claim past its lease can still be answered as long as nobody else has claimed the item since.
        """
        t = self.t

        def keep(conn: Any) -> list[Item]:
            now = self.clock()
            rows = {r.id: r for r in conn.execute(sa.select(t).where(t.c.id.in_(list(answers))))}
            why: dict[str, str] = {}
            clean: dict[str, dict[str, Any]] = {}
            for item_id, given in answers.items():
                row = rows.get(item_id)
                problem = _answer_problem(row, annotator, now)
                if problem is None:
                    clean[item_id], problem = check_answer(row_item(row), given)
                if problem is not None:
                    why[item_id] = problem
            if why:
                raise AnswerConflict(why)
            for item_id, value in clean.items():
                done = conn.execute(
                    sa.update(t)
                    .where(t.c.id == item_id, t.c.status == CLAIMED, t.c.annotator == annotator)
                    .values(
                        status=ANSWERED,
                        answer=json.dumps(value),
                        choice=value.get("choice"),
                        rating=value.get("rating"),
                        answered_at=now,
                        claimed_until=None,
                    )
                ).rowcount
                if done != 1:  # someone else got there between the read and this update
                    raise AnswerConflict({item_id: "it was answered or reclaimed meanwhile"})
            got = conn.execute(sa.select(t).where(t.c.id.in_(list(clean))).order_by(t.c.seq))
            return [row_item(r) for r in got]

        if not answers:
            return []
        return self._in_write(keep)

    def expire(self) -> int:
        """Open or claimed items past their ``expires_at`` become ``expired``; returns how many now."""
        return self._in_write(lambda conn: _release_and_expire(conn, self.t, self.clock()))

    # -- landing ----------------------------------------------------------------------------------

    def unlanded(self) -> list[Item]:
        """Answered items not landed yet, oldest first."""
        t = self.t
        query = sa.select(t).where(t.c.status == ANSWERED, t.c.landed_at.is_(None)).order_by(t.c.seq)
        return self._in_read(lambda conn: [row_item(r) for r in conn.execute(query)])

    def mark_landed(self, ids: list[str], note: str | None = None) -> None:
        """Mark answered items landed (``note``: why without effect: "tie", "lost", ...); already
        landed ones keep their first landing."""
        if not ids:
            return
        t = self.t
        stmt = sa.update(t).where(t.c.id.in_(list(ids)), t.c.status == ANSWERED, t.c.landed_at.is_(None))
        self._in_write(lambda conn: conn.execute(stmt.values(landed_at=self.clock(), note=note)))

    def set_progress(self, item_id: str, progress: dict[str, Any]) -> None:
        """Record what landing has done so far for an item (so a retry does not do it twice)."""
        stmt = sa.update(self.t).where(self.t.c.id == item_id).values(progress=json.dumps(progress))
        self._in_write(lambda conn: conn.execute(stmt))

    # -- reading ----------------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Items by state now: open (claims past their lease included), claimed, answered (landed
        ones too), expired (past ``expires_at`` too), landed (with effect), ties, lost."""
        t, now = self.t, self.clock()
        state = _effective_status(t, now)

        def count(conn: Any) -> dict[str, int]:
            out = dict.fromkeys(STATUSES, 0)
            for status, n in conn.execute(sa.select(state, sa.func.count()).group_by(state)):
                out[status] = int(n)
            landed = sa.select(sa.func.count()).where(t.c.landed_at.is_not(None), t.c.note.is_(None))
            out["landed"] = int(conn.execute(landed).scalar())
            ties = sa.select(sa.func.count()).where(t.c.status == ANSWERED, t.c.choice == "tie")
            out["ties"] = int(conn.execute(ties).scalar())
            out["lost"] = int(conn.execute(sa.select(sa.func.count()).where(t.c.note == "lost")).scalar())
            return out

        return self._in_read(count)

    def items(
        self,
        status: str | None = None,
        limit: int = 100,
        *,
        newest_first: bool = False,
        ids: list[str] | None = None,
    ) -> list[Item]:
        """Up to ``limit`` items (with ``status``; among ``ids``), oldest first unless ``newest_first``."""
        if status is not None and status not in STATUSES:
            raise ValueError(f"status={status!r}; expected one of {STATUSES} or None.")
        t = self.t
        query = sa.select(t).order_by(t.c.seq.desc() if newest_first else t.c.seq).limit(limit)
        if status is not None:
            query = query.where(_effective_status(t, self.clock()) == status)
        if ids is not None:
            query = query.where(t.c.id.in_(list(ids)))
        return self._in_read(lambda conn: [row_item(r) for r in conn.execute(query)])

    def batches(self) -> list[dict[str, Any]]:
        """One dict per posted batch, oldest first: batch, created, items, open, claimed, answered, expired."""
        t = self.t
        state = _effective_status(t, self.clock())

        def per(status: str) -> Any:
            return sa.func.sum(sa.case((state == status, 1), else_=0))

        query = (
            sa.select(t.c.batch, sa.func.min(t.c.created_at), sa.func.count(), *(per(s) for s in STATUSES))
            .group_by(t.c.batch)
            .order_by(sa.func.min(t.c.seq))
        )

        def read(conn: Any) -> list[dict[str, Any]]:
            out = []
            for batch, created, n, *by in conn.execute(query):
                row = {"batch": batch, "created": created, "items": int(n)}
                out.append(row | {s: int(v or 0) for s, v in zip(STATUSES, by, strict=True)})
            return out

        return self._in_read(read)

    def experience_ids(self, kind: str | None = None) -> set[str]:
        """Every experience id some posted item (of ``kind``) refers to (so nothing is posted twice)."""
        query = sa.select(self.t.c.responses)
        if kind is not None:
            query = query.where(self.t.c.kind == kind)
        rows = self._in_read(lambda conn: conn.execute(query).all())
        return {r["experience_id"] for (text,) in rows for r in json.loads(text) if r.get("experience_id")}

    def close(self) -> None:
        """Release this process's connections."""
        if self._engine is not None and self._pid == os.getpid():
            self._engine.dispose()
            self._engine = self._write = None

    def __repr__(self) -> str:
        return f"AnnotationQueue({sa.make_url(self.url).render_as_string(hide_password=True)!r})"


def _answer_problem(row: Any, annotator: str, now: float) -> str | None:
    """Why ``annotator`` may not answer the item in ``row`` now (None: it may)."""
    if row is None:
        return "no such item in the queue"
    if row.status == ANSWERED:
        return f"already answered by {row.annotator}"
    if row.status == EXPIRED or (row.expires_at is not None and row.expires_at < now):
        return "expired (its timeout passed); claim new items"
    if row.status != CLAIMED or row.annotator != annotator:
        holder = f"claimed by {row.annotator}" if row.status == CLAIMED else row.status
        return f"not claimed by {annotator} ({holder}); claim it first"
    return None


def _effective_status(t: sa.Table, now: float) -> Any:
    """The status a row has at ``now``: past expires_at -> expired, claim past its lease -> open."""
    live = t.c.status.in_((OPEN, CLAIMED))
    return sa.case(
        (live & (t.c.expires_at < now), EXPIRED),
        ((t.c.status == CLAIMED) & (t.c.claimed_until < now), OPEN),
        else_=t.c.status,
    )


def _release_and_expire(conn: Any, t: sa.Table, now: float) -> int:
    """In ``conn``'s transaction: expire items past ``expires_at`` (returns how many), reopen stale claims."""
    live = t.c.status.in_((OPEN, CLAIMED))
    expired = conn.execute(
        sa.update(t).where(live, t.c.expires_at < now).values(status=EXPIRED, claimed_until=None)
    ).rowcount
    stale = (t.c.status == CLAIMED) & (t.c.claimed_until < now)
    conn.execute(sa.update(t).where(stale).values(status=OPEN, annotator=None, claimed_until=None))
    return int(expired)


def _retry(fn: Callable[[], Any], *, attempts: int = 30, creating: bool = False) -> Any:
    """``fn()``, again after transient lock/deadlock errors (and a create-table race)."""
    for attempt in range(attempts):
        try:
            return fn()
        except (sa.exc.OperationalError, sa.exc.ProgrammingError, sa.exc.IntegrityError) as err:
            text = str(err).lower()
            transient = is_retryable(err) or (creating and "exist" in text)
            if (
                attempt == attempts - 1
                or not transient
                or isinstance(err, sa.exc.IntegrityError)
                and not creating
            ):
                raise
            time.sleep(min(0.01 * 2**attempt, 0.5))
    raise AssertionError("unreachable")
