"""The Buffer protocol: the explorer puts experiences in, the trainer gets them out."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from trine.types import Experience


class BufferTimeout(TimeoutError):
    """Raised by ``Buffer.get`` when not enough trainable experiences arrived in time."""


@runtime_checkable
class Buffer(Protocol):
    def put(self, experiences: list[Experience]) -> None:
        """Store experiences (those with ``reward=None`` wait as pending)."""

    def get(
        self,
        n: int,
        *,
        min_version: int | None = None,
        current_version: int | None = None,
        timeout: float | None = None,
    ) -> list[Experience]:
        """Take ``n`` trainable experiences (FIFO: oldest first; rules in :mod:`trine.buffer.sampling`).

        Experiences whose ``policy_version`` is below ``min_version`` (or below ``current_version -
        max_staleness``) are dropped as stale (and counted). Blocks up to ``timeout`` seconds (None
        = forever) and raises :class:`BufferTimeout` if fewer than ``n`` arrived; nothing is
        consumed in that case.
        """

    def metrics(self) -> dict[str, float]:
        """``buffer/*`` metrics: size, pending, dropped and expired counts, reuse, staleness."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def close(self) -> None: ...
