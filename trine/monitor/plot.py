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

from trine.monitor.figures import COLORS, figure, save
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
    per_stage: bool = False
    """One axes per stage (an SFT loss of ~6 and a GRPO loss of ~0.01 need their own scales)."""
    drop_zero: bool = True
    """Leave out curves that are zero at every step (e.g. clipfrac of one update per batch): noise.
    Off for reward and accuracy, where zero is a result."""
    band_limits: Any = None
    """``(low, high)`` (None = open) the std bands are clipped to, or a function of the series giving it."""

    def matching(self, series: Series) -> list[str]:
        found: list[str] = []
        for pattern in self.keys:
            found += [k for k in sorted(fnmatch.filter(series, pattern)) if k not in found]
        return found


def reward_range(series: Series) -> tuple[float | None, float | None]:
    """The range a reward's std band may cover: the logged ``explorer/reward_min``/``_max`` when there
    are any, [0, 1] when every mean lies in it (accuracy-like rewards), else open."""
    lows, highs = series.get("explorer/reward_min"), series.get("explorer/reward_max")
    if lows and highs:
        return min(lows[1]), max(highs[1])
    means = series.get("explorer/reward_mean", ([], []))[1]
    if means and all(0.0 <= m <= 1.0 for m in means):
        return 0.0, 1.0
    return None, None


PANELS = [
    Panel(
        "reward",
        "Reward",
        "reward",
        ["explorer/reward_mean"],
        {"explorer/reward_mean": "explorer/reward_std"},
        drop_zero=False,
        band_limits=reward_range,
    ),
    Panel(
        "eval",
        "Eval accuracy",
        "accuracy",
        ["eval/*/accuracy", "eval/*/avg@*", "eval/*/pass@*"],
        sparse=True,
        drop_zero=False,
    ),
    Panel("loss", "Loss", "loss", ["trainer/loss"], per_stage=True),
    Panel("kl", "KL divergence", "kl", ["trainer/kl"], per_stage=True),
    Panel(
        "response_length",
        "Response length",
        "tokens",
        ["explorer/response_length_mean"],
        {"explorer/response_length_mean": "explorer/response_length_std"},
        band_limits=(0.0, None),
    ),
    Panel("entropy", "Entropy", "nats / token", ["trainer/entropy"], per_stage=True),
    Panel("clipfrac", "Clip fraction", "fraction", ["trainer/clipfrac"]),
    Panel("grad_norm", "Gradient norm", "norm", ["trainer/grad_norm"], per_stage=True),
    Panel("step_seconds", "Step time", "seconds", ["time/step_seconds"]),
]


@dataclass
class View:
    """One axes to draw: a panel's curves (maybe one stage's part of them) and its title."""

    panel: Panel
    title: str
    series: Series
    stages: list[tuple[str, float, float]]
    band_limits: tuple[float | None, float | None] = (None, None)
    stage_names: list[str] | None = None
    """Every stage of the run in order (keeps each stage's colour when a view shows one stage)."""


def _zero(values: list[float]) -> bool:
    return all(v == 0 for v in values)


def _within(points: tuple[list[float], list[float]], start: float, end: float) -> tuple[list, list]:
    pairs = [(s, v) for s, v in zip(*points) if start <= s <= end]
    return [s for s, _ in pairs], [v for _, v in pairs]


def panel_views(panel: Panel, series: Series, stages: list[tuple[str, float, float]]) -> list[View]:
    """The axes ``panel`` needs for this run: none when nothing (or only zeros, if ``drop_zero``) was
    logged, one per stage for a ``per_stage`` panel of a run with several stages, else one."""
    keys = [k for k in panel.matching(series) if not (panel.drop_zero and _zero(series[k][1]))]
    if not keys:
        return []
    limits = panel.band_limits(series) if callable(panel.band_limits) else panel.band_limits
    own = {k: series[k] for k in keys}
    own.update({panel.bands[k]: series[panel.bands[k]] for k in keys if panel.bands.get(k) in series})
    if not panel.per_stage or len({name for name, _, _ in stages}) < 2:
        return [View(panel, panel.title, own, stages, limits or (None, None))]
    views = []
    for region in stages:
        part = {k: _within(v, region[1], region[2]) for k, v in own.items()}
        if any(part[k][0] and not (panel.drop_zero and _zero(part[k][1])) for k in keys):
            title, names = f"{panel.title}: {region[0]}", [name for name, _, _ in stages]
            views.append(View(panel, title, part, [region], limits or (None, None), names))
    return views


FILES = {
    "reward.png": ["reward"],
    "eval_accuracy.png": ["eval"],
    "loss.png": ["loss", "kl"],
    "response_length.png": ["response_length"],
}
STAGE_COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]


