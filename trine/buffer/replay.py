"""The steps a run trained, read back from its SQL buffer (``trine train --replay``).

Read-only: only ``SELECT`` on the run's table (layout in :mod:`trine.buffer.sql_schema`) and its
``<table>_batches``; nothing is marked, so the run's buffer stays as it was.

How the steps are found. A get claims its rows in one transaction and marks every row it consumes
with that transaction's one clock value (:func:`trine.buffer.sql_sampling.mark`):

- ``reuse_limit: 1`` (every FIFO run; a priority run without reuse): a trained row's ``consumed_at``
  is the time of the get that trained it. The rows of one get share it exactly and two gets never do
  (the clock moves on between them: a training step lies between), so a step is the rows sharing a
  ``consumed_at``, steps in that order. An explored batch that was empty (``put([])``, taken by
  ``get(None)``) is a step with no rows at its ``taken_at``: the trainer trained it as an empty batch.
- ``reuse_limit > 1``: a row is handed out several times and ``consumed_at`` marks only its last use,
  so a step is the rows whose last hand-out was get ``k`` (``last_get``), in get order. This is
  approximate (:attr:`TrainedSteps.exact` is False): a row's earlier hand-outs are not replayed, and a
  get whose rows were all handed out again later is missing.

Within a step the rows come in hand-out order: the sampler's order (:func:`~trine.buffer.
sql_sampling.sort_key`), groups placed together with ``whole_groups`` (as
:func:`~trine.buffer.sql_sampling.choose` placed them). A resumed run's table holds its final
timeline (hand-outs after the checkpoint it resumed from were undone), so the steps are those the
run's final weights came from. SQLAlchemy is imported lazily.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trine.buffer.inspect import run_buffer_config
from trine.buffer.open import open_buffer, storage_class
from trine.buffer.sampling import SamplingRules, arrange, batch_metrics
from trine.buffer.sql import SQLBuffer
from trine.buffer.sql_sampling import sort_key
from trine.buffer.sql_schema import READY, ROLLED_BACK, build_batches_table, build_table, row_to_experience
from trine.types import Experience


class ReplayError(ValueError):
    """A run whose trained steps cannot be replayed: no run there, no SQL buffer, nothing trained."""


@dataclass(frozen=True)
class StoredStep:
    """One training step of the run: its rows in hand-out order (none for an empty batch)."""

    seqs: tuple[int, ...]
    """The rows' ``seq``, in the order the get handed them out."""
    uses: tuple[int, ...]
    """Each row's ``use_count`` after this hand-out (1 without reuse)."""


