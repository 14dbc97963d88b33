"""The plan of a stage: which wiring drives its roles and which launcher starts it, derived from the config
in one place (as :attr:`RunConfig.sync_method <trine.config.run.RunConfig.sync_method>` decides the
weight sync). Five keys decide it: ``mode``, ``sync.sync_offset``, ``tasks.source`` (the wiring) and
``launch``, ``cluster.backend`` (the launcher); the CLI verb and a replay source pick the rest.

| wiring | when | steps |
|---|---|---|
| ``sync`` | mode sync, ``sync_offset: 0`` | :mod:`trine.modes.sync` |
| ``offset`` | mode sync, ``sync_offset > 0`` | :mod:`trine.modes.offset` |
| ``async`` | mode async | :mod:`trine.modes.asynchronous` (the trainer-only half in a trainer process) |
| ``train`` | mode train (a taskset, or ``tasks.source: buffer``), or a replay | :mod:`trine.modes.train` |

| launcher | when | what starts the roles |
|---|---|---|
| ``inline`` | the default | :func:`trine.loop.run` in this process (explorer threads where the wiring has them) |
| ``processes`` | mode async, ``launch: processes`` | :func:`trine.launch.processes.launch`: ``trine train`` + ``trine explore`` × n |
| ``ray`` | ``cluster.backend: ray`` | :func:`trine.distributed.launch.launch`: the same processes as Ray actors |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from trine.config.run import RunConfig

Wiring = Literal["sync", "offset", "async", "train"]
Launcher = Literal["inline", "processes", "ray"]


@dataclass(frozen=True)
class Plan:
    """How a stage runs: its wiring of the roles and its launcher (see the module docstring)."""

    wiring: Wiring
    launcher: Launcher


def plan_of(cfg: RunConfig) -> Plan:
    """The plan of ``cfg`` (one stage's resolved config)."""
    if cfg.mode == "train":
        wiring: Wiring = "train"
    elif cfg.mode == "async":
        wiring = "async"
    else:
        wiring = "offset" if cfg.sync.sync_offset > 0 else "sync"
    if cfg.cluster.backend == "ray":
        launcher: Launcher = "ray"
    elif cfg.mode == "async" and cfg.launch == "processes":
        launcher = "processes"
    else:
        launcher = "inline"
    return Plan(wiring, launcher)
