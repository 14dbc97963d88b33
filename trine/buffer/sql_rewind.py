"""Rewinding a SQL buffer's table to a checkpoint (:meth:`trine.buffer.sql.SQLBuffer.load_state_dict`):
the functions its one transaction runs, and the compact ``[first, last]`` ranges a checkpoint records."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from trine.buffer.sampling import SamplingRules
from trine.buffer.sql_schema import DROPPED, PENDING, READY, ROLLED_BACK
from trine.buffer.sql_tasks import DONE, LOST, OPEN


def rewind(
    conn: Any,
    t: Any,
    b: Any,
    tt: Any,
    rules: SamplingRules,
    rw: dict[str, Any],
    batches: dict[str, Any] | None,
    mode: bool | str,
) -> tuple[dict[str, int], bool]:
    """Put table ``t`` (and its batches ``b``, its task ledger ``tt``) back as the checkpoint mark ``rw`` / ``batches`` recorded, in
    the caller's transaction (``mode="reads"``: undo only what was taken since; see ``load_state_dict``).
    A row dropped as stale whose task was explored again since (:mod:`trine.buffer.sql_tasks`) stays
    dropped: the newer attempt's rows stand for it; a task opened again for a retry not yet claimed is
    done again, with its rows back. Returns the rows rolled back and restored, and whether
    anything changed."""
    import sqlalchemy as sa

    _unqueue(conn, t, tt, rw, mode)
    current = (tt.c.state == DONE) & (tt.c.done_at == t.c.created_at)  # this row's put finished its task
    redone = (t.c.reward_status == DROPPED) & sa.exists().where(tt.c.seq == t.c.task_seq, ~current)

    def priority(uses: int) -> Any:
        return t.c.policy_version - sa.literal(float(uses * rules.reuse_decay), sa.Float())

    def reset(uses: int = 0, last_get: int | None = None) -> dict[str, Any]:
        return {"consumed_at": None, "use_count": uses, "last_get": last_get, "priority": priority(uses)}

    def moved(uses: int = 0, last_get: int | None = None) -> Any:  # differs from the checkpoint
        return (
            (t.c.reward_status != READY)
            | t.c.consumed_at.is_not(None)
            | (t.c.use_count != uses)
            | t.c.last_get.is_distinct_from(last_get)
        )

    run = conn.execute
    later = sa.update(t).where(t.c.seq > int(rw["mark"]), t.c.reward_status != ROLLED_BACK)
    rolled, restored = 0, 0
    if mode == "reads":  # rows put since stay; what was taken or dropped since is undone
        taken = later.where(t.c.reward.is_not(None), t.c.expired_at.is_(None), moved(), ~redone)
        restored += run(taken.values(reward_status=READY, **reset())).rowcount
        expired = later.where(t.c.expired_at.is_not(None), t.c.reward_status != PENDING)
        values = {"reward_status": PENDING, "reward": None, "expired_at": None, **reset()}
        restored += run(expired.values(**values)).rowcount
    else:
        values = {
            "reward_status": ROLLED_BACK,
            "consumed_at": None,
            "last_get": None,
            "expired_at": None,
        }
        rolled = run(later.values(**values)).rowcount
    for within in in_ranges(t.c.seq, rw.get("ready", [])):
        stmt = sa.update(t).where(within, moved(), ~redone).values(reward_status=READY, **reset())
        restored += run(stmt).rowcount
    for within in in_ranges(t.c.seq, rw.get("pending", [])):
        expired = sa.update(t).where(within, t.c.expired_at.is_not(None))  # expired after it
        values = {"reward_status": PENDING, "reward": None, "expired_at": None, **reset()}
        restored += run(expired.values(**values)).rowcount
        rewarded = sa.update(t).where(within, t.c.reward.is_not(None), moved())  # by a grader
        restored += run(rewarded.values(reward_status=READY, **reset())).rowcount
    for seq, uses, last_get in rw.get("used", []):
        stmt = sa.update(t).where(t.c.seq == seq, moved(uses, last_get), ~redone)
        restored += run(stmt.values(reward_status=READY, **reset(uses, last_get))).rowcount
    untaken = 0
    if batches is not None:
        untaken = rewind_batches(conn, b, batches, keep_later=mode == "reads")
    return {"rolled_back": rolled, "restored": restored}, bool(rolled or restored or untaken)


def _unqueue(conn: Any, t: Any, tt: Any, rw: dict[str, Any], mode: bool | str) -> None:
    """Tasks opened again (or lost) since the checkpoint because their rows were dropped as stale, and not
    claimed since: done again, as at the checkpoint (their rows are about to be restored)."""
    import sqlalchemy as sa

    since = t.c.seq > int(rw["mark"]) if mode == "reads" else sa.false()
    for within in [since, *in_ranges(t.c.seq, rw.get("ready", []))]:
        dropped = (t.c.reward_status == DROPPED) & t.c.expired_at.is_(None) & t.c.task_seq.is_not(None)
        stmt = (
            sa.select(t.c.task_seq, sa.func.max(t.c.created_at)).where(within, dropped).group_by(t.c.task_seq)
        )
        for seq, created in conn.execute(stmt).all():
            waiting = (tt.c.seq == seq) & tt.c.state.in_((OPEN, LOST))
            retries = sa.case(
                (tt.c.state == OPEN, sa.case((tt.c.retries > 0, tt.c.retries - 1), else_=0)),
                else_=tt.c.retries,
            )
            conn.execute(sa.update(tt).where(waiting).values(state=DONE, done_at=created, retries=retries))


def ranges(seqs: list[int]) -> list[list[int]]:
    """Sorted ``seqs`` as ``[first, last]`` runs of consecutive numbers (compact checkpoints)."""
    out: list[list[int]] = []
    for seq in seqs:
        if out and seq == out[-1][1] + 1:
            out[-1][1] = seq
        else:
            out.append([seq, seq])
    return out


def rewind_batches(conn: Any, b: Any, mark: dict[str, Any], keep_later: bool = False) -> int:
    """Delete the batches recorded after ``mark["mark"]`` (``keep_later``: un-take them instead); un-take
    those in ``mark["untaken"]`` (ranges) that were taken since. Returns how many batches changed."""
    import sqlalchemy as sa

    later = b.c.batch > int(mark["mark"])
    if keep_later:
        changed = conn.execute(sa.update(b).where(later).values(taken_at=None)).rowcount
    else:
        changed = conn.execute(sa.delete(b).where(later)).rowcount
    for within in in_ranges(b.c.batch, mark.get("untaken", [])):
        stmt = sa.update(b).where(within, b.c.taken_at.is_not(None)).values(taken_at=None)
        changed += conn.execute(stmt).rowcount
    return changed


def in_ranges(column: Any, ranges: list[list[int]], chunk: int = 200) -> Iterator[Any]:
    """Conditions ``column`` in ``ranges``, ``chunk`` ranges each (within SQLite's bound-parameter limit)."""
    import sqlalchemy as sa

    for i in range(0, len(ranges), chunk):
        yield sa.or_(*(column.between(first, last) for first, last in ranges[i : i + chunk]))
