"""``trine run`` with ``cluster.backend: ray``: the driver.

It joins (or starts) a Ray cluster, checks and prints the resource plan (:mod:`trine.distributed.plan`),
reserves it as one placement group, starts the actors (:mod:`trine.distributed.actors`) and watches them:

- the trainer actor runs the loop (checkpoints, evaluation, status) and its end is the run's end: the
  driver prints the run's summary table last, as ``trine run`` does in the other modes;
- an explorer actor that dies (killed, out of memory, its node lost) or fails is started again in its
  bundle, up to ``cluster.max_explorer_restarts`` times; it continues after the last batch it put, so its
  unfinished batch is explored again and nothing is lost or put twice;
- a trainer actor that dies stops the run: the explorers are stopped, the status says ``failed`` with the
  error, and ``trine run`` again resumes from the last checkpoint.

Weights go from the trainer to the explorers by broadcast (``sync.method: broadcast``, the default under
Ray): the driver picks a free port on the trainer's node and gives every actor that address.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trine.config import RunConfig
from trine.distributed.actors import BufferWriter, ExplorerActor, TrainerActor
from trine.distributed.plan import ResourcePlan

POLL_SECONDS = 1.0


class ClusterError(ValueError):
    """The Ray cluster cannot run this config (missing ray, resources it can never grant)."""


def import_ray() -> Any:
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    try:
        import ray
    except ImportError:
        raise ClusterError(
            'cluster.backend: ray needs Ray: pip install -e ".[ray]" (or set cluster.backend: local)'
        ) from None
    return ray


def launch(stages: list[RunConfig], plugins: list[Path]) -> int:
    """Run ``stages`` (one async stage) on Ray; returns the exit code (0 finished or stopped, 1 failed)."""
    from trine.launch.processes import as_process

    cfg = as_process(stages, "run")
    ray = import_ray()
    started_here = _init(ray, cfg)
    driver: Driver | None = None
    try:
        plan = ResourcePlan.of(cfg.cluster, cfg.explorer.instances, sqlite=_sqlite(cfg))
        nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        problems = plan.problems(ray.cluster_resources(), nodes)
        if problems:
            raise ClusterError(
                "this run cannot be placed on the Ray cluster:\n" + "\n".join(f"- {p}" for p in problems)
            )
        group = _reserve(ray, plan, cfg.cluster.ready_timeout)
        nodes = _nodes_of(ray, group)
        print(plan.table(nodes), flush=True)
        driver = Driver(ray, cfg, group, [str(p.resolve()) for p in plugins], plan.writer, _local(nodes))
        return driver.run()
    finally:
        if started_here:
            ray.shutdown()  # the actors' last lines (their step lines) reach the console before the table
        if driver is not None and driver.summary is not None:
            from trine.monitor.summary import print_summary

            print_summary(driver.summary)  # as `trine run` ends in the other modes


def _init(ray: Any, cfg: RunConfig) -> bool:
    """Join ``cluster.address``, or start a local cluster; True when this process started it."""
    c = cfg.cluster
    if ray.is_initialized():
        return False
    common = {"include_dashboard": False, "namespace": "trine", "log_to_driver": True}
    if c.address is not None:
        ray.init(address=c.address, **common)
        return True  # disconnects only; the cluster stays
    # Ray starts its workers at nice 15 so that its own control processes stay responsive on a node it
    # owns; on a machine shared with other work (a laptop, a CI runner) they then get ~3% of a busy core
    # and a 12-second run took over 300. A local cluster is this run's own: its actors run at nice 0.
    os.environ.setdefault("RAY_worker_niceness", "0")
    ray.init(num_cpus=c.num_cpus or os.cpu_count(), num_gpus=c.num_gpus, **common)
    return True


def _sqlite(cfg: RunConfig) -> bool:
    url = cfg.buffer.url
    return url is None or url.startswith("sqlite")


def _reserve(ray: Any, plan: ResourcePlan, timeout: float) -> Any:
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group(plan.bundles(), strategy=plan.strategy)
    try:
        ray.get(group.ready(), timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        raise ClusterError(
            f"the Ray cluster did not grant the run's resources {plan.bundles()} (placement {plan.strategy}) "
            f"within {timeout:g}s; it has {ray.available_resources()} free. Free them, lower the cluster.* "
            "resources, or raise cluster.ready_timeout"
        ) from None
    return group


def _nodes_of(ray: Any, group: Any) -> dict[int, str]:
    """Each bundle's node: ``<ip> (<first 8 characters of its Ray node id>)`` (nodes may share an ip)."""
    from ray.util.placement_group import placement_group_table

    node_ip = {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in ray.nodes()}
    bundles = placement_group_table(group).get("bundles_to_node_id", {})
    return {int(i): f"{node_ip.get(node, '?')} ({str(node)[:8]})" for i, node in bundles.items()}


