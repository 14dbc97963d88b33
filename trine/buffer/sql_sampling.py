"""The sampling rules of :mod:`trine.buffer.sampling` as SQL, for :class:`~trine.buffer.sql.SQLBuffer`.

Each function takes an open connection (inside the caller's transaction), the table and the
:class:`~trine.buffer.sampling.SamplingRules`. The columns used are documented in
:mod:`trine.buffer.sql_schema`: ``reward_status``, ``consumed_at``, ``use_count``, ``priority``
(``policy_version - use_count * reuse_decay``, kept up to date at every priority-sampler hand-out,
so the priority order is ``ORDER BY priority DESC, seq``), ``last_get`` (number of the get that last handed the row
out: the next get's number is ``max(last_get) + 1``) and ``expired_at``. The
explored-batch functions take the ``<table>_batches`` table ``b`` (``batch``, ``size``,
``taken_at``) instead. SQLAlchemy is imported lazily.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trine.buffer.sampling import SamplingRules, arrange
from trine.buffer.sql_schema import DROPPED, PENDING, READY


class LostClaim(Exception):
    """Another reader marked a row first: roll the claim back and try again."""


def trainable(t: Any) -> Any:
    """Rows that are ready and not consumed for good."""
    return (t.c.reward_status == READY) & t.c.consumed_at.is_(None)


def next_get(conn: Any, t: Any) -> int:
    """Number of the next get (gets that returned a batch are numbered 1, 2, ...)."""
    import sqlalchemy as sa

    return int(conn.execute(sa.select(sa.func.coalesce(sa.func.max(t.c.last_get), 0))).scalar()) + 1


def eligible(t: Any, rules: SamplingRules, floor: int | None, get_number: int | None) -> Any:
    """Rows that may go out in get ``get_number``: trainable, fresh enough, cooled down, group complete."""
    import sqlalchemy as sa

    clause = trainable(t)
    if floor is not None:
        clause &= t.c.policy_version >= floor
    if rules.replay and get_number is not None:
        clause &= t.c.last_get.is_(None) | (t.c.last_get + rules.cooldown < get_number)
    if rules.whole_groups:
        member = t.alias("pending_member")
        blocked = sa.exists().where(member.c.group_id == t.c.group_id, member.c.reward_status == PENDING)
        clause &= (t.c.group_id == "") | ~blocked
    return clause


def order_by(t: Any, rules: SamplingRules) -> list[Any]:
    """SQL hand-out order; :func:`sort_key` is the same order in Python."""
    if rules.replay:
        return [t.c.priority.desc(), t.c.seq]
    return [t.c.policy_version, t.c.seq] if rules.oldest_weights_first else [t.c.seq]


def sort_key(rules: SamplingRules) -> Callable[[Any], Any]:
    if rules.replay:
        return lambda r: (-r.priority, r.seq)
    return (lambda r: (r.policy_version, r.seq)) if rules.oldest_weights_first else (lambda r: r.seq)


def expire_pending(conn: Any, t: Any, rules: SamplingRules, now: float) -> int:
    """Drop (or give the default reward to) pending rows put before ``now - pending_timeout``."""
    import sqlalchemy as sa

    cutoff = rules.expiry_cutoff(now)
    if cutoff is None:
        return 0
    reward = rules.expired_reward
    status = DROPPED if reward is None else READY
    stmt = sa.update(t).where(t.c.reward_status == PENDING, t.c.created_at < cutoff)
    return conn.execute(stmt.values(reward_status=status, reward=reward, expired_at=now)).rowcount


def drop_stale(conn: Any, t: Any, floor: int | None) -> int:
    """Mark trainable rows below the staleness floor as dropped; returns how many."""
    import sqlalchemy as sa

    if floor is None:
        return 0
    stale = sa.select(t.c.seq).where(trainable(t), t.c.policy_version < floor)
    stale = stale.with_for_update(skip_locked=True)
    stmt = sa.update(t).where(t.c.seq.in_(stale.scalar_subquery()))
    return conn.execute(stmt.values(reward_status=DROPPED)).rowcount


def stale_tasks(conn: Any, t: Any, floor: int | None) -> set[int]:
    """The ledger tasks (``task_seq``) of the rows :func:`drop_stale` is about to drop."""
    import sqlalchemy as sa

    if floor is None:
        return set()
    stmt = sa.select(t.c.task_seq).where(trainable(t), t.c.policy_version < floor, t.c.task_seq.is_not(None))
    return {int(r[0]) for r in conn.execute(stmt.distinct())}


def peek(conn: Any, t: Any, rules: SamplingRules, floor: int | None, now: float) -> tuple[int, bool]:
    """(rows eligible for the next get, whether expiry or stale drops are due), without writing."""
    import sqlalchemy as sa

    number = next_get(conn, t) if rules.replay else None
    count = sa.select(sa.func.count()).select_from(t).where(eligible(t, rules, floor, number))
    chores = []
    if floor is not None:
        chores.append(trainable(t) & (t.c.policy_version < floor))
    cutoff = rules.expiry_cutoff(now)
    if cutoff is not None:
        chores.append((t.c.reward_status == PENDING) & (t.c.created_at < cutoff))
    due = False
    if chores:
        due = conn.execute(sa.select(sa.exists().where(sa.or_(*chores)))).scalar()
    return int(conn.execute(count).scalar()), bool(due)


def choose(conn: Any, t: Any, rules: SamplingRules, n: int, floor: int | None, number: int | None) -> Any:
    """Lock and return the ``n`` rows the next get hands out, in order (None if fewer are eligible).

    Without ``whole_groups`` these are the first ``n`` eligible rows in hand-out order. With it, the
    groups of those rows are completed with their other eligible members, which is enough to place
    the first ``n`` rows of the whole-group order (every group that starts before position ``n``
    has a member among the first ``n``).
    """
    import sqlalchemy as sa

    where = eligible(t, rules, floor, number)
    first = sa.select(t).where(where).order_by(*order_by(t, rules)).limit(n)
    rows = conn.execute(first.with_for_update(skip_locked=True)).all()
    if not rules.whole_groups or len(rows) == 0:
        return rows if len(rows) == n else None
    groups = sorted({r.group_id for r in rows if r.group_id})
    if groups:
        more = sa.select(t).where(where, t.c.group_id.in_(groups)).with_for_update(skip_locked=True)
        by_seq = {r.seq: r for r in [*rows, *conn.execute(more).all()]}
        rows = sorted(by_seq.values(), key=sort_key(rules))
    return arrange(rows, n, lambda r: r.group_id or f"\0{r.seq}")


def mark(conn: Any, t: Any, rules: SamplingRules, rows: list[Any], number: int | None, now: float) -> None:
    """Count one use of each row; rows reaching ``reuse_limit`` are consumed (``consumed_at``)."""
    import sqlalchemy as sa

    uses = t.c.use_count + 1
    values = {
        "use_count": uses,
        "consumed_at": sa.case((uses >= rules.reuse_limit, sa.literal(now, sa.Float())), else_=sa.null()),
    }
    if rules.replay:
        values["priority"] = t.c.policy_version - uses * sa.literal(float(rules.reuse_decay), sa.Float())
        values["last_get"] = number
    stmt = sa.update(t).where(t.c.seq.in_([r.seq for r in rows]), trainable(t))
    if conn.execute(stmt.values(**values)).rowcount != len(rows):
        raise LostClaim  # cannot happen under the row locks; never hand out more than allowed


def counts(conn: Any, t: Any) -> dict[str, int]:
    """Rows by state, for every process sharing the table (``buffer/*`` metrics)."""
    import sqlalchemy as sa

    def total(cond: Any) -> Any:
        return sa.func.coalesce(sa.func.sum(sa.case((cond, 1), else_=0)), 0)

    stmt = sa.select(
        total(trainable(t)),
        total(t.c.reward_status == PENDING),
        total((t.c.reward_status == DROPPED) & (t.c.expired_at.is_(None) | t.c.reward.is_not(None))),
        total(t.c.expired_at.is_not(None)),
    )
    size, pending, stale, expired = conn.execute(stmt).one()
    return {
        "size": int(size),
        "pending": int(pending),
        "dropped_stale": int(stale),
        "pending_expired": int(expired),
    }


# -- explored batches (the <table>_batches table, one row per put) ---------------------------------


def oldest_batch(conn: Any, b: Any, *, lock: bool = False) -> Any:
    """The oldest batch not taken yet (a row with ``batch`` and ``size``), or None.

    ``lock=True`` (inside a claim) locks it, skipping batches other readers hold (PostgreSQL).
    """
    import sqlalchemy as sa

    stmt = sa.select(b.c.batch, b.c.size).where(b.c.taken_at.is_(None)).order_by(b.c.batch).limit(1)
    return conn.execute(stmt.with_for_update(skip_locked=True) if lock else stmt).first()


def take_batch(conn: Any, b: Any, batch: int, now: float) -> None:
    """Mark ``batch`` taken at ``now``; raises :class:`LostClaim` if another reader took it first."""
    import sqlalchemy as sa

    stmt = sa.update(b).where(b.c.batch == batch, b.c.taken_at.is_(None)).values(taken_at=now)
    if conn.execute(stmt).rowcount != 1:
        raise LostClaim


def batches_waiting(conn: Any, b: Any) -> int:
    """Batches not taken yet."""
    import sqlalchemy as sa

    stmt = sa.select(sa.func.count()).select_from(b).where(b.c.taken_at.is_(None))
    return int(conn.execute(stmt).scalar())


def batch_mark(conn: Any, b: Any) -> tuple[int, list[int]]:
    """(the largest batch id, the ids of the batches not taken yet up to it, ascending)."""
    import sqlalchemy as sa

    mark = int(conn.execute(sa.select(sa.func.coalesce(sa.func.max(b.c.batch), 0))).scalar())
    open_ids = sa.select(b.c.batch).where(b.c.batch <= mark, b.c.taken_at.is_(None)).order_by(b.c.batch)
    return mark, [int(x) for x in conn.execute(open_ids).scalars()]
