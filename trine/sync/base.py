"""The weight-sync protocol: how the trainer's new weights reach the explorer's rollout model.

The trainer side calls ``push(model, version)`` at sync points (every ``sync.sync_interval`` steps);
the explorer side calls ``pull(engine, version)`` before it explores a batch that needs ``version``.
``state_dict()`` / ``load_state_dict()`` carry what a checkpoint needs (e.g. pushed versions not yet
pulled), ``seconds`` the time spent moving weights (``sync/seconds``), and ``close()`` releases
any puller that waits.

Methods (``sync.method``, decided in one place: :attr:`trine.config.RunConfig.sync_method`):

- ``shared`` (:class:`~trine.sync.weights.SharedWeights`): colocated, the engine samples the
  trainer's own weights; nothing moves.
- ``copy`` (:class:`~trine.sync.weights.StateDictCopy`): in-process copies into a separate explorer
  model, for an explorer that runs ahead of the trainer.
- ``published`` (:class:`~trine.sync.published.PublishedWeights`): through a directory (in the run
  directory), for a trainer and explorers in separate processes: versions are published atomically
  (write, then rename) and loaded by each explorer; built as ``PublishedWeights(directory)``.
- ``broadcast`` (:class:`~trine.sync.broadcast.BroadcastSender` on the trainer,
  :class:`~trine.sync.broadcast.BroadcastReceiver` on each explorer): over torch.distributed process
  groups (gloo / NCCL), for processes on other machines (Ray).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from torch import nn

from trine.models.protocol import RolloutModel


@runtime_checkable
class WeightSync(Protocol):
    """Moves versioned weights from the trainer's model to a rollout model."""

    seconds: float
    """Seconds spent pushing and loading weights so far."""

    def push(self, model: nn.Module, version: int) -> None:
        """Publish ``model``'s current weights as ``version`` (trainer side)."""
        ...

    def pull(self, engine: RolloutModel, version: int, timeout: float | None = None) -> None:
        """Make ``engine`` sample ``version`` (explorer side), waiting up to ``timeout`` seconds for it."""
        ...

    def latest(self) -> int | None:
        """The newest version pushed and still available to pull (None: nothing pushed yet)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must keep (e.g. versions pushed but not yet pulled)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        ...

    def metrics(self) -> dict[str, float]:
        """``sync/*`` counters of the method for the step line ({} if it has none)."""
        ...

    def close(self) -> None:
        """Wake and release any ``pull`` that waits (the run is ending)."""
        ...