def _local(node_of_bundle: dict[int, str]) -> dict[int, int]:
    """For each bundle, how many of the run's bundles (one torch process each: a trainer rank or an
    explorer; the buffer writer runs no torch) are on its node: the share of that node's free cores
    ``num_threads: auto`` gives the bundle's actor (:mod:`trine.threads`)."""
    per_node = Counter(node_of_bundle.values())
    return {bundle: per_node[node] for bundle, node in node_of_bundle.items()}


@dataclass
class _Explorer:
    actor: Any
    ref: Any
    restarts: int = 0


@dataclass
class Driver:
    """Starts and watches the actors of one run (see the module docstring)."""

    ray: Any
    cfg: RunConfig
    group: Any
    plugins: list[str]
    with_writer: bool
    local: dict[int, int] = field(default_factory=dict)
    """Bundle -> the run's torch processes on its node (:func:`_local`; 1 where the node is not known)."""
    explorers: dict[int, _Explorer] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    """The run's summary, once the trainer returned it (printed by :func:`launch` at the very end)."""

    def run(self) -> int:
        ray, cfg = self.ray, self.cfg
        c = cfg.cluster
        trainers = [
            self._actor(TrainerActor, r, c.trainer_cpus, c.trainer_gpus) for r in range(c.trainer_ranks)
        ]
        node = ray.get(trainers[0].node.remote())
        if cfg.sync_method == "broadcast" and cfg.sync.address is None:
            sync = cfg.sync.model_copy(update={"address": f"{node['ip']}:{node['port']}"})
            self.cfg = cfg = cfg.model_copy(update={"sync": sync})
        self.writer = None
        if self.with_writer:
            self.writer = self._actor(BufferWriter, 0, cfg.cluster.buffer_cpus, 0, run_dir=str(_run_dir(cfg)))
        runs = [
            actor.run.remote([cfg], _rank_env(r, c.trainer_ranks, node) if c.trainer_ranks > 1 else None)
            for r, actor in enumerate(trainers)
        ]
        for i in range(cfg.explorer.instances):
            self._start_explorer(i)
        try:
            code = self._watch(runs)
        except KeyboardInterrupt:
            self._stop_all(trainers)
            self._status("stopped", reason="interrupted; run the same command again to resume")
            raise
        except BaseException as err:
            self._stop_all(trainers)
            self._status("failed", error=f"{type(err).__name__}: {err}; run again to resume")
            raise
        self._stop_all(trainers)
        return code

    def _actor(self, cls: type, bundle: int, cpus: float, gpus: float, **kwargs: Any) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=bundle
        )
        options: dict[str, Any] = {"num_cpus": cpus, "num_gpus": gpus, "scheduling_strategy": strategy}
        if cls is ExplorerActor:
            options["max_concurrency"] = 2  # run() and stop()
        remote = self.ray.remote(cls).options(**options)
        if cls is BufferWriter:
            return remote.remote([self.cfg], os.getcwd(), **kwargs)
        return remote.remote([self.cfg], os.getcwd(), self.plugins, self.local.get(bundle, 1))

    def _start_explorer(self, index: int) -> None:
        c = self.cfg.cluster
        actor = self._actor(ExplorerActor, c.trainer_ranks + index, c.explorer_cpus, c.explorer_gpus)
        ref = actor.run.remote(index, self.cfg.explorer.instances, self.writer)
        previous = self.explorers.get(index)
        self.explorers[index] = _Explorer(actor, ref, previous.restarts + 1 if previous else 0)

    def _watch(self, runs: list[Any]) -> int:
        """Until trainer rank 0 ends: restart explorers that die; a trainer rank that ends first ends the
        run (the other ranks would wait for it in their next collective)."""
        ray, run, others = self.ray, runs[0], list(runs[1:])
        while True:
            pending = [run, *others, *(e.ref for e in self.explorers.values() if e.ref is not None)]
            ready, _ = ray.wait(pending, num_returns=1, timeout=POLL_SECONDS)
            if not ready:
                continue
            if ready[0] == run:
                return self._trainer_ended(run)
            if ready[0] in others:
                rank = runs.index(ready[0])
                try:
                    ray.get(ready[0])
                except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as err:
                    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                    raise RuntimeError(f"trainer rank {rank} failed: {first}") from err
                others.remove(ready[0])  # finished its share: rank 0 ends the run
                continue
            index = next(i for i, e in self.explorers.items() if e.ref == ready[0])
            self._explorer_ended(index)

    def _trainer_ended(self, run: Any) -> int:
        try:
            summary = self.ray.get(run)
        except self.ray.exceptions.RayActorError as err:  # the process died: its status says running
            why = f"the trainer actor died: {str(err).splitlines()[0]}"
            self._status(
                "failed", error=f"{why}; run the same command again to resume from the last checkpoint"
            )
            print(f"error: {why}", flush=True)
            return 1
        except self.ray.exceptions.RayTaskError as err:  # it raised: the loop recorded the failure
            print(f"error: the trainer failed: {err}", flush=True)
            return 1
        self.summary = summary
        return 0

    def _explorer_ended(self, index: int) -> None:
        e = self.explorers[index]
        try:
            why = self.ray.get(e.ref)
        except (self.ray.exceptions.RayActorError, self.ray.exceptions.RayTaskError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            if e.restarts >= self.cfg.cluster.max_explorer_restarts:
                raise RuntimeError(
                    f"explorer {index} died {e.restarts + 1} times (cluster.max_explorer_restarts="
                    f"{self.cfg.cluster.max_explorer_restarts}); last: {first}"
                ) from err
            print(
                f"explorer {index} died ({first}); starting it again (restart {e.restarts + 1})", flush=True
            )
            with contextlib.suppress(Exception):
                self.ray.kill(e.actor)
            self._start_explorer(index)
            return
        print(f"explorer {index}: done ({why})", flush=True)
        e.ref = None

    def _stop_all(self, trainers: list[Any]) -> None:
        """Ask the explorers to stop (they finish the batch in flight), then end every actor."""
        ray = self.ray
        live = [e for e in self.explorers.values() if e.ref is not None]
        for e in live:
            with contextlib.suppress(Exception):
                e.actor.stop.remote()
        with contextlib.suppress(Exception):
            ray.wait([e.ref for e in live], num_returns=len(live), timeout=30)
        for actor in [*trainers, self.writer, *(e.actor for e in self.explorers.values())]:
            if actor is not None:
                with contextlib.suppress(Exception):
                    ray.kill(actor)

    def _status(self, state: str, **details: Any) -> None:
        """Record how the run ended in its status file, where this node sees the run directory."""
        from trine.status import read_status, write_status

        run_dir = _run_dir(self.cfg)
        with contextlib.suppress(OSError, ValueError):
            if read_status(run_dir).get("state") == "running":
                write_status(run_dir, state, ended_at=time.time(), **details)


def _run_dir(cfg: RunConfig) -> Path:
    return cfg.run_path.resolve()


def _rank_env(rank: int, ranks: int, leader: dict[str, Any]) -> dict[str, str]:
    """What torchrun would tell trainer rank ``rank`` of ``ranks``: Ray gives each actor its own GPU
    (``CUDA_VISIBLE_DEVICES``), so every rank's local device is 0; rank 0's node hosts the rendezvous."""
    return {
        "WORLD_SIZE": str(ranks),
        "RANK": str(rank),
        "LOCAL_RANK": "0",
        "MASTER_ADDR": str(leader["ip"]),
        "MASTER_PORT": str(leader["spare_port"]),
    }
