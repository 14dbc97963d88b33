"""``plots/processes.png``: the trainer and each explorer process of a run on one wall-clock axis.

An async run as processes (``launch: processes``) writes the trainer's ``metrics.jsonl`` in the run
directory and each explorer's in ``explorers/<i>/``; every line carries ``time/unix`` (the jsonl sink of
a Trine run stamps it). Drawn against the seconds since the first line of any process, their pace and
the lag between them show at a glance: the trainer's ``trainer/version`` beside the version each
explorer explored with, and the rewards each saw.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from trine.monitor.figures import COLORS, figure, save
from trine.monitor.sinks import read_metrics

log = logging.getLogger(__name__)

TIME_KEY = "time/unix"

Curve = tuple[list[float], list[float]]  # (seconds since the run's first line, values)


@dataclass(frozen=True)
class TimePanel:
    """One axes: ``trainer_key`` from the trainer's metrics and ``explorer_key`` from each explorer's,
    against time."""

    title: str
    ylabel: str
    trainer_key: str
    explorer_key: str
    steps: bool = False
    """Draw as a staircase (a version holds until the next one)."""


TIME_PANELS = [
    TimePanel("Policy version", "version", "trainer/version", "explorer/version", steps=True),
    TimePanel("Reward", "reward", "explorer/reward_mean", "explorer/reward_mean"),
]


def process_records(run_dir: Path) -> dict[str, list[dict]]:
    """Each process's metrics records (``trainer``, ``explorer 0``, ...), rewound lines dropped."""
    found: dict[str, list[dict]] = {}
    if (run_dir / "metrics.jsonl").is_file():
        found["trainer"] = read_metrics(run_dir / "metrics.jsonl", drop_rewound=True)
    explorers = [p for p in (run_dir / "explorers").glob("*") if p.name.isdigit()]
    for path in sorted(explorers, key=lambda p: int(p.name)):
        if (path / "metrics.jsonl").is_file():
            found[f"explorer {path.name}"] = read_metrics(path / "metrics.jsonl", drop_rewound=True)
    return found


def time_curves(records: dict[str, list[dict]], panel: TimePanel, start: float) -> dict[str, Curve]:
    """Per process, ``panel``'s key against seconds since ``start`` (lines without a time skipped)."""
    out: dict[str, Curve] = {}
    for name, rows in records.items():
        key = panel.trainer_key if name == "trainer" else panel.explorer_key
        points = [
            (r[TIME_KEY] - start, float(r[key]))
            for r in rows
            if isinstance(r.get(TIME_KEY), (int, float)) and isinstance(r.get(key), (int, float))
        ]
        if points:
            points.sort()
            out[name] = ([p[0] for p in points], [p[1] for p in points])
    return out


def plot_processes(run_dir: str | Path, dpi: int = 120) -> Path | None:
    """Write ``run_dir/plots/processes.png`` (see the module docstring); None, and the reason logged,
    when no process logged a ``time/unix`` (a run from before timestamps) or none of the keys."""

    run_dir = Path(run_dir)
    records = process_records(run_dir)
    times = [
        r[TIME_KEY] for rows in records.values() for r in rows if isinstance(r.get(TIME_KEY), (int, float))
    ]
    if not times:
        log.info("skipped processes.png: no metrics line of %s carries %s", sorted(records), TIME_KEY)
        return None
    start = min(times)
    panels = [(p, time_curves(records, p, start)) for p in TIME_PANELS]
    panels = [(p, curves) for p, curves in panels if curves]
    if not panels:
        log.info("skipped processes.png: none of the processes logged a version or a reward")
        return None
    colors = {name: COLORS[i % len(COLORS)] for i, name in enumerate(records)}
    fig = figure((8.5, 3.8 * len(panels)), dpi)
    for i, (panel, curves) in enumerate(panels):
        ax = fig.add_subplot(len(panels), 1, i + 1)
        for name, (seconds, values) in curves.items():
            style = {"drawstyle": "steps-post"} if panel.steps else {"marker": "o", "markersize": 3}
            ax.plot(seconds, values, color=colors[name], label=name, linewidth=1.4, **style)
        ax.set_title(panel.title, fontsize=11)
        ax.set_xlabel("seconds since the run started")
        ax.set_ylabel(panel.ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="best", framealpha=0.8)
    return save(fig, run_dir / "plots" / "processes.png", run_dir.name)
