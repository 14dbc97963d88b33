"""SQL experience storage through SQLAlchemy 2: a SQLite file by default, PostgreSQL by URL.

The database is the buffer: several explorer (writer) processes and several trainer (reader)
processes may share one database, and every experience is handed out by ``get`` exactly once
(FIFO) or up to ``reuse_limit`` times (priority replay; rules in :mod:`trine.buffer.sampling`, as
SQL in :mod:`trine.buffer.sql_sampling`).
Every ``put`` also records one explored batch in the side table ``<table>_batches`` (same
transaction), and ``get(None)`` takes the oldest one not taken yet, whole, in the transaction that
claims its rows, so two readers never take the same batch.
Rows are queryable with plain SQL; the layout is documented in :mod:`trine.buffer.sql_schema`.

SQLAlchemy (and the PostgreSQL driver) are imported lazily, on first use of a buffer.
"""

from __future__ import annotations

import os
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any, Literal

from trine.buffer import sql_sampling as q
from trine.buffer import sql_tasks as ledger
from trine.buffer.base import BufferTimeout
from trine.buffer.sampling import SamplingRules, batch_metrics
from trine.buffer.sql_rewind import ranges, rewind
from trine.buffer.sql_schema import (
    DROPPED,
    PENDING,
    READY,
    add_missing_columns,
    build_batches_table,
    build_table,
    experience_to_row,
    row_to_experience,
)
from trine.sqlstore import is_retryable, normalize_url, open_engines
from trine.types import Experience

# Engines inherited through fork(): the child never uses them, and keeps them referenced so that
# garbage collection never closes (and so terminates) connections that belong to the parent.
_INHERITED_ENGINES: list[Any] = []


class DuplicateBatch(ValueError):
    """A producer put a batch it had put before (see :meth:`SQLBuffer.put`)."""


