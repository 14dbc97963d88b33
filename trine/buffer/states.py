"""The states of a stored experience, as people are shown them: the one vocabulary of ``trine buffer``,
``trine status`` and the studio.

============  ======================================================================================
state         meaning
============  ======================================================================================
pending       stored without a reward; waits for one (``trine buffer reward``, an annotation, a judge)
ready         has its reward and waits for the trainer
trained       handed to the trainer for good (``buffer.get``)
stale         dropped untrained: its ``policy_version`` was too old for the staleness rule
              (``buffer.max_staleness`` / ``min_version``)
expired       dropped untrained: its reward did not come within ``buffer.pending_timeout``
rolled_back   put after the checkpoint a crashed run resumed from; the resumed run explored it again
============  ======================================================================================

A storage keeps its own fields: the SQL table's ``reward_status``, ``consumed_at`` and ``expired_at``
(:mod:`trine.buffer.sql_schema`), mapped to these names here; a file log's events
(:mod:`trine.buffer.files`) and a checkpointed in-memory buffer, mapped by :mod:`trine.buffer.inspect`. A pending row that expired and was given
``buffer.expired_reward`` instead is ``ready`` (then ``trained`` or ``stale``), not ``expired``.
"""

from __future__ import annotations

from typing import Any

PENDING, READY, TRAINED, STALE, EXPIRED, ROLLED_BACK = (
    "pending",
    "ready",
    "trained",
    "stale",
    "expired",
    "rolled_back",
)
STATES = (PENDING, READY, TRAINED, STALE, EXPIRED, ROLLED_BACK)
"""Every state, in the order they are listed (counts, tables, filters)."""
RENAMED = {"consumed": TRAINED, "dropped": STALE}
"""Names older Trine versions showed (``trine buffer``), for the hint of an error."""


def check_state(value: str, option: str = "--status") -> str:
    """``value`` when it is a state, else ValueError naming the states (and the new name of an old one)."""
    if value in STATES:
        return value
    hint = f" ({value!r} is now called {RENAMED[value]!r})" if value in RENAMED else ""
    raise ValueError(f"{option} {value!r}: expected one of {', '.join(STATES)}{hint}")


def sql_state(reward_status: str, consumed_at: Any, expired_at: Any = None, reward: Any = None) -> str:
    """The state of a row of the SQL buffer table from its ``reward_status``, ``consumed_at``,
    ``expired_at`` and ``reward`` columns."""
    from trine.buffer.sql_schema import DROPPED

    if reward_status == DROPPED:
        return EXPIRED if expired_at is not None and reward is None else STALE
    if consumed_at is not None:
        return TRAINED
    return reward_status  # pending, ready, rolled_back: the column's own names


def sql_state_clause(t: Any, state: str, expired_at: Any = None) -> Any:
    """The SQL condition on table ``t`` selecting the rows :func:`sql_state` calls ``state``
    (``expired_at``: that column, or ``NULL`` for an older table that lacks it; default ``t.c.expired_at``)."""
    import sqlalchemy as sa

    from trine.buffer.sql_schema import DROPPED

    expired_at = t.c.expired_at if expired_at is None else expired_at
    dropped = t.c.reward_status == DROPPED
    timed_out = sa.and_(expired_at.is_not(None), t.c.reward.is_(None))
    if state == TRAINED:
        return sa.and_(t.c.consumed_at.is_not(None), ~dropped)
    if state == EXPIRED:
        return sa.and_(dropped, timed_out)
    if state == STALE:
        return sa.and_(dropped, sa.not_(timed_out))
    return sa.and_(t.c.reward_status == check_state(state, "state"), t.c.consumed_at.is_(None))


def sql_state_counts(conn: Any, t: Any, expired_at: Any = None) -> dict[str, int]:
    """``{state: rows}`` of table ``t`` (every state, in :data:`STATES` order), in one query."""
    import sqlalchemy as sa

    sums = [
        sa.func.coalesce(sa.func.sum(sa.case((sql_state_clause(t, s, expired_at), 1), else_=0)), 0)
        for s in STATES
    ]
    return dict(zip(STATES, (int(n) for n in conn.execute(sa.select(*sums)).one())))