class TrainedSteps:
    """The steps a run trained, in order, each loaded from the run's table when asked for.

    Open with :meth:`open`; ``get(i, current_version)`` gives step ``i``'s experiences and the
    ``buffer/staleness_*`` (and ``buffer/reuse``) metrics the run's buffer gave with them, measured
    against ``current_version`` (the replaying trainer's version).
    """

    def __init__(self, url: str, table: str, rules: SamplingRules, steps: list[StoredStep], exact: bool):
        self.url, self.table_name, self.rules = url, table, rules
        self.steps = steps
        self.exact = exact
        """False when the run reused experiences (``reuse_limit > 1``): see the module docstring."""
        self._engine: Any = None

    @classmethod
    def open(cls, run_dir: str | Path, stage: str | None = None) -> TrainedSteps:
        """The trained steps of the run in ``run_dir`` (its stage ``stage``, by default the last with a
        persistent buffer), read from the buffer its ``config.yaml`` names; :class:`ReplayError` if
        there is no run, its buffer is not SQL or it trained nothing."""
        try:
            config = run_buffer_config(run_dir, stage)
        except FileNotFoundError as err:
            raise ReplayError(str(err)) from None
        if not issubclass(storage_class(config), SQLBuffer):
            raise ReplayError(
                f"the run in {run_dir} stored its buffer with buffer.storage={config.storage!r}, which keeps "
                "no record of what each step trained; replay reads a SQL buffer: run with "
                "buffer.storage: sql."
            )
        buffer = open_buffer(config, run_dir)  # connects only when used: this takes its url and table
        buffer.close()
        rules = SamplingRules.from_section(config)
        out = cls(buffer.url, buffer.table_name, rules, [], exact=rules.reuse_limit == 1)
        try:
            out.steps, total = out._plan()
        except BaseException:
            out.close()
            raise
        if not any(s.seqs for s in out.steps):
            out.close()
            raise ReplayError(
                f"the run in {run_dir} trained nothing: its buffer ({buffer!r}) holds {total} experience(s), "
                "none handed to the trainer; replay a run that trained at least one step."
            )
        return out

    def __len__(self) -> int:
        return len(self.steps)

    def _connect(self) -> Any:
        import sqlalchemy as sa

        if self._engine is None:
            self._engine = sa.create_engine(self.url)
        return self._engine

    def _plan(self) -> tuple[list[StoredStep], int]:
        """(the steps in training order, how many rows the table holds)."""
        import sqlalchemy as sa

        engine = self._connect()
        if not sa.inspect(engine).has_table(self.table_name):
            return [], 0
        t = build_table(sa.MetaData(), self.table_name)
        b = build_batches_table(t.metadata, self.table_name)
        cols = [
            t.c.seq,
            t.c.consumed_at,
            t.c.last_get,
            t.c.use_count,
            t.c.priority,
            t.c.policy_version,
            t.c.group_id,
        ]
        with engine.connect() as conn:
            total = int(conn.execute(sa.select(sa.func.count()).select_from(t)).scalar())
            if self.exact:
                rows = conn.execute(
                    sa.select(*cols).where(t.c.consumed_at.is_not(None), t.c.reward_status == READY)
                )
                keyed = [(r.consumed_at, r) for r in rows]
                empty: list[Any] = []
                if sa.inspect(conn).has_table(b.name):
                    taken = sa.select(b.c.taken_at).where(b.c.size == 0, b.c.taken_at.is_not(None))
                    empty = list(conn.execute(taken).scalars())
            else:
                used = t.c.last_get.is_not(None) & (t.c.reward_status != ROLLED_BACK)
                keyed = [(r.last_get, r) for r in conn.execute(sa.select(*cols).where(used))]
                empty = []
        groups: dict[Any, list[Any]] = {key: [] for key in empty}
        for key, row in keyed:
            groups.setdefault(key, []).append(row)
        return [self._step(groups[key]) for key in sorted(groups)], total

    def _step(self, rows: list[Any]) -> StoredStep:
        """A get's rows in the order it handed them out."""
        ordered = sorted(rows, key=sort_key(self.rules))
        if self.rules.whole_groups:
            ordered = arrange(ordered, len(ordered), lambda r: r.group_id or f"\0{r.seq}") or []
        return StoredStep(tuple(r.seq for r in ordered), tuple(int(r.use_count) for r in ordered))

    def get(
        self, index: int, current_version: int | None = None
    ) -> tuple[list[Experience], dict[str, float]]:
        """Step ``index``'s experiences as stored (versions and rewards included), in hand-out order, and
        its ``buffer/staleness_*`` against ``current_version`` (plus ``buffer/reuse`` for the priority
        sampler), as the run's buffer computed them at that get."""
        import sqlalchemy as sa

        step = self.steps[index]
        if not step.seqs:
            return [], {}
        t = build_table(sa.MetaData(), self.table_name)
        with self._connect().connect() as conn:
            rows = {r.seq: r for r in conn.execute(sa.select(t).where(t.c.seq.in_(step.seqs)))}
        experiences = [row_to_experience(rows[s]) for s in step.seqs]
        versions = [e.policy_version for e in experiences]
        return experiences, batch_metrics(self.rules, list(step.uses), versions, current_version)

    def close(self) -> None:
        """Release the connections (the run's database is left as it was)."""
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def __repr__(self) -> str:
        return f"TrainedSteps({self.url!r}, table={self.table_name!r}, steps={len(self.steps)})"
