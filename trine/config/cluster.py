"""Config section ``cluster:``: where the processes of a run live (:mod:`trine.distributed`; re-exported by
:mod:`trine.config`).

``backend: local`` (the default) runs everything on this machine as ``launch`` says. ``backend: ray`` runs
the trainer, ``explorer.instances`` explorers and the buffer's writer as Ray actors on a Ray cluster — a
local one started for the run, or the one at ``address`` — driven by the ``trine run`` process.
"""

from __future__ import annotations

from typing import Literal

from pydantic import field_validator, model_validator

from trine.config.base import Count, NonNeg, NonNegInt, Positive, Section


class ClusterConfig(Section):
    """Where the trainer and the explorers run (``trine.distributed``)."""

    backend: Literal["local", "ray"] = "local"
    """``local``: this machine (threads or processes, as ``launch`` says); ``ray``: the trainer, the
    explorers and the buffer writer as Ray actors (mode ``async``; the explorer/trainer process layout of
    ``launch: processes``, with Ray placing, watching and restarting the processes)."""
    address: str | None = None
    """The Ray cluster to join: ``auto`` (the one ``ray start --head`` started on this machine), or
    ``<head-ip>:6379``. None: start a local cluster for this run and stop it at the end."""
    num_cpus: Count | None = None
    """CPUs of the local cluster started when ``address`` is None (None: all of this machine's)."""
    num_gpus: NonNegInt | None = None
    """GPUs of the local cluster started when ``address`` is None (None: all visible ones)."""
    trainer_cpus: Positive = 0.5
    """Ray CPUs the trainer actor reserves (fractions allowed: Ray's CPUs are a scheduling budget; the
    torch threads are ``num_threads``)."""
    trainer_ranks: Count = 1
    """Trainer actors: more than one shards the policy across them with FSDP2 (``trainer.fsdp: true``) and
    splits every step between them (:mod:`trine.trainer.ranks`), one GPU each."""
    trainer_gpus: NonNeg = 0
    """GPUs each trainer actor reserves (0: it trains on CPU; at most 1: more GPUs are more
    ``trainer_ranks``)."""
    explorer_cpus: Positive = 0.5
    """Ray CPUs each explorer actor reserves."""
    explorer_gpus: NonNeg = 0
    """GPUs each explorer actor reserves (a fraction such as 0.5 shares a GPU with the trainer when the
    placement packs them on one node)."""
    explorer_resources: dict[str, float] = {}
    """Custom Ray resources each explorer actor asks for, to place the explorers on the nodes that offer
    them: e.g. ``{explorer_node: 1}`` with ``ray start --address=... --resources='{"explorer_node": 8}'`` on
    the explorer machines."""
    explorer_dir: str | None = None
    """None: explorer actors keep their status, metrics and rollouts in the run directory
    (``explorers/<i>``), which every node must then see at the same path (one machine, or a shared file
    system). A path: each explorer actor keeps them under ``<explorer_dir>/<run name>/explorers/<i>`` on its
    own node and never touches the run directory: its tasks and puts go through the buffer writer (or
    PostgreSQL), its weights come by broadcast, and the driver watches it (needs ``sync.method:
    broadcast``)."""
    buffer_cpus: Positive = 0.1
    """Ray CPUs of the buffer writer actor (on the trainer's node: it writes the run's SQLite file)."""
    placement: Literal["pack", "spread", "strict_pack", "strict_spread"] = "pack"
    """How the placement group puts the trainer's and the explorers' bundles on nodes: ``pack`` on as few
    nodes as possible (colocated when they fit), ``spread`` over as many as possible; ``strict_*`` fail
    instead of falling back."""
    max_explorer_restarts: NonNegInt = 3
    """Times each explorer actor is started again after it dies; its unfinished batch is explored again
    (batches are put once each, so nothing is lost or duplicated). Past this the run stops, failed."""
    ready_timeout: Positive = 120.0
    """Seconds to wait for the cluster to grant the placement group before the run fails with the
    resources it asked for and the ones the cluster has."""

    @field_validator("trainer_gpus")
    @classmethod
    def _one_trainer_process(cls, v: float) -> float:
        if v > 1:
            raise ValueError(
                f"cluster.trainer_gpus: {v:g}: a trainer actor is one process on at most one GPU; for {v:g} GPUs "
                f"set trainer_gpus: 1 and trainer_ranks: {v:g} (with trainer.fsdp: true)"
            )
        return v

    @field_validator("explorer_resources")
    @classmethod
    def _custom_resources(cls, v: dict[str, float]) -> dict[str, float]:
        bad = {k: x for k, x in v.items() if k in ("CPU", "GPU", "memory") or x <= 0}
        if bad:
            raise ValueError(
                f"cluster.explorer_resources: {bad}: expected custom resource names (not CPU / GPU / memory: "
                "use explorer_cpus / explorer_gpus) with amounts > 0"
            )
        return v

    @model_validator(mode="after")
    def _ranks_on_ray(self) -> ClusterConfig:
        if (self.explorer_resources or self.explorer_dir is not None) and self.backend != "ray":
            raise ValueError(
                "cluster.explorer_resources / explorer_dir place explorer actors on Ray nodes (backend: ray); "
                "remove them, or set cluster.backend: ray"
            )
        if self.trainer_ranks > 1 and self.backend != "ray":
            raise ValueError(
                f"cluster.trainer_ranks: {self.trainer_ranks} starts trainer actors on Ray (backend: ray); on this "
                "machine start the ranks with `torchrun --nproc-per-node N -m trine.cli train CONFIG` instead"
            )
        return self
