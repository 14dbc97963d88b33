"""PNG training curves from a run directory's ``metrics.jsonl`` (``trine plot RUN_DIR``).

Matplotlib is imported lazily and used through ``matplotlib.figure.Figure`` (no pyplot, no global
backend switch), so plotting works headless and inside other programs. Noisy curves are drawn raw
(faint) with an exponential moving average on top; eval metrics are sparse and drawn as points.
When the metrics carry a ``"stage"`` field (``"sft"``, ``"grpo"``...), stage regions are shaded.
"""

from __future__ import annotations

import bisect
import fnmatch
import itertools
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trine.monitor.sinks import read_metrics

log = logging.getLogger(__name__)

Series = dict[str, tuple[list[float], list[float]]]  # key -> (steps, values), sorted by step


@dataclass
class Panel:
    """One axes: which metric keys (glob patterns) it shows and how."""

    name: str
    title: str
    ylabel: str
    keys: list[str]
    bands: dict[str, str] = field(default_factory=dict)
    """mean key -> std key: shade mean ± std where both are logged."""
    sparse: bool = False
    """Draw points joined by lines, no smoothing (eval runs every few steps)."""

    def matching(self, series: Series) -> list[str]:
        found: list[str] = []
        for pattern in self.keys:
            found += [k for k in sorted(fnmatch.filter(series, pattern)) if k not in found]
        return found


PANELS = [
    Panel(
        "reward",
        "Reward",
        "reward",
        ["explorer/reward_mean"],
        {"explorer/reward_mean": "explorer/reward_std"},
    ),
    Panel(
        "eval",
        "Eval accuracy",
        "accuracy",
        ["eval/*/accuracy", "eval/*/avg@*", "eval/*/pass@*"],
        sparse=True,
    ),
    Panel("loss", "Loss", "loss", ["trainer/loss"]),
    Panel("kl", "KL divergence", "kl", ["trainer/kl"]),
    Panel(
        "response_length",
        "Response length",
        "tokens",
        ["explorer/response_length_mean"],
        {"explorer/response_length_mean": "explorer/response_length_std"},
    ),
    Panel("entropy", "Entropy", "nats / token", ["trainer/entropy"]),
    Panel("clipfrac", "Clip fraction", "fraction", ["trainer/clipfrac"]),
    Panel("grad_norm", "Gradient norm", "norm", ["trainer/grad_norm"]),
    Panel("step_seconds", "Step time", "seconds", ["time/step_seconds"]),
]
FILES = {
    "reward.png": ["reward"],
    "eval_accuracy.png": ["eval"],
    "loss.png": ["loss", "kl"],
    "response_length.png": ["response_length"],
}
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
STAGE_COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]


def plot_run(run_dir: str | Path, smoothing: float = 0.8, dpi: int = 120) -> list[Path]:
    """Write PNG curves of ``run_dir/metrics.jsonl`` into ``run_dir/plots/``; return the paths written.

    Files: ``reward.png``, ``eval_accuracy.png``, ``loss.png`` (with KL when logged),
    ``response_length.png`` and ``overview.png`` (every available panel in one grid). A plot whose
    metrics were never logged is skipped (and the skip is logged). ``smoothing`` is the EMA weight
    in [0, 1) (0 = no smoothing line).
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(
            f"run directory {str(run_dir)!r} does not exist; pass the directory of a Trine run (runs/<name>)."
        )
    if not 0 <= smoothing < 1:
        raise ValueError(f"smoothing={smoothing}; expected an EMA weight in [0, 1), e.g. 0.8 (0 = off).")
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"no metrics file {str(path)!r}; plot_run needs the metrics.jsonl written by the 'jsonl' "
            f"monitor sink. Is {str(run_dir)!r} a Trine run directory with the jsonl sink enabled?"
        )
    records = read_metrics(path, drop_rewound=True)
    series = collect_series(records)
    stages = stage_regions(records)
    out_dir = run_dir / "plots"
    available = {p.name: p for p in PANELS if p.matching(series)}
    written: list[Path] = []
    for filename, names in FILES.items():
        panels = [available[n] for n in names if n in available]
        if not panels:
            wanted = [k for n in names for p in PANELS if p.name == n for k in p.keys]
            log.info("skipped %s: none of %s were logged", filename, wanted)
            continue
        fig = _figure((8.5, 4.2 * len(panels)), dpi)
        axes = [fig.add_subplot(len(panels), 1, i + 1) for i in range(len(panels))]
        for ax, panel in zip(axes, panels, strict=True):
            draw_panel(ax, panel, series, stages, smoothing)
        written.append(_save(fig, out_dir / filename, run_dir.name))
    if available:
        written.append(
            _overview(list(available.values()), series, stages, smoothing, dpi, out_dir, run_dir.name)
        )
    else:
        log.warning("no plottable metrics in %s; keys present: %s", path, sorted(series) or "none")
    log.info("wrote %s", ", ".join(str(p) for p in written) or "no plots")
    return written


def collect_series(records: list[dict[str, Any]]) -> Series:
    """Per numeric key, the (steps, values) it was logged at (last value wins per step; nulls skipped)."""
    points: dict[str, dict[float, float]] = {}
    for record in records:
        step = record.get("step")
        if not isinstance(step, (int, float)):
            continue
        for key, value in record.items():
            if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(value):
                points.setdefault(key, {})[step] = float(value)
    return {key: (sorted(p), [p[s] for s in sorted(p)]) for key, p in points.items()}


def stage_regions(records: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    """Consecutive runs of the ``"stage"`` field as (stage, start, end); boundaries fall between steps."""
    regions: list[list[Any]] = []  # [stage, first step, last step]
    rows = sorted(
        (r for r in records if isinstance(r.get("stage"), str) and isinstance(r.get("step"), (int, float))),
        key=lambda r: r["step"],
    )
    for record in rows:
        if regions and regions[-1][0] == record["stage"]:
            regions[-1][2] = record["step"]
        else:
            regions.append([record["stage"], record["step"], record["step"]])
    out = []
    for i, (stage, first, last) in enumerate(regions):
        start = (regions[i - 1][2] + first) / 2 if i > 0 else first
        end = (last + regions[i + 1][1]) / 2 if i + 1 < len(regions) else last
        out.append((stage, start, end))
    return out


def ema(values: list[float], weight: float) -> list[float]:
    """Debiased exponential moving average (as TensorBoard's smoothing): no pull towards 0 at the start."""
    out, running = [], 0.0
    for n, value in enumerate(values, start=1):
        running = weight * running + (1 - weight) * value
        out.append(running / (1 - weight**n))
    return out


def _stagewise_ema(steps: list[float], values: list[float], stages: list, weight: float) -> list[float]:
    """EMA restarted at each stage boundary, so one stage's level does not bleed into the next."""
    cuts = [start for _, start, _ in stages[1:]]
    segment = [bisect.bisect_left(cuts, step) for step in steps]  # how many boundaries lie before
    out: list[float] = []
    for _, group in itertools.groupby(range(len(values)), key=lambda i: segment[i]):
        indices = list(group)
        out += ema(values[indices[0] : indices[-1] + 1], weight)
    return out


def _short(key: str) -> str:
    parts = key.split("/")
    return "/".join(parts[1:]) if len(parts) > 1 else key


def draw_panel(ax: Any, panel: Panel, series: Series, stages: list, smoothing: float) -> None:
    """Draw one panel's curves, bands and stage regions on ``ax``."""
    from matplotlib.ticker import MaxNLocator

    for i, key in enumerate(panel.matching(series)):
        color = COLORS[i % len(COLORS)]
        steps, values = series[key]
        if panel.sparse:
            ax.plot(steps, values, "o-", color=color, label=_short(key), markersize=4, linewidth=1.2)
            continue
        if key in panel.bands and panel.bands[key] in series:
            _band(ax, steps, values, series[panel.bands[key]], color)
        if smoothing > 0 and len(values) >= 8:
            ax.plot(steps, values, color=color, alpha=0.3, linewidth=0.9)
            smooth = _stagewise_ema(steps, values, stages, smoothing)
            ax.plot(steps, smooth, color=color, linewidth=1.8, label=f"{_short(key)} (EMA)")
        else:
            ax.plot(
                steps, values, "o-" if len(values) < 30 else "-", color=color, markersize=3, label=_short(key)
            )
    _shade_stages(ax, stages)
    ax.set_title(panel.title, fontsize=11)
    ax.set_xlabel("step")
    ax.set_ylabel(panel.ylabel)
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best", framealpha=0.8)


def _band(ax: Any, steps: list, values: list, std: tuple[list, list], color: str) -> None:
    std_at = dict(zip(*std, strict=True))
    paired = [(s, v, std_at[s]) for s, v in zip(steps, values, strict=True) if s in std_at]
    if not paired:
        return
    xs = [p[0] for p in paired]
    ax.fill_between(
        xs,
        [p[1] - p[2] for p in paired],
        [p[1] + p[2] for p in paired],
        color=color,
        alpha=0.12,
        linewidth=0,
        label="± 1 std",
    )


def _shade_stages(ax: Any, stages: list[tuple[str, float, float]]) -> None:
    if not stages:
        return
    names = list(dict.fromkeys(s[0] for s in stages))
    for i, (stage, start, end) in enumerate(stages):
        color = STAGE_COLORS[names.index(stage) % len(STAGE_COLORS)]
        ax.axvspan(start, end, color=color, alpha=0.07, linewidth=0)
        if i > 0:
            ax.axvline(start, color="gray", linestyle="--", linewidth=0.8, alpha=0.7)
        ax.text(
            start,
            0.98,
            f" {stage}",
            transform=ax.get_xaxis_transform(),
            va="top",
            ha="left",
            fontsize=8,
            color=color,
            fontweight="bold",
        )


def _figure(size: tuple[float, float], dpi: int) -> Any:
    from matplotlib.figure import Figure

    return Figure(figsize=size, dpi=dpi, layout="constrained")


def _overview(
    panels: list[Panel],
    series: Series,
    stages: list,
    smoothing: float,
    dpi: int,
    out_dir: Path,
    run_name: str,
) -> Path:
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = _figure((5.2 * cols, 3.6 * rows), dpi)
    for i, panel in enumerate(panels):
        draw_panel(fig.add_subplot(rows, cols, i + 1), panel, series, stages, smoothing)
    return _save(fig, out_dir / "overview.png", run_name)


def _save(fig: Any, path: Path, run_name: str) -> Path:
    """Title the figure with the run name and write it as PNG."""
    fig.suptitle(f"run: {run_name}", fontsize=12, fontweight="bold")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