def plot_run(run_dir: str | Path, smoothing: float = 0.8, dpi: int = 120) -> list[Path]:
    """Write PNG curves of ``run_dir/metrics.jsonl`` into ``run_dir/plots/``; return the paths written.

    Files: ``reward.png``, ``eval_accuracy.png``, ``loss.png`` (with KL when logged),
    ``response_length.png`` and ``overview.png`` (every available panel in one grid). A plot whose
    metrics were never logged is skipped (and the skip is logged), so is a curve that is zero at every
    step (except reward and accuracy). In a run of several stages, losses, KL, entropy and gradient
    norms get one axes per stage (their scales differ by orders of magnitude). Std bands are clipped
    to the metric's range (see :func:`reward_range`). ``smoothing`` is the EMA weight in [0, 1)
    (0 = no smoothing line). A run with explorer processes (``explorers/``) also gets ``processes.png``:
    each process's version and reward on one wall-clock axis (:mod:`trine.monitor.process_plot`).
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
    views = {p.name: panel_views(p, series, stages) for p in PANELS}
    written: list[Path] = []
    for filename, names in FILES.items():
        chosen = [v for n in names for v in views[n]]
        if not chosen:
            wanted = [k for n in names for p in PANELS if p.name == n for k in p.keys]
            log.info("skipped %s: none of %s were logged (or all were zero)", filename, wanted)
            continue
        fig = figure((8.5, 4.2 * len(chosen)), dpi)
        for i, view in enumerate(chosen):
            draw_view(fig.add_subplot(len(chosen), 1, i + 1), view, smoothing)
        written.append(save(fig, out_dir / filename, run_dir.name))
    every = [v for p in PANELS for v in views[p.name]]
    if every:
        written.append(_overview(every, smoothing, dpi, out_dir, run_dir.name))
    else:
        log.warning("no plottable metrics in %s; keys present: %s", path, sorted(series) or "none")
    if (run_dir / "explorers").is_dir():
        from trine.monitor.process_plot import plot_processes

        processes = plot_processes(run_dir, dpi)
        written += [processes] if processes is not None else []
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
    """Consecutive runs of the ``"stage"`` field as (stage, start, end); boundaries fall between steps.

    A boundary lies half a step after the last step of the earlier stage: a record's ``stage_start``
    (the global step its stage began after, which ``bench.jsonl`` lines carry) says where that is;
    without it, half-way between the last record of one stage and the first of the next (exact for
    ``metrics.jsonl``, one line per step; a guess for sparse records such as checkpoints)."""
    regions: list[list[Any]] = []  # [stage, first step, last step, stage_start or None]
    rows = sorted(
        (r for r in records if isinstance(r.get("stage"), str) and isinstance(r.get("step"), (int, float))),
        key=lambda r: r["step"],
    )
    for record in rows:
        began = record.get("stage_start")
        began = began if isinstance(began, (int, float)) and not isinstance(began, bool) else None
        if regions and regions[-1][0] == record["stage"]:
            regions[-1][2] = record["step"]
            regions[-1][3] = began if regions[-1][3] is None else regions[-1][3]
        elif regions and regions[-1][2] == record["step"]:
            continue  # the next stage's start-of-stage eval, logged at the previous stage's last step
        else:
            regions.append([record["stage"], record["step"], record["step"], began])
    cuts = []  # cuts[i]: the boundary between regions i and i + 1
    for before, after in itertools.pairwise(regions):
        known = after[3] is not None and before[2] <= after[3] + 0.5 <= after[1]
        cuts.append(after[3] + 0.5 if known else (before[2] + after[1]) / 2)
    return [
        (stage, cuts[i - 1] if i > 0 else first, cuts[i] if i < len(cuts) else last)
        for i, (stage, first, last, _) in enumerate(regions)
    ]


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
    """Draw one panel's curves, bands and stage regions on ``ax`` (all of the run on one axes)."""
    draw_view(ax, View(panel, panel.title, series, stages), smoothing)


def draw_view(ax: Any, view: View, smoothing: float) -> None:
    """Draw one view's curves, bands (clipped to its limits) and stage regions on ``ax``."""
    from matplotlib.ticker import MaxNLocator

    panel, series, stages = view.panel, view.series, view.stages
    for i, key in enumerate(panel.matching(series)):
        color = COLORS[i % len(COLORS)]
        steps, values = series[key]
        if panel.sparse:
            ax.plot(steps, values, "o-", color=color, label=_short(key), markersize=4, linewidth=1.2)
            continue
        if key in panel.bands and panel.bands[key] in series:
            _band(ax, steps, values, series[panel.bands[key]], color, view.band_limits)
        if smoothing > 0 and len(values) >= 8:
            ax.plot(steps, values, color=color, alpha=0.3, linewidth=0.9)
            smooth = _stagewise_ema(steps, values, stages, smoothing)
            ax.plot(steps, smooth, color=color, linewidth=1.8, label=f"{_short(key)} (EMA)")
        else:
            ax.plot(
                steps, values, "o-" if len(values) < 30 else "-", color=color, markersize=3, label=_short(key)
            )
    _shade_stages(ax, stages, view.stage_names)
    ax.set_title(view.title, fontsize=11)
    ax.set_xlabel("step")
    ax.set_ylabel(panel.ylabel)
    ax.grid(True, alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best", framealpha=0.8)


def _band(
    ax: Any, steps: list, values: list, std: tuple[list, list], color: str, limits: tuple = (None, None)
) -> None:
    """Shade mean ± std, clipped to ``limits`` (a 0-1 reward's band stays inside [0, 1])."""
    std_at = dict(zip(*std, strict=True))
    paired = [(s, v, std_at[s]) for s, v in zip(steps, values, strict=True) if s in std_at]
    if not paired:
        return
    low, high = (
        (-math.inf if limits[0] is None else limits[0]),
        (math.inf if limits[1] is None else limits[1]),
    )
    xs = [p[0] for p in paired]
    ax.fill_between(
        xs,
        [max(low, p[1] - p[2]) for p in paired],
        [min(high, p[1] + p[2]) for p in paired],
        color=color,
        alpha=0.12,
        linewidth=0,
        label="± 1 std",
    )


def _shade_stages(ax: Any, stages: list[tuple[str, float, float]], names: list[str] | None = None) -> None:
    if not stages:
        return
    names = list(dict.fromkeys(names or [s[0] for s in stages]))
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


def _overview(views: list[View], smoothing: float, dpi: int, out_dir: Path, run_name: str) -> Path:
    cols = min(3, len(views))
    rows = math.ceil(len(views) / cols)
    fig = figure((5.2 * cols, 3.6 * rows), dpi)
    for i, view in enumerate(views):
        draw_view(fig.add_subplot(rows, cols, i + 1), view, smoothing)
    return save(fig, out_dir / "overview.png", run_name)
