"""A trainer process with several ranks (``torchrun --nproc-per-node N trine train CONFIG``): what rank 0
does for all of them.

Every rank runs the same trainer loop (:mod:`trine.trainer.ranks`), but only rank 0 touches the run's
shared state: it takes each batch from the buffer and hands the same experiences to every rank
(:class:`RankedBuffer`, one ``broadcast_object_list`` per take, including "nothing arrived yet"), and it
alone sends the weights to the explorers. The other ranks still join the collective gathers a weight
push makes (:class:`GatherOnly`), so the shards meet in the same order on every rank.
"""

from __future__ import annotations

from typing import Any

from trine.buffer import BufferTimeout
from trine.types import Experience


class RankedBuffer:
    """The trainer's view of the buffer on every rank: rank 0's ``buffer`` (None on the others)."""

    def __init__(self, buffer: Any, device: Any) -> None:
        self.buffer = buffer
        self.device = device

    def get(self, n: int | None, **kwargs: Any) -> list[Experience]:
        import torch.distributed as dist

        message: list[Any] = [None]
        if self.buffer is not None:
            try:
                message[0] = ("batch", self.buffer.get(n, **kwargs))
            except BufferTimeout as err:
                message[0] = ("timeout", str(err))
        dist.broadcast_object_list(message, src=0, device=self.device)
        kind, value = message[0]
        if kind == "timeout":
            raise BufferTimeout(value)
        return value

    def metrics(self) -> dict[str, float]:
        return self.buffer.metrics() if self.buffer is not None else {}

    def batches_waiting(self) -> int:
        return self.buffer.batches_waiting() if self.buffer is not None else 0

    def state_dict(self) -> dict[str, Any]:
        return self.buffer.state_dict() if self.buffer is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.buffer is not None:
            self.buffer.load_state_dict(state)

    def close(self) -> None:
        if self.buffer is not None:
            self.buffer.close()


class GatherOnly:
    """The weight sync of ranks other than 0: each push joins the gathers of the FSDP2 shards
    (:func:`trine.models.export.rollout_state_dict`) that rank 0's push makes, and sends nothing."""

    seconds = 0.0

    def push(self, model: Any, version: int) -> None:
        from trine.models.export import rollout_state_dict

        rollout_state_dict(model)

    def pull(self, engine: Any, version: int, timeout: float | None = None) -> None:
        raise RuntimeError("a trainer rank other than 0 sends no weights to an engine")

    def latest(self) -> int | None:
        return None

    def metrics(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass
