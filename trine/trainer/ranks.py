"""Trainer ranks: one trainer process per GPU, data-parallel over FSDP2 shards.

Under ``torchrun --nproc-per-node N`` every rank runs the same program on the same batches (SPMD) and
the :class:`~trine.trainer.Trainer` splits each optimizer step's micro-batches between the ranks:
rank ``r`` runs micro-batches ``r, r + N, ...``, padded with idle copies (their action mask all zero)
so every rank runs the same number of forward/backward passes (FSDP2's collectives must pair up).
The loss is normalised over the whole step before the split (:mod:`trine.algorithms.aggregation`),
and each rank back-propagates ``N ×`` its share, so FSDP2's average over the ranks is their sum: the
update equals the one-process update.

:func:`init_from_env` starts the process group torchrun describes (``WORLD_SIZE``, ``RANK``,
``LOCAL_RANK``, ``MASTER_ADDR`` / ``MASTER_PORT``): NCCL with each rank on ``cuda:LOCAL_RANK``, gloo
on CPU.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch
from torch import Tensor


def world() -> tuple[int, int]:
    """``(world size, rank)`` of the default process group; ``(1, 0)`` without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def launched_ranks() -> int:
    """How many trainer ranks torchrun started (``WORLD_SIZE``; 1 when not under torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_from_env(device: str) -> tuple[int, int]:
    """Join the process group torchrun set up (once); returns ``(world size, rank)``. ``device`` is
    the model's configured device: ``cuda`` ranks take ``cuda:LOCAL_RANK`` and NCCL, CPU ranks gloo."""
    import torch.distributed as dist

    if launched_ranks() > 1 and not dist.is_initialized():
        on_gpu = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
        if on_gpu:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if on_gpu else "gloo")
    return world()


def sum_across(value: Tensor, device: torch.device) -> Tensor:
    """``value`` summed over the ranks (returned on ``value``'s device; NCCL reduces on the GPU)."""
    import torch.distributed as dist

    moved = value.to(device)
    dist.all_reduce(moved)
    return moved.to(value.device)


def sum_floats(values: dict[str, float], device: torch.device) -> dict[str, float]:
    """Each float of ``values`` (same keys, same order on every rank) summed over the ranks."""
    if not values:
        return values
    total = sum_across(torch.tensor(list(values.values()), dtype=torch.float64), device)
    return dict(zip(values, total.tolist()))


def my_share(items: list[Any], size: int, rank: int, idle: Any) -> list[Any]:
    """Items ``rank, rank + size, ...`` of ``items``, padded with ``idle(items[0])`` to ``ceil(len / size)``
    (every rank gets the same count)."""
    share = items[rank::size]
    count = -(-len(items) // size)
    return share + [idle(items[0]) for _ in range(count - len(share))]


def idle_batch(batch: Any) -> Any:
    """A copy of a micro-batch that trains nothing: the same shapes, its action mask all zero."""
    return dataclasses.replace(
        batch, action_mask=torch.zeros_like(batch.action_mask), extras=dict(batch.extras)
    )


def rank_stages(stages: list[Any], part: str) -> list[Any]:
    """The stages this rank runs when torchrun started several trainer ranks (unchanged otherwise).

    Every rank runs the same program on the same data: ``mode: train`` reads its rows in the same
    seeded order on each; a trainer process (``part="trainer"``) gets each batch from rank 0
    (:class:`trine.trainer.ranked.RankedBuffer`). Rank 0 keeps the run directory; rank ``r`` writes its own under
    ``<run_dir>/ranks/<r>`` (metrics as jsonl only; checkpoints with its shard of the optimizer state),
    so nothing is written twice and every rank resumes from its own files."""
    count = launched_ranks()
    if count <= 1:
        return stages
    mode = "train" if part == "all" else "async"  # `trine run` of a supervised run, or `trine train`
    problems = [
        f"stage {s.stage!r}: "
        + ", ".join(
            ([] if s.trainer.fsdp else ["trainer.fsdp is false"])
            + ([] if s.mode == mode else [f"mode is {s.mode!r}"])
        )
        for s in stages
        if not s.trainer.fsdp or s.mode != mode
    ]
    if problems:
        raise ValueError(
            f"{count} trainer ranks (torchrun) shard the policy with FSDP2 and split each step between them; "
            "they run `trine run` on a supervised config (mode: train) or `trine train` on an async run of "
            f"explorer processes (mode: async, launch: processes), with trainer.fsdp: true: {'; '.join(problems)}"
        )
    from trine.config import MonitorConfig

    _, rank = init_from_env(stages[0].model.device)
    if rank == 0:
        return stages
    base = stages[0].run_path
    own = {"run_dir": str(base / "ranks" / str(rank)), "monitor": MonitorConfig(sinks=["jsonl"], plot=False)}
    return [s.model_copy(update=own) for s in stages]


def leader_checkpoint(path: str) -> str:
    """Where rank 0 wrote the weights of the checkpoint a follower resumes from: ``<run>/ranks/<r>/X`` →
    ``<run>/X`` (the model files are written once, by rank 0; a follower's checkpoint holds its own
    optimizer shard and loop state). Other paths are returned unchanged."""
    from pathlib import Path

    parts = Path(path).parts
    if "ranks" not in parts[:-1]:
        return path
    at = len(parts) - 1 - parts[::-1].index("ranks")
    return str(Path(*parts[:at], *parts[at + 2 :]))
