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
  :class:`~trine.sync.broadcast.BroadcastReceiver` on each explorer): over one torch.distributed process
  group of the trainer and every explorer (gloo / NCCL; the trainer sends each version once, explorers
  forward it), for processes on other machines (Ray).
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from torch import Tensor, nn

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


def check_fits(engine: Any, state: dict[str, Tensor]) -> None:
    """RuntimeError naming the differences when ``state`` does not fit the engine's model (names and
    shapes), raised *before* anything is copied: ``load_state_dict`` would first copy every tensor that
    fits and leave the model half loaded. Engines without a local ``model`` are not checked."""
    model = getattr(engine, "model", None)
    if not isinstance(model, nn.Module):
        return
    own = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [
        f"{k} {list(v.shape)} vs {list(own[k])}"
        for k, v in state.items()
        if k in own and tuple(v.shape) != own[k]
    ]
    problems = [
        f"{what} ({len(keys)}): {', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}"
        for what, keys in (
            ("shapes differ, sent vs own", shapes),
            ("missing", missing),
            ("unexpected", unexpected),
        )
        if keys
    ]
    if problems:
        raise RuntimeError("; ".join(problems))


def split_aliases(state: dict[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, str]]:
    """(the distinct tensors of ``state``, {alias key: key it shares}): keys whose tensors are the same
    view of the same memory (tied weights, e.g. ``lm_head.weight`` and ``model.embed_tokens.weight``)
    travel and are stored once."""
    tensors: dict[str, Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for key, value in state.items():
        ident = (value.device, value.data_ptr(), value.dtype, tuple(value.shape), value.stride())
        if value.numel() > 0 and ident in seen:
            aliases[key] = seen[ident]
            continue
        seen[ident] = key
        tensors[key] = value
    return tensors, aliases
