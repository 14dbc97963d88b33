"""How a buffer hands experiences to the trainer: one set of rules for every storage.

:class:`~trine.buffer.memory.MemoryBuffer` (and so :class:`~trine.buffer.files.FileBuffer`) and
:class:`~trine.buffer.sql.SQLBuffer` take one :class:`SamplingRules` (``rules=``), built from the
``buffer`` config section by :meth:`SamplingRules.from_section` (its fields are that section's keys,
declared once by :class:`~trine.config.BufferRules`), and apply it identically. At
every ``get(n, min_version=..., current_version=...)``, in this order:

1. **Pending timeout** (also at ``metrics()``). With ``pending_timeout`` set, a pending experience
   (``reward=None``) put more than ``pending_timeout`` seconds ago (by the buffer's ``clock``)
   expires: ``pending_action="drop"`` removes it for good (SQL: ``reward_status="dropped"``,
   ``reward`` NULL), ``"default"`` gives it ``reward=default_reward`` and makes it trainable.
   Either way it is counted in ``buffer/pending_expired`` and ``set_rewards`` no longer fills it.
2. **Staleness.** The floor is the larger of ``min_version`` and ``current_version -
   max_staleness`` (a term is absent when its inputs are None). Trainable experiences with
   ``policy_version`` below the floor are dropped for good, counted in ``buffer/dropped_stale``.
3. **Eligibility.** Gets are numbered 1, 2, ... buffer-wide, counting only gets that returned a
   batch. An experience handed out by get ``k`` is not eligible again before get ``k + cooldown +
   1`` (``cooldown=0``: eligible at the next get). With ``whole_groups=True``, an experience is not
   eligible while another experience of its ``group_id`` is still pending (an empty group_id is a
   group of its own), so group-based advantages always see the whole group.
4. **Order.** ``sampler="fifo"``: put order, oldest first; with ``max_staleness`` set, the rows of the
   oldest weights (lowest ``policy_version``) first, then put order, so rows one explorer put late are
   trained before they pass the bound (with one explorer the two orders are nearly the same; several
   explorer processes put in the order they finish, not the order they sampled in). ``sampler="priority"``: highest
   ``priority = policy_version - use_count * reuse_decay`` first (fresher and less-used first),
   ties in put order. With ``whole_groups=True`` the members of a group are placed together, the
   groups in the order of their first member; a group is split only by the end of a batch.
5. **Take.** ``get(n)`` takes the first ``n`` eligible experiences in that order, or nothing (it
   waits, then raises ``BufferTimeout``). Each taken experience's ``use_count`` grows by one; when
   it reaches ``reuse_limit`` the experience is consumed for good, otherwise it stays for replay.
   FIFO hands each experience out exactly once (``reuse_limit`` must be 1).

**Explored batches.** Every ``put`` records one explored batch (its size; ``put([])`` an empty
one). ``get(None, ...)`` takes the oldest batch record not taken yet and then follows the steps
above exactly as ``get(size of that put, ...)`` would (same experiences, same metrics, same
waiting); the record is taken only together with the experiences (an empty batch gives ``[]`` at
once), so a timeout consumes nothing. With no record waiting, ``get(None)`` waits for a ``put`` and
then raises ``BufferTimeout``. An integer ``n`` leaves the records alone; ``batches_waiting()``
counts them. Batch records are not a ``buffer/*`` metric.

Metrics: ``buffer/size`` (trainable, not yet consumed), ``buffer/pending``,
``buffer/dropped_stale``, ``buffer/pending_expired`` (when ``pending_timeout`` is set),
``buffer/reuse`` (priority sampler: mean ``use_count``, this hand-out included, of the last get's
experiences) and ``buffer/staleness_mean`` / ``buffer/staleness_max`` (``current_version -
policy_version`` over the last get's experiences, when it was given ``current_version``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from pydantic import ConfigDict, model_validator

from trine.config.learn import BufferRules

T = TypeVar("T")


class SamplingRules(BufferRules):
    """The validated sampling rules of a buffer, one typed value that every storage takes.

    The fields are declared once, with their ``buffer`` config keys, by :class:`~trine.config.BufferRules`
    (types, ranges, defaults, docs); this class adds what the storages ask of them. The order they apply
    in is in the module docstring.
    """

    model_config = ConfigDict(frozen=True)

    @model_validator(mode="after")
    def _replay_needs_priority(self) -> SamplingRules:
        if self.reuse_limit > 1 and self.sampler != "priority":
            raise ValueError(
                f"buffer reuse_limit={self.reuse_limit} needs sampler='priority' (FIFO hands each "
                "experience out exactly once); set sampler: priority or reuse_limit: 1."
            )
        return self

    @classmethod
    def from_section(cls, section: BufferRules) -> SamplingRules:
        """The rules of the ``buffer`` config section (every :class:`~trine.config.BufferRules` field)."""
        return cls(**{name: getattr(section, name) for name in BufferRules.model_fields})

    @property
    def replay(self) -> bool:
        """True for the priority sampler (use counts, cooldown and ``buffer/reuse`` apply)."""
        return self.sampler == "priority"

    @property
    def oldest_weights_first(self) -> bool:
        """FIFO under a staleness bound hands out the rows of the oldest weights first (then in put order):
        rows that a slower explorer put late would otherwise wait behind newer ones until they pass the
        bound and are dropped (and explored again)."""
        return not self.replay and self.max_staleness is not None

    def floor(self, min_version: int | None, current_version: int | None) -> int | None:
        """The staleness floor: versions below it are dropped (None: no bound)."""
        bounds = [] if min_version is None else [min_version]
        if current_version is not None and self.max_staleness is not None:
            bounds.append(current_version - self.max_staleness)
        return max(bounds) if bounds else None

    def priority(self, policy_version: int, use_count: int) -> float:
        """``policy_version - use_count * reuse_decay`` (higher is handed out first)."""
        return policy_version - use_count * float(self.reuse_decay)

    def cooled_down(self, last_get: int | None, next_get: int) -> bool:
        """Whether an experience last handed out by get ``last_get`` may go out in get ``next_get``."""
        return last_get is None or last_get + self.cooldown < next_get

    def expiry_cutoff(self, now: float) -> float | None:
        """Pending experiences put before this clock time have expired (None: never)."""
        return None if self.pending_timeout is None else now - self.pending_timeout

    @property
    def expired_reward(self) -> float | None:
        """The reward an expired pending experience gets (None: it is dropped)."""
        return float(self.default_reward) if self.pending_action == "default" else None


def arrange(ordered: Sequence[T], n: int, group_of: Callable[[T], str] | None = None) -> list[T] | None:
    """The first ``n`` of ``ordered`` (None if fewer), members of a group placed together first.

    With ``group_of``, each group's members follow its first member, the groups keeping the order
    of their first members; without it the order is kept as is.
    """
    items = list(ordered)
    if group_of is not None:
        groups: dict[str, list[T]] = {}
        for item in items:
            groups.setdefault(group_of(item), []).append(item)
        items = [item for members in groups.values() for item in members]
    return items[:n] if len(items) >= n else None


def batch_metrics(
    rules: SamplingRules, use_counts: Sequence[int], versions: Sequence[int], current_version: int | None
) -> dict[str, float]:
    """``buffer/reuse`` and ``buffer/staleness_*`` of one handed-out batch (see the module docstring)."""
    out: dict[str, float] = {}
    if rules.replay and use_counts:
        out["buffer/reuse"] = sum(use_counts) / len(use_counts)
    if current_version is not None and versions:
        lag = [current_version - v for v in versions]
        out["buffer/staleness_mean"] = sum(lag) / len(lag)
        out["buffer/staleness_max"] = float(max(lag))
    return out
