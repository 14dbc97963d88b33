"""The task ledger of a SQL buffer: which explorer runs which task, so several explorer processes pull work
from one shared stream instead of splitting it, and none is lost or explored twice.

Every explorer process builds the same seeded task stream; task number ``seq`` (0, 1, 2, ...) is the same
task in each. The table ``<table>_tasks`` holds one row per task some explorer has claimed:

=================  ==============  =====================================================================
column             type            meaning
=================  ==============  =====================================================================
seq                integer (pk)    the task's place in the shared stream
state              text            "claimed" (an explorer runs it), "done" (its rows are in the buffer),
                                   "open" (to be claimed again: its claim expired, its explorer
                                   restarted, or its rows were dropped as stale) or "lost" (dropped as
                                   stale more than ``stale_retries`` times; counted, never silent)
owner              text, null      the explorer that claimed it last (``explorer-0``)
claim              integer         claims so far (1 at the first): a put names the claim it finishes, so
                                   an explorer whose claim expired and was taken over puts nothing
lease_until        float           unix time its claim ends unless renewed (an explorer renews its claims
                                   while its event loop runs, so only a dead or hung one loses them)
retries            integer         times it was explored again because its rows were dropped as stale
task               bytes           the pickled :class:`~trine.types.Task` (any explorer can run it again)
done_at            float, null     time of the put that finished it
=================  ==============  =====================================================================

``claim`` (one write transaction) takes open and expired tasks first, lowest ``seq`` first, then new ones
past the largest ``seq`` (the caller draws them from its copy of the stream). ``finish`` runs in the
transaction of the put that stores a task's rows: the rows of a claim that is no longer the task's current
one are left out. ``requeue_stale`` runs in the transaction of the ``get`` that dropped rows as stale.
Rows carry their task's number in the experiences table's ``task_seq`` column.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from trine.types import Task

CLAIMED, DONE, OPEN, LOST = "claimed", "done", "open", "lost"


@dataclass(frozen=True)
class Claim:
    """One task an explorer holds: its place in the stream, which claim of it this is, the task."""

    seq: int
    claim: int
    task: Task
    retries: int = 0
    """Times it was explored again after its rows were dropped as stale (0: the first time)."""


def build_tasks_table(metadata: Any, name: str) -> Any:
    """The ``sqlalchemy.Table`` ``<name>_tasks`` in ``metadata`` (see the module docstring)."""
    import sqlalchemy as sa

    seq_type = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    return sa.Table(
        f"{name}_tasks",
        metadata,
        sa.Column("seq", seq_type, primary_key=True, autoincrement=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("owner", sa.String(), nullable=True),
        sa.Column("claim", sa.Integer(), nullable=False),
        sa.Column("lease_until", sa.Float(), nullable=False),
        sa.Column("retries", sa.Integer(), nullable=False, default=0),
        sa.Column("task", sa.LargeBinary(), nullable=False),
        sa.Column("done_at", sa.Float(), nullable=True),
        sa.Index(f"ix_{name}_tasks_state", "state", "seq"),
    )


def claim(
    conn: Any,
    tt: Any,
    owner: str,
    n: int,
    now: float,
    lease: float,
    draw: Callable[[int, int], list[Task]],
) -> list[Claim]:
    """Up to ``n`` tasks for ``owner`` (inside the caller's write transaction): open or expired ones first,
    then new ones, ``draw(first_seq, count)`` giving the stream's tasks from ``first_seq`` (fewer at its
    end). Returns them in ``seq`` order; [] when none is left."""
    import sqlalchemy as sa

    free = (tt.c.state == OPEN) | ((tt.c.state == CLAIMED) & (tt.c.lease_until < now))
    stmt = sa.select(tt.c.seq, tt.c.claim, tt.c.task, tt.c.retries).where(free).order_by(tt.c.seq).limit(n)
    taken = conn.execute(stmt.with_for_update(skip_locked=True)).all()
    out = []
    for row in taken:
        values = {"state": CLAIMED, "owner": owner, "claim": row.claim + 1, "lease_until": now + lease}
        conn.execute(sa.update(tt).where(tt.c.seq == row.seq).values(**values))
        out.append(Claim(row.seq, row.claim + 1, pickle.loads(row.task), row.retries))
    if len(out) < n:
        first = int(conn.execute(sa.select(sa.func.coalesce(sa.func.max(tt.c.seq), -1))).scalar()) + 1
        fresh = draw(first, n - len(out))
        rows = [
            {
                "seq": first + i,
                "state": CLAIMED,
                "owner": owner,
                "claim": 1,
                "lease_until": now + lease,
                "retries": 0,
                "task": pickle.dumps(task),
                "done_at": None,
            }
            for i, task in enumerate(fresh)
        ]
        if rows:
            conn.execute(sa.insert(tt), rows)
        out += [Claim(first + i, 1, task) for i, task in enumerate(fresh)]
    return out


def renew(conn: Any, tt: Any, owner: str, claims: Iterable[tuple[int, int]], until: float) -> int:
    """Extend ``owner``'s current claims ``(seq, claim)`` to ``until``; returns how many it still holds."""
    import sqlalchemy as sa

    held = 0
    for seq, number in claims:
        mine = (tt.c.seq == seq) & (tt.c.claim == number) & (tt.c.state == CLAIMED)
        held += conn.execute(sa.update(tt).where(mine).values(lease_until=until)).rowcount
    return held


