"""The resource plan of a Ray run: which actors it starts, what each reserves, and whether the cluster can
ever grant it (checked before anything starts, every problem at once).

The plan is one placement group: bundle 0 holds the trainer and the buffer writer (the writer writes the
run's SQLite file, so it lives where the trainer's run directory is), bundles 1..n one explorer each.
``cluster.placement`` picks the strategy: ``pack`` colocates bundles on as few nodes as fit, ``spread``
puts them on as many as possible.
"""

from __future__ import annotations

from dataclasses import dataclass

from trine.config import ClusterConfig

STRATEGIES = {
    "pack": "PACK",
    "spread": "SPREAD",
    "strict_pack": "STRICT_PACK",
    "strict_spread": "STRICT_SPREAD",
}


@dataclass(frozen=True)
class Role:
    """One kind of actor in the plan."""

    name: str
    count: int
    cpus: float
    gpus: float


@dataclass(frozen=True)
class ResourcePlan:
    """The actors of a Ray run and the placement-group bundles that reserve their resources."""

    roles: tuple[Role, ...]
    strategy: str
    writer: bool
    """A buffer writer actor runs beside the trainer (a SQLite buffer; with PostgreSQL every explorer
    writes to the database itself)."""
    explorer_resources: tuple[tuple[str, float], ...] = ()
    """Custom Ray resources of each explorer bundle (``cluster.explorer_resources``)."""

    @classmethod
    def of(cls, cluster: ClusterConfig, explorers: int, sqlite: bool) -> ResourcePlan:
        c = cluster
        roles = [Role("trainer", c.trainer_ranks, c.trainer_cpus, c.trainer_gpus)]
        if sqlite:
            roles.append(Role("buffer writer", 1, c.buffer_cpus, 0))
        roles.append(Role("explorer", explorers, c.explorer_cpus, c.explorer_gpus))
        return cls(tuple(roles), STRATEGIES[c.placement], sqlite, tuple(sorted(c.explorer_resources.items())))

    @property
    def trainer_ranks(self) -> int:
        return next(r.count for r in self.roles if r.name == "trainer")

    def bundles(self) -> list[dict[str, float]]:
        """Bundle 0: trainer rank 0 (+ writer); then one per other trainer rank, then one per explorer
        (explorer ``i`` in bundle ``trainer_ranks + i``)."""
        first = [r for r in self.roles if r.name != "explorer"]
        trainer = first[0]
        explorer = next(r for r in self.roles if r.name == "explorer")
        head = _resources(sum(r.cpus for r in first), sum(r.gpus for r in first))
        ranks = [_resources(trainer.cpus, trainer.gpus) for _ in range(trainer.count - 1)]
        each = {**_resources(explorer.cpus, explorer.gpus), **dict(self.explorer_resources)}
        return [head, *ranks] + [dict(each) for _ in range(explorer.count)]

    def totals(self) -> dict[str, float]:
        return {
            "CPU": sum(r.cpus * r.count for r in self.roles),
            "GPU": sum(r.gpus * r.count for r in self.roles),
        }

    def problems(self, cluster: dict[str, float], nodes: list[dict[str, float]]) -> list[str]:
        """Why the cluster (its total ``cluster`` resources and each node's) can never grant this plan."""
        out = []
        need = self.totals()
        for key, field in (("CPU", "cpus"), ("GPU", "gpus")):
            have = float(cluster.get(key, 0.0))
            if need[key] > have + 1e-9:
                asks = ", ".join(f"{r.count} × {r.name} {getattr(r, field):g}" for r in self.roles if r.count)
                out.append(
                    f"the run asks for {need[key]:g} {key}s ({asks}) but the Ray cluster has {have:g}; lower "
                    f"cluster.trainer_{field} / explorer_{field} (fractions are allowed) or explorer.instances, "
                    f"or add nodes with {key}s"
                )
        keys = {"CPU", "GPU", *(k for k, _ in self.explorer_resources)}
        biggest = {k: max((float(n.get(k, 0.0)) for n in nodes), default=0.0) for k in keys}
        for i, bundle in enumerate(self.bundles()):
            for key, amount in bundle.items():
                if key not in ("CPU", "GPU") and amount > biggest[key] + 1e-9:
                    out.append(
                        f"an explorer asks for {amount:g} of the custom resource {key!r} "
                        f"(cluster.explorer_resources), but no node offers {'it' if not biggest[key] else 'as much'}: "
                        f"start the explorer nodes with `ray start ... --resources='{{\"{key}\": N}}'`, or remove it"
                    )
                    break
                if amount > biggest[key] + 1e-9:
                    who = (
                        "the trainer (with the buffer writer)"
                        if i == 0
                        else "a trainer rank"
                        if i < self.trainer_ranks
                        else "an explorer"
                    )
                    out.append(
                        f"{who} asks for {amount:g} {key}s in one bundle, but the largest node has "
                        f"{biggest[key]:g}; one actor cannot span nodes: ask for at most {biggest[key]:g}"
                    )
                    break
        if self.strategy == "STRICT_SPREAD" and len(self.bundles()) > len(nodes):
            out.append(
                f"cluster.placement: strict_spread puts each of {len(self.bundles())} bundles on its own node, "
                f"but the cluster has {len(nodes)}; use spread, or add nodes"
            )
        return out

    def table(self, node_of_bundle: dict[int, str] | None = None) -> str:
        """The plan as text, printed at start: actor, count, CPUs and GPUs each, and node when placed."""
        node_of_bundle = node_of_bundle or {}
        rows = [("actor", "count", "CPUs each", "GPUs each", "node(s)")]
        for r in self.roles:
            if r.name == "explorer":
                nodes = sorted({node_of_bundle.get(self.trainer_ranks + i, "?") for i in range(r.count)})
            elif r.name == "trainer":
                nodes = sorted({node_of_bundle.get(i, "?") for i in range(r.count)})
            else:
                nodes = [node_of_bundle.get(0, "?")]
            rows.append((r.name, str(r.count), f"{r.cpus:g}", f"{r.gpus:g}", ", ".join(nodes)))
        need = self.totals()
        rows.append(("total", "", f"{need['CPU']:g}", f"{need['GPU']:g}", f"placement {self.strategy}"))
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
        return "\n".join(["resource plan (Ray):", *("  " + line for line in lines)])


def _resources(cpus: float, gpus: float) -> dict[str, float]:
    out = {"CPU": float(cpus)}
    if gpus:
        out["GPU"] = float(gpus)
    return out