class SQLBuffer:
    """Experiences in a SQL table (SQLite in WAL mode, or PostgreSQL), shared between processes.

    Consumption rule (the sampling rules of :mod:`trine.buffer.sampling`, identical to
    :class:`~trine.buffer.memory.MemoryBuffer`'s): a row is *trainable* when its ``reward_status``
    is ``"ready"`` and its ``consumed_at`` is NULL. In one transaction, ``get(n)`` expires pending
    rows past ``pending_timeout``, marks trainable rows below the staleness floor as ``"dropped"``
    (counted in ``buffer/dropped_stale``), then claims the first ``n`` eligible rows (FIFO: lowest
    ``seq``; priority: highest ``priority``, then lowest ``seq``) and counts a use of each
    (``use_count``, ``priority``, ``last_get``; ``consumed_at`` once ``use_count`` reaches
    ``reuse_limit``). On PostgreSQL the claim is ``SELECT ... FOR UPDATE SKIP LOCKED``, so
    concurrent readers take disjoint rows (with the priority sampler or ``whole_groups`` claims
    also take a per-table advisory lock, so get numbers and group gating are exact); on SQLite the
    transaction is ``BEGIN IMMEDIATE`` (one writer at a time, so the claim-and-mark is atomic) and
    "database is locked" is retried. If fewer than ``n`` rows are eligible nothing is claimed:
    ``get`` polls (every ``poll_interval`` seconds, sooner after a ``put`` in this process) until
    ``timeout`` and then raises :class:`BufferTimeout`. Consumed rows stay in the table (for
    queries and export); they are never handed out again.

    Explored batches: each ``put`` (``put([])`` too) inserts one row into ``<table>_batches``
    (``size``, ``created_at``) in the transaction that inserts its rows. ``get(None)`` peeks at the
    oldest batch not taken yet and then behaves exactly as ``get(size)``; the claim transaction
    picks that oldest batch again (PostgreSQL: ``FOR UPDATE SKIP LOCKED``; SQLite: under ``BEGIN
    IMMEDIATE``), claims ``size`` rows and sets the batch's ``taken_at``, so the batch is taken if
    and only if its rows are (an empty batch is taken alone and gives ``[]``). With no batch
    waiting, ``get(None)`` polls until ``timeout``. An integer ``n`` leaves the batches alone.

    Pending rows (``reward=None``) are stored with status ``"pending"`` and become ready through
    :meth:`set_rewards`. Works from threads and from processes (fork or spawn): each process opens
    its own engine lazily on first use. SQLite needs a file (not ``:memory:``) on a local disk.

    Args:
        url: SQLAlchemy URL (``sqlite:///path/buffer.db``, ``postgresql+psycopg://user:pw@host/db``)
            or a plain file path for SQLite.
        table: table name; several buffers may share a database under different names.
        poll_interval: seconds between checks while ``get`` waits.
        busy_timeout: seconds SQLite waits for the write lock before "database is locked".
        rules: the sampling rules (:class:`~trine.buffer.sampling.SamplingRules`), applied exactly
            as :class:`~trine.buffer.memory.MemoryBuffer` applies them (None = FIFO, each once).
        clock: time of puts and of the pending timeout; unix time by default, because
            ``created_at`` is compared across processes (inject a fake one in tests).
        rewind: on ``load_state_dict`` (resuming a run), put the table back as it was at the
            checkpoint (see there). ``"reads"``: undo only what was *taken* since the checkpoint
            (for a trainer process whose explorers are other processes: their rows put since stay).
            False: restore the counters only.
    """

    def __init__(
        self,
        url: str = "sqlite:///buffer.db",
        *,
        table: str = "experiences",
        poll_interval: float = 0.05,
        busy_timeout: float = 30.0,
        rules: SamplingRules | None = None,
        clock: Callable[[], float] = time.time,
        rewind: bool | Literal["reads"] = True,
    ) -> None:
        if not table.isidentifier():
            raise ValueError(f"SQLBuffer table={table!r}: expected a plain identifier such as 'experiences'.")
        self.url = normalize_url(url)
        self.table_name = table
        self.poll_interval = poll_interval
        self.busy_timeout = busy_timeout
        self.rules = SamplingRules() if rules is None else rules
        self.clock = clock
        self.rewind = rewind
        self.last_rewind: dict[str, int] = {}
        """Rows the last ``load_state_dict`` rolled back and restored (see there)."""
        self.consumed = 0
        """Experiences handed out by this object (the database counts for all processes)."""
        self.dropped_stale = 0
        """Stale experiences dropped by this object's ``get`` calls."""
        self.pending_expired = 0
        """Pending experiences expired by this object."""
        self.tasks_retried = 0
        """Ledger tasks this object's ``get`` calls opened again because their rows were dropped as stale."""
        self.tasks_lost = 0
        """Ledger tasks dropped as stale more than ``rules.stale_retries`` times by this object's ``get`` calls."""
        self._stale_tasks: list[int] = []
        self.taken_over = 0
        """Rows this object's puts left out: their task's claim had expired and another explorer took it."""
        self.last_batch: dict[str, float] = {}
        """``buffer/reuse`` and ``buffer/staleness_*`` of the last batch this object handed out."""
        self._closed = False
        self._init_process_state()

    # -- per-process state ------------------------------------------------------------------------

    def _init_process_state(self) -> None:
        self._pid = os.getpid()
        self._engine: Any = None
        self._write_engine: Any = None
        self._table: Any = None
        self._batches: Any = None
        self._tasks: Any = None
        self._lock = threading.Lock()
        self._cond = threading.Condition()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for key in ("_engine", "_write_engine", "_table", "_batches", "_tasks", "_lock", "_cond", "_pid"):
            state.pop(key)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_process_state()

    def _engines(self) -> tuple[Any, Any]:
        """(engine for reads, engine whose transactions take the write lock), created lazily."""
        if self._pid != os.getpid():  # forked: leave the parent's connections alone
            if self._engine is not None:
                _INHERITED_ENGINES.append(self._engine)
            self._init_process_state()
        if self._engine is None:
            with self._lock:
                if self._engine is None:
                    self._open()
        return self._engine, self._write_engine

    def _open(self) -> None:
        import sqlalchemy as sa

        url = sa.make_url(self.url)
        engine, write_engine = open_engines(
            self.url, self.busy_timeout, "SQLBuffer", "'sqlite:///runs/x/buffer.db', or use storage 'memory'"
        )
        table = build_table(sa.MetaData(), self.table_name)
        batches = build_batches_table(table.metadata, self.table_name)  # created for old databases too
        tasks = ledger.build_tasks_table(table.metadata, self.table_name)

        def create() -> None:
            table.metadata.create_all(write_engine)
            with write_engine.begin() as conn:
                add_missing_columns(conn, table)
                # an index added since older tables were made (create_all makes it with a new table only)
                name = self.table_name
                conn.execute(sa.text(f"CREATE INDEX IF NOT EXISTS ix_{name}_run ON {name} (run_id)"))

        try:
            self._retry(create, what="create the table")
        except sa.exc.OperationalError as err:
            engine.dispose()
            raise ConnectionError(
                f"SQLBuffer could not open {url.render_as_string(hide_password=True)!r}: {err.orig}; "
                "start the database server (scripts/postgres.sh for a local one) or fix the url."
            ) from err
        self._engine, self._write_engine, self._table, self._batches = engine, write_engine, table, batches
        self._tasks = tasks

    def _retry(self, fn: Any, *, what: str, attempts: int = 20) -> Any:
        """Run ``fn`` again after transient lock/deadlock errors (and a create-table race)."""
        import sqlalchemy as sa

        for attempt in range(attempts):
            try:
                return fn()
            except (sa.exc.OperationalError, sa.exc.IntegrityError, sa.exc.ProgrammingError) as err:
                text = str(err).lower()
                racing_create = what == "create the table" and ("exist" in text or "duplicate column" in text)
                if attempt == attempts - 1 or not (is_retryable(err) or racing_create):
                    raise
                time.sleep(min(0.01 * 2**attempt, 0.5))
        raise AssertionError("unreachable")

    # -- the Buffer protocol ----------------------------------------------------------------------

    def put(
        self,
        experiences: list[Experience],
        *,
        producer: str | None = None,
        producer_batch: int | None = None,
        claims: list[tuple[int, int]] | None = None,
    ) -> None:
        """Store experiences (those with a reward become trainable, ``reward=None`` ones pending) and
        record them as one explored batch, in one transaction.

        ``producer`` / ``producer_batch`` name the batch for a producer that restarts (an explorer
        process): a pair put before raises :class:`DuplicateBatch` and stores nothing, and
        :meth:`produced` tells a restarted producer where it stopped. ``claims``: the ``(seq, claim)`` of
        the ledger tasks (:meth:`claim_tasks`) whose rows these are (``info["task_seq"]``): they are marked
        done in the same transaction, and the rows of a claim another explorer took over are left out
        (counted in :attr:`taken_over`).
        """
        for e in experiences:
            e.check()
        _, write = self._engines()
        now = self.clock()
        rows = [experience_to_row(e, now) for e in experiences]
        import sqlalchemy as sa

        def insert() -> int:
            with write.begin() as conn:
                mine = rows
                if claims:
                    done = ledger.finish(conn, self._tasks, claims, now)
                    mine = [r for r in rows if r["task_seq"] is None or r["task_seq"] in done]
                if mine:
                    conn.execute(sa.insert(self._table), mine)
                record = {"size": len(mine), "created_at": now}
                record.update(producer=producer, producer_batch=producer_batch)
                conn.execute(sa.insert(self._batches).values(**record))
            return len(rows) - len(mine)

        try:
            left_out = self._retry(insert, what="put")
        except sa.exc.IntegrityError as err:
            if producer is not None and self._has_batch(producer, producer_batch):
                raise DuplicateBatch(
                    f"put: batch {producer_batch} of producer {producer!r} is already in table "
                    f"{self.table_name!r}; nothing was stored (is a second process running as {producer!r}?)"
                ) from err
            raise ValueError(
                f"put: an experience id in {[e.id for e in experiences][:5]}... is already stored in "
                f"table {self.table_name!r} ({err.orig}); give each Experience a fresh id."
            ) from err
        with self._lock:
            self.taken_over += left_out
        self._wake()

    def set_rewards(self, rewards: dict[Any, float]) -> int:
        """Fill in pending rewards; returns how many rows became trainable.

        Keys are experience ids, or ``(task_id, run_id)`` pairs (which fill every pending step of
        that rollout). Rows that are not pending (unknown, already rewarded) are left alone.
        """
        import sqlalchemy as sa

        _, write = self._engines()
        t = self._table
        conditions = []
        for key, reward in rewards.items():
            if isinstance(key, str):
                cond = t.c.id == key
            elif isinstance(key, (tuple, list)) and len(key) == 2:
                cond = sa.and_(t.c.task_id == key[0], t.c.run_id == key[1])
            else:
                raise TypeError(
                    f"set_rewards key {key!r}: expected an experience id (str) or a (task_id, run_id) pair."
                )
            conditions.append((cond, float(reward)))

        def update() -> int:
            done = 0
            with write.begin() as conn:
                for cond, reward in conditions:
                    stmt = sa.update(t).where(cond, t.c.reward_status == PENDING)
                    done += conn.execute(stmt.values(reward=reward, reward_status=READY)).rowcount
            return done

        done = self._retry(update, what="set_rewards")
        self._wake()
        return done

    def get(
        self,
        n: int | None,
        *,
        min_version: int | None = None,
        current_version: int | None = None,
        timeout: float | None = None,
    ) -> list[Experience]:
        """Take ``n`` trainable experiences by the sampling rules, or raise :class:`BufferTimeout`.

        See the class docstring for the consumption rule; nothing is consumed on timeout.
        ``n=None``: the oldest explored batch not taken yet, whole (class docstring).
        """
        if n is not None and n <= 0:
            raise ValueError(f"Buffer.get(n={n}): n must be a positive number of experiences.")
        floor = self.rules.floor(min_version, current_version)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ready, due, batch = self._retry(lambda: self._peek(floor, by_batch=n is None), what="get")
            size = n if batch is None else batch.size
            if size is not None and (size == 0 or ready >= size or due):
                got = self._retry(lambda: self._claim(n, floor), what="get")
                if got is not None:
                    return self._handed_out(*got, current_version)
            if self._closed:
                if size is None:
                    raise BufferTimeout("buffer closed with no explored batch waiting for get(None)")
                raise BufferTimeout(f"buffer closed with {ready} of {size} requested experiences ready")
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise self._timed_out(size, ready, timeout)
            wait = self.poll_interval if remaining is None else min(self.poll_interval, remaining)
            with self._cond:
                self._cond.wait(wait)

    def _handed_out(self, rows: list[Any], uses: list[int], current_version: int | None) -> list[Experience]:
        """Count a claimed batch of rows and rebuild its experiences (an empty batch counts nothing)."""
        if not rows:
            return []
        versions = [r.policy_version for r in rows]
        with self._lock:
            self.consumed += len(rows)
            self.last_batch = batch_metrics(self.rules, uses, versions, current_version)
        return [row_to_experience(r) for r in rows]

    def _timed_out(self, n: int | None, ready: int, timeout: float | None) -> BufferTimeout:
        """The error of a get whose ``timeout`` passed (``n`` None: no explored batch was waiting)."""
        counts = self._counts()
        if n is None:
            return BufferTimeout(
                f"no explored batch arrived within {timeout}s; every batch put so far was taken "
                f"({counts['size']} experiences ready, {counts['pending']} pending a reward); "
                "raise buffer.get_timeout or check the explorer."
            )
        waiting = counts["size"] - ready
        return BufferTimeout(
            f"only {ready} of {n} experiences were ready after {timeout}s "
            f"({counts['pending']} pending a reward"
            + (f", {waiting} waiting for a cooldown or their group" if waiting > 0 else "")
            + "); raise buffer.get_timeout or check the explorer."
        )

    def _peek(self, floor: int | None, *, by_batch: bool = False) -> tuple[int, bool, Any]:
        """(rows eligible now, whether expiry or stale drops are due, the oldest explored batch not
        taken yet when ``by_batch``, else None) without taking a lock."""
        read, _ = self._engines()
        with read.connect() as conn:
            ready, due = q.peek(conn, self._table, self.rules, floor, self.clock())
            return ready, due, q.oldest_batch(conn, self._batches) if by_batch else None

    def _claim(self, n: int | None, floor: int | None) -> tuple[list[Any], list[int]] | None:
        """One transaction: expire pending rows, drop stale ones, then claim ``n`` rows if eligible.

        ``n`` None: first pick the oldest explored batch not taken yet (None if there is none; an
        empty one is taken alone), claim its size and take it with the rows. Returns the claimed
        rows and their use counts after this hand-out, or None.
        """
        import sqlalchemy as sa

        _, write = self._engines()
        t, rules = self._table, self.rules
        rows, expired, dropped, retried, lost, orphans = None, 0, 0, 0, 0, []
        try:
            with write.begin() as conn:
                if self._serialized():
                    lock = sa.func.pg_advisory_xact_lock(zlib.crc32(self.table_name.encode()))
                    conn.execute(sa.select(lock))
                now = self.clock()
                batch = q.oldest_batch(conn, self._batches, lock=True) if n is None else None
                if n is None and (batch is None or batch.size == 0):
                    if batch is not None:
                        q.take_batch(conn, self._batches, batch.batch, now)
                    return None if batch is None else ([], [])
                size = n if batch is None else batch.size
                expired = q.expire_pending(conn, t, rules, now)
                stale = q.stale_tasks(conn, t, floor)
                dropped = q.drop_stale(conn, t, floor)
                retried, lost, orphans = ledger.requeue_stale(
                    conn, t, self._tasks, stale, rules.stale_retries
                )
                number = q.next_get(conn, t) if rules.replay else None
                rows = q.choose(conn, t, rules, size, floor, number)
                if rows is not None:
                    q.mark(conn, t, rules, rows, number, now)
                    if batch is not None:
                        q.take_batch(conn, self._batches, batch.batch, now)
        except q.LostClaim:
            return None
        with self._lock:  # committed
            self.dropped_stale += dropped
            self.pending_expired += expired
            self.tasks_retried += retried
            self.tasks_lost += lost
            self._stale_tasks += orphans
        return None if rows is None else (rows, [r.use_count + 1 for r in rows])

    def _serialized(self) -> bool:
        """Whether claims take a table-wide lock (PostgreSQL, with replay or whole-group gating)."""
        dialect = self._engine.dialect.name
        return dialect == "postgresql" and (self.rules.replay or self.rules.whole_groups)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- introspection and state ------------------------------------------------------------------

    def _expire(self) -> None:
        """Expire timed-out pending rows now (``metrics`` does this too)."""
        _, write = self._engines()

        def expire() -> int:
            with write.begin() as conn:
                return q.expire_pending(conn, self._table, self.rules, self.clock())

        expired = self._retry(expire, what="expire pending rows")
        with self._lock:
            self.pending_expired += expired

    def _counts(self) -> dict[str, int]:
        """Rows by state for all processes sharing the table (see :func:`sql_sampling.counts`)."""
        read, _ = self._engines()

        def count() -> dict[str, int]:
            with read.connect() as conn:
                return q.counts(conn, self._table)

        return self._retry(count, what="count")

    def __len__(self) -> int:
        return self._counts()["size"]

    def find_runs(self, run_ids: list[str]) -> list[tuple[Experience, str]]:
        """The rows whose ``run_id`` is one of ``run_ids`` (any state), oldest first, each with its state
        (:mod:`trine.buffer.states`); ``trine serve`` finds a response's rows so after a restart."""
        import sqlalchemy as sa

        from trine.buffer.states import sql_state

        read, _ = self._engines()
        t = self._table

        def select() -> list[Any]:
            with read.connect() as conn:
                return conn.execute(sa.select(t).where(t.c.run_id.in_(run_ids)).order_by(t.c.seq)).all()

        rows = self._retry(select, what="find rows") if run_ids else []
        return [
            (row_to_experience(r), sql_state(r.reward_status, r.consumed_at, r.expired_at, r.reward))
            for r in rows
        ]

    def drop_pending(
        self,
        *,
        ids: list[str] | None = None,
        older_than: float | None = None,
        info: dict[str, str] | None = None,
    ) -> list[tuple[str, str, float, dict[str, Any]]]:
        """Drop the pending rows (awaiting a reward) that match every filter given: ``ids``, put more than
        ``older_than`` seconds ago, ``info[key] == value`` for each of ``info`` (e.g. a ``session_id``).
        They are marked as an expiry marks them (status ``dropped`` with ``expired_at``: state ``expired``),
        never handed out. Returns ``(id, task_id, created_at, info)`` of each row dropped, oldest first."""
        import sqlalchemy as sa

        if ids is None and older_than is None and not info:
            raise ValueError(
                "drop_pending: give ids, older_than or info; dropping every pending row is refused."
            )
        _, write = self._engines()
        t = self._table
        where = [t.c.reward_status == PENDING]
        if ids is not None:
            where.append(t.c.id.in_(ids))
        if older_than is not None:
            where.append(t.c.created_at < self.clock() - older_than)
        for key, value in (info or {}).items():
            where.append(t.c.info[key].as_string() == value)

        def drop() -> list[Any]:
            with write.begin() as conn:
                rows = conn.execute(
                    sa.select(t.c.seq, t.c.id, t.c.task_id, t.c.created_at, t.c.info).where(*where)
                ).all()
                if rows:  # the same rows: the transaction holds the write lock (SQLite) or sees its snapshot
                    stmt = sa.update(t).where(*where, t.c.seq <= max(r.seq for r in rows))
                    conn.execute(stmt.values(reward_status=DROPPED, expired_at=self.clock()))
                return sorted(rows, key=lambda r: r.seq)

        rows = self._retry(drop, what="drop pending rows")
        self._wake()
        return [(r.id, r.task_id, r.created_at, dict(r.info or {})) for r in rows]

    def claim_tasks(
        self, owner: str, n: int, lease: float, draw: Callable[[int, int], list[Any]]
    ) -> list[ledger.Claim]:
        """Claim up to ``n`` tasks of the shared stream for explorer ``owner`` for ``lease`` seconds: open
        and expired ones first, then new ones from ``draw(first_seq, count)`` (:func:`sql_tasks.claim`)."""
        import sqlalchemy as sa

        _, write = self._engines()

        def take() -> list[ledger.Claim]:
            with write.begin() as conn:
                if self._engine.dialect.name == "postgresql":  # one claimer at a time picks new numbers
                    conn.execute(
                        sa.select(sa.func.pg_advisory_xact_lock(zlib.crc32(self._tasks.name.encode())))
                    )
                return ledger.claim(conn, self._tasks, owner, n, self.clock(), lease, draw)

        return self._retry(take, what="claim tasks")

    def renew_tasks(self, owner: str, claims: list[tuple[int, int]], lease: float) -> int:
        """Extend ``owner``'s claims ``(seq, claim)`` by ``lease`` seconds from now; how many it still holds."""
        _, write = self._engines()

        def extend() -> int:
            with write.begin() as conn:
                return ledger.renew(conn, self._tasks, owner, claims, self.clock() + lease)

        return self._retry(extend, what="renew claims")

    def release_tasks(self, owner: str) -> int:
        """Open the tasks an earlier incarnation of explorer ``owner`` claimed and never put."""
        _, write = self._engines()

        def release() -> int:
            with write.begin() as conn:
                return ledger.release(conn, self._tasks, owner)

        return self._retry(release, what="release claims")

    def take_stale_tasks(self) -> list[int]:
        """Tasks not in the ledger whose rows this object's gets dropped all as stale, since the last call
        (as :meth:`MemoryBuffer.take_stale_tasks <trine.buffer.memory.MemoryBuffer.take_stale_tasks>`)."""
        with self._lock:
            out, self._stale_tasks = self._stale_tasks, []
            return out

    def task_counts(self) -> dict[str, int]:
        """Ledger tasks by state, for every explorer (:func:`sql_tasks.counts`)."""
        read, _ = self._engines()

        def count() -> dict[str, int]:
            with read.connect() as conn:
                return ledger.counts(conn, self._tasks, self.clock())

        return self._retry(count, what="count tasks")

    def produced(self, producer: str) -> int:
        """How many batches ``producer`` has put: one more than its largest ``producer_batch`` (0: none)."""
        import sqlalchemy as sa

        read, _ = self._engines()
        b = self._batches

        def largest() -> int:
            with read.connect() as conn:
                stmt = sa.select(sa.func.max(b.c.producer_batch)).where(b.c.producer == producer)
                value = conn.execute(stmt).scalar()
                return -1 if value is None else int(value)

        return self._retry(largest, what="read the producer's cursor") + 1

    def _has_batch(self, producer: str, producer_batch: int | None) -> bool:
        import sqlalchemy as sa

        read, _ = self._engines()
        b = self._batches
        with read.connect() as conn:
            stmt = sa.select(b.c.batch).where(b.c.producer == producer, b.c.producer_batch == producer_batch)
            return conn.execute(stmt).first() is not None

    def batches_waiting(self) -> int:
        """Explored batches (one per ``put``, by every process) not taken by ``get(None)`` yet."""
        read, _ = self._engines()

        def count() -> int:
            with read.connect() as conn:
                return q.batches_waiting(conn, self._batches)

        return self._retry(count, what="count batches")

    def metrics(self) -> dict[str, float]:
        """``buffer/*`` metrics (names in :mod:`trine.buffer.sampling`); counts cover all processes.

        ``buffer/size`` (trainable rows), ``buffer/pending``, ``buffer/dropped_stale`` and
        ``buffer/pending_expired`` (all time) are counted in the table; ``buffer/reuse`` and
        ``buffer/staleness_*`` describe the last batch this object handed out.
        """
        if self.rules.pending_timeout is not None:
            self._expire()
        counts = self._counts()
        out = {
            "buffer/size": float(counts["size"]),
            "buffer/pending": float(counts["pending"]),
            "buffer/dropped_stale": float(counts["dropped_stale"]),
        }
        if self.rules.pending_timeout is not None:
            out["buffer/pending_expired"] = float(counts["pending_expired"])
        if self.tasks_retried or self.tasks_lost:  # tasks dropped as stale (explorer processes' ledger)
            out.update(
                {
                    "buffer/tasks_retried": float(self.tasks_retried),
                    "buffer/tasks_lost": float(self.tasks_lost),
                }
            )
        return {**out, **self.last_batch}

    def state_dict(self) -> dict[str, Any]:
        """Where the database is (password hidden), the counters, and a high-water mark to rewind to.

        ``rewind`` holds ``mark`` (the largest ``seq``) and the rows not consumed at this moment:
        ``ready`` and ``pending`` as ``[first, last]`` seq ranges (unused rows), and ``used`` as
        ``[seq, use_count, last_get]`` (rows the priority sampler handed out but may replay);
        ``batches`` holds ``mark`` (the largest explored-batch id) and ``untaken`` (the batches not
        taken yet, as ``[first, last]`` id ranges). Both None until this object has used the database.
        """
        import sqlalchemy as sa

        marks = None if self._engine is None else self._retry(self._marks, what="read the mark")
        return {
            "url": sa.make_url(self.url).render_as_string(hide_password=True),
            "table": self.table_name,
            "counters": {"consumed": self.consumed, "dropped_stale": self.dropped_stale},
            "sampling": {"pending_expired": self.pending_expired, "last_batch": dict(self.last_batch)},
            # an object that never opened the database (nothing put or taken) records no mark
            "rewind": None if marks is None else marks[0],
            "batches": None if marks is None else marks[1],
        }

    def _marks(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The rows' mark (``rewind`` in :meth:`state_dict`) and the batches' (``batches``), read together."""
        read, _ = self._engines()
        with read.connect() as conn:
            # batches first: a put landing in between leaves rows past the batch mark (rolled back
            # or kept, never handed out by get(None)), never a batch whose rows were rolled back
            batch_mark, untaken = q.batch_mark(conn, self._batches)
            return self._mark(conn), {"mark": batch_mark, "untaken": ranges(untaken)}

    def _mark(self, conn: Any) -> dict[str, Any]:
        import sqlalchemy as sa

        t = self._table
        mark = int(conn.execute(sa.select(sa.func.coalesce(sa.func.max(t.c.seq), 0))).scalar())
        cols = sa.select(t.c.seq, t.c.reward_status, t.c.use_count, t.c.last_get)
        open_rows = conn.execute(
            cols.where(
                t.c.seq <= mark, t.c.consumed_at.is_(None), t.c.reward_status.in_((READY, PENDING))
            ).order_by(t.c.seq)
        ).all()
        fresh = [r for r in open_rows if r.use_count == 0 and r.last_get is None]
        return {
            "mark": mark,
            "ready": ranges([r.seq for r in fresh if r.reward_status == READY]),
            "pending": ranges([r.seq for r in fresh if r.reward_status == PENDING]),
            "used": [
                [r.seq, r.use_count, r.last_get] for r in open_rows if r.use_count or r.last_get is not None
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Rewind the table to the checkpoint that saved ``state`` and restore this object's counters.

        After a crash the table holds what happened after the checkpoint, which the resumed run
        does again. In one transaction, rows put after the checkpoint's ``mark`` get status
        ``"rolled_back"`` (with ``consumed_at``, ``last_get`` and ``expired_at`` cleared: never
        handed out, not counted in any ``buffer/*`` metric), and rows that were not consumed at the
        checkpoint get back their status, ``use_count``, ``last_get`` and ``priority`` of then, with
        ``consumed_at`` NULL: hand-outs, stale drops and expiries after it are undone, rewards
        filled in after it stay. ``last_rewind`` says how many rows were rolled back and restored.
        In the same transaction the explored batches recorded after the checkpoint's batch ``mark``
        are deleted and those not taken at the checkpoint are not taken again (a state saved before
        batch records existed rewinds the rows only). After a clean stop nothing changes. With
        ``rewind=False`` only the counters are restored.
        """
        if state.get("table", self.table_name) != self.table_name:
            raise ValueError(
                f"SQLBuffer state is for table {state['table']!r} but this buffer uses "
                f"{self.table_name!r}; pass table={state['table']!r} to resume from it."
            )
        counters = state.get("counters", {})
        self.consumed = int(counters.get("consumed", 0))
        self.dropped_stale = int(counters.get("dropped_stale", 0))
        sampling = state.get("sampling", {})
        self.pending_expired = int(sampling.get("pending_expired", 0))
        self.last_batch = dict(sampling.get("last_batch", {}))
        self.last_rewind = {"rolled_back": 0, "restored": 0}
        if self.rewind and state.get("rewind") is not None:
            batches = state.get("batches")
            self.last_rewind = self._retry(lambda: self._rewind(state["rewind"], batches), what="rewind")

    def _rewind(self, rw: dict[str, Any], batches: dict[str, Any] | None) -> dict[str, int]:
        """One transaction of :func:`trine.buffer.sql_rewind.rewind`; wakes waiting readers if rows moved."""
        _, write = self._engines()
        with write.begin() as conn:
            out, changed = rewind(
                conn, self._table, self._batches, self._tasks, self.rules, rw, batches, self.rewind
            )
        if changed:
            self._wake()
        return out

    def close(self) -> None:
        """Stop waiting ``get`` calls and release this process's connections."""
        self._closed = True
        self._wake()
        if self._engine is not None and self._pid == os.getpid():
            self._engine.dispose()
            self._engine = self._write_engine = self._table = self._batches = self._tasks = None

    def __repr__(self) -> str:
        import sqlalchemy as sa

        url = sa.make_url(self.url).render_as_string(hide_password=True)
        return f"SQLBuffer({url!r}, table={self.table_name!r})"