def finish(conn: Any, tt: Any, claims: Iterable[tuple[int, int]], now: float) -> set[int]:
    """Mark the tasks of current claims ``(seq, claim)`` done; returns their ``seq`` (a claim that expired
    and was taken over by another explorer is not current: its rows must not be stored)."""
    import sqlalchemy as sa

    done = set()
    for seq, number in claims:
        mine = (tt.c.seq == seq) & (tt.c.claim == number) & (tt.c.state == CLAIMED)
        if conn.execute(sa.update(tt).where(mine).values(state=DONE, done_at=now)).rowcount:
            done.add(seq)
    return done


def release(conn: Any, tt: Any, owner: str) -> int:
    """Open every task ``owner`` still holds (an explorer starting again: another incarnation's claims)."""
    import sqlalchemy as sa

    stmt = sa.update(tt).where(tt.c.owner == owner, tt.c.state == CLAIMED).values(state=OPEN)
    return conn.execute(stmt).rowcount


def requeue_stale(conn: Any, t: Any, tt: Any, seqs: set[int], max_retries: int) -> tuple[int, int, list[int]]:
    """Tasks ``seqs`` had rows dropped as stale: each whose rows are now all dropped (none trained, ready or
    pending) is opened again, to be explored with newer weights, or marked lost after ``max_retries``
    retries. Returns (retried, lost, the tasks all of whose rows were dropped but that are not in the
    ledger: an explorer in one process retries those itself, :meth:`SQLBuffer.take_stale_tasks`)."""
    import sqlalchemy as sa

    from trine.buffer.sql_schema import DROPPED, ROLLED_BACK

    if not seqs:
        return 0, 0, []
    alive = (t.c.reward_status.not_in((DROPPED, ROLLED_BACK))) | (
        t.c.consumed_at.is_not(None) & (t.c.reward_status != ROLLED_BACK)
    )
    kept = {
        r[0] for r in conn.execute(sa.select(t.c.task_seq).where(t.c.task_seq.in_(seqs), alive).distinct())
    }
    gone = sorted(seqs - kept)
    retried, lost, orphans = 0, 0, []
    for seq in gone:
        row = conn.execute(sa.select(tt.c.retries, tt.c.state).where(tt.c.seq == seq)).first()
        if row is None:
            orphans.append(seq)
        if row is None or row.state != DONE:
            continue
        if row.retries < max_retries:
            values = {"state": OPEN, "retries": row.retries + 1, "done_at": None}
            retried += 1
        else:
            values, lost = {"state": LOST}, lost + 1
        conn.execute(sa.update(tt).where(tt.c.seq == seq).values(**values))
    return retried, lost, orphans


def counts(conn: Any, tt: Any, now: float) -> dict[str, int]:
    """Tasks by state (an expired claim counts as open), and how many were retried at least once."""
    import sqlalchemy as sa

    expired = (tt.c.state == CLAIMED) & (tt.c.lease_until < now)
    state = sa.case((expired, OPEN), else_=tt.c.state)
    out = {CLAIMED: 0, DONE: 0, OPEN: 0, LOST: 0}
    for name, number in conn.execute(sa.select(state, sa.func.count()).group_by(state)).all():
        out[str(name)] = int(number)
    out["retried"] = int(conn.execute(sa.select(sa.func.count()).where(tt.c.retries > 0)).scalar())
    return out
