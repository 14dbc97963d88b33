"""The Buffer protocol: the explorer puts experiences in, the trainer gets them out.

Every ``put`` also records one *explored batch* (its size), so the trainer can ask for "the next
explored batch, whole" with ``get(None)`` instead of keeping a ledger of what was put beside the
buffer; the storages keep these batch records across processes (SQL) and across a resume
(``state_dict`` / ``load_state_dict``).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from trine.types import Experience


class BufferTimeout(TimeoutError):
    """Raised by ``Buffer.get`` when too few trainable experiences (or no explored batch) arrived in time."""


@runtime_checkable
class Buffer(Protocol):
    def put(self, experiences: list[Experience]) -> None:
        """Store experiences (those with ``reward=None`` wait as pending) and record them as one
        explored batch of ``len(experiences)`` (``put([])`` records an empty batch: every task of
        that explored batch was skipped or filtered out)."""

    def get(
        self,
        n: int | None,
        *,
        min_version: int | None = None,
        current_version: int | None = None,
        timeout: float | None = None,
    ) -> list[Experience]:
        """Take ``n`` trainable experiences (FIFO: oldest first; rules in :mod:`trine.buffer.sampling`).

        Experiences whose ``policy_version`` is below ``min_version`` (or below ``current_version -
        max_staleness``) are dropped as stale (and counted). Blocks up to ``timeout`` seconds (None
        = forever) and raises :class:`BufferTimeout` if fewer than ``n`` arrived; nothing is
        consumed in that case. ``n <= 0`` raises ``ValueError``.

        ``n=None`` takes the next explored batch whole: the oldest batch record not taken yet is
        taken and the call returns exactly what ``get(size of that put, ...)`` would (``[]`` at
        once for an empty batch); on timeout the batch record is not taken either. With no batch
        record waiting it waits for a ``put`` and then raises :class:`BufferTimeout`. An integer
        ``n`` leaves the batch records alone.
        """

    def set_rewards(self, rewards: dict[Any, float]) -> int:
        """Fill pending rewards by experience id or ``(task_id, run_id)``; returns how many were filled."""

    def batches_waiting(self) -> int:
        """Explored batches (one per ``put``) not taken by ``get(None)`` yet."""

    def metrics(self) -> dict[str, float]:
        """``buffer/*`` metrics: size, pending, dropped and expired counts, reuse, staleness."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...
