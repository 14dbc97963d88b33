"""The actors of a Ray run: the same objects ``trine train`` and ``trine explore`` run, in Ray workers.

- :class:`TrainerActor` runs the loop with the trainer side only (:func:`trine.launch.processes.train`):
  checkpoints, evaluation, metrics and the run's status, in the run directory on its node.
- :class:`ExplorerActor` runs one explorer (:func:`trine.launch.processes.explore`), which puts its batches
  through the buffer writer (or into PostgreSQL itself) and receives weights by broadcast.
- :class:`BufferWriter` owns the run's SQLite buffer for the explorers' puts; explorers see it through
  :class:`RemoteBuffer`, which has the methods an explorer process calls on its buffer (puts, and claims of the task ledger).

The classes are plain Python; :mod:`trine.distributed.launch` turns them into Ray actors (``ray.remote``),
so this module imports ray only where a method needs it.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any

from trine.config import RunConfig
from trine.types import Experience


def _enter(cwd: str, plugins: list[str], local: int = 1) -> None:
    """Prepare a worker process like the ``trine`` command would: the driver's working directory (when
    this node has it: relative paths in the config mean the same), the plugins, and how many of the run's
    actors share this node (``local``), whose free cores ``num_threads: auto`` divides among them when the
    run's code sets the torch threads (:func:`trine.threads.use_threads`)."""
    if Path(cwd).is_dir():
        os.chdir(cwd)
    from trine.registry import load_plugin
    from trine.threads import SHARE_ENV

    for plugin in plugins:
        load_plugin(Path(plugin))
    os.environ[SHARE_ENV] = str(local)  # this worker process is the actor's own


def node_info() -> dict[str, Any]:
    """This worker's node address, pid, and a free TCP port on the node (for the weight broadcast)."""
    import ray

    ip = ray.util.get_node_ip_address()
    with socket.socket() as a, socket.socket() as b:  # both held open: two different ports
        a.bind(("", 0))
        b.bind(("", 0))
        port, spare = a.getsockname()[1], b.getsockname()[1]
    node_id = ray.get_runtime_context().get_node_id()
    return {"ip": ip, "pid": os.getpid(), "port": port, "spare_port": spare, "node_id": node_id}


class TrainerActor:
    """The trainer process of the run, as an actor."""

    def __init__(self, stages: list[RunConfig], cwd: str, plugins: list[str], local: int = 1) -> None:
        _enter(cwd, plugins, local)
        self.stages = stages

    def node(self) -> dict[str, Any]:
        return node_info()

    def run(self, stages: list[RunConfig], ranks: dict[str, str] | None = None) -> dict[str, Any]:
        """Train the run (``stages``: as given at start, with the broadcast address the driver picked).
        ``ranks``: this actor's place among several trainer ranks, as torchrun would describe it
        (``WORLD_SIZE``, ``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``)."""
        from trine.launch.processes import train

        os.environ.update(ranks or {})
        return train(stages)


class ExplorerActor:
    """Explorer ``index`` of the run, as an actor; :meth:`stop` (from another thread of the actor) ends it."""

    def __init__(self, stages: list[RunConfig], cwd: str, plugins: list[str], local: int = 1) -> None:
        _enter(cwd, plugins, local)
        self.stages = stages
        self._stop = threading.Event()

    def node(self) -> dict[str, Any]:
        return node_info()

    def run(self, index: int, count: int, writer: Any = None) -> str:
        """Be explorer ``index`` of ``count`` until the run ends; returns why it stopped. With
        ``cluster.explorer_dir`` its files stay on its node (:func:`explorer_home`)."""
        from trine.launch.processes import explore

        buffer = RemoteBuffer(writer) if writer is not None else None
        home = explorer_home(self.stages[0], index)
        return explore(self.stages, index, count, stop=self._stop, buffer=buffer, home=home)

    def stop(self) -> None:
        self._stop.set()


def explorer_home(cfg: RunConfig, index: int) -> Path | None:
    """Where explorer ``index`` keeps its files when they stay on its node: ``<cluster.explorer_dir>/<run
    name>/explorers/<index>`` (None: in the run directory)."""
    if cfg.cluster.explorer_dir is None:
        return None
    return Path(cfg.cluster.explorer_dir).expanduser() / cfg.name / "explorers" / str(index)


class BufferWriter:
    """The run's SQL buffer, opened once on the trainer's node, taking the explorers' puts in order."""

    def __init__(self, stages: list[RunConfig], cwd: str, run_dir: str) -> None:
        _enter(cwd, [])
        from trine.buffer import open_buffer

        self.buffer = open_buffer(stages[0].buffer, Path(run_dir))
        self.cfg, self.run_dir, self.stream = stages[0], Path(run_dir), None

    def put(
        self, experiences: list[Experience], producer: str, producer_batch: int, claims: list[tuple[int, int]]
    ) -> None:
        self.buffer.put(experiences, producer=producer, producer_batch=producer_batch, claims=claims)

    def claim_tasks(self, owner: str, n: int, lease: float) -> list[Any]:
        """Claims from the ledger; new tasks come from the writer's own copy of the task stream, so an
        explorer on another node needs neither the taskset nor the run directory to pull work."""
        if self.stream is None:
            from trine.build import task_stream

            self.stream = task_stream(self.cfg, self.run_dir, "buffer-writer")
        return list(self.buffer.claim_tasks(owner, n, lease, self.stream))

    def renew_tasks(self, owner: str, claims: list[tuple[int, int]], lease: float) -> int:
        return int(self.buffer.renew_tasks(owner, claims, lease))

    def release_tasks(self, owner: str) -> int:
        return int(self.buffer.release_tasks(owner))

    def task_counts(self) -> dict[str, int]:
        return dict(self.buffer.task_counts())

    def produced(self, producer: str) -> int:
        return int(self.buffer.produced(producer))

    def metrics(self) -> dict[str, float]:
        return dict(self.buffer.metrics())

    def close(self) -> None:
        self.buffer.close()


class RemoteBuffer:
    """What an explorer process calls on its buffer, forwarded to the :class:`BufferWriter` actor."""

    def __init__(self, writer: Any) -> None:
        self.writer = writer

    def put(
        self, experiences: list[Experience], producer: str, producer_batch: int, claims: list[tuple[int, int]]
    ) -> None:
        import ray

        ray.get(self.writer.put.remote(experiences, producer, producer_batch, claims))

    def claim_tasks(self, owner: str, n: int, lease: float, stream: Any = None) -> list[Any]:
        """Claims through the writer (``stream`` is None here: the writer numbers the task stream)."""
        import ray

        return list(ray.get(self.writer.claim_tasks.remote(owner, n, lease)))

    def renew_tasks(self, owner: str, claims: list[tuple[int, int]], lease: float) -> int:
        import ray

        return int(ray.get(self.writer.renew_tasks.remote(owner, claims, lease)))

    def release_tasks(self, owner: str) -> int:
        import ray

        return int(ray.get(self.writer.release_tasks.remote(owner)))

    def task_counts(self) -> dict[str, int]:
        import ray

        return dict(ray.get(self.writer.task_counts.remote()))

    def produced(self, producer: str) -> int:
        import ray

        return int(ray.get(self.writer.produced.remote(producer)))

    def metrics(self) -> dict[str, float]:
        import ray

        return dict(ray.get(self.writer.metrics.remote()))

    def close(self) -> None:
        """The writer outlives its explorers (the driver closes it)."""
