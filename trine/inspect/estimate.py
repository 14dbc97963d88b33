"""``trine plan``'s arithmetic: from a few measured steps to the whole run's wall-clock (pure functions).

:mod:`trine.inspect.measure` runs each stage's real roles for a few steps in a temporary directory and
hands over what each cost took, each time it was paid; this module turns those samples into the run's
estimate, with the same cadence :mod:`trine.loop` follows:

- a stage costs its build, its warm-up steps (measured whole: first calls, an async explorer's ramp-up),
  ``(total_steps - warm-up) × step`` (a step is everything the loop does per step: sampling and reward,
  the training step, weight sync, logging), ``evaluations × evaluation`` and ``checkpoints × checkpoint``;
- the run costs its start-up (Python, imports, config and data checks, the model load or build), every
  stage, and its end (the monitor closed, the plots drawn).

Every cost is a :class:`Spread`: the typical value (the median of what was measured) and the lowest and
highest seen; a total multiplies the three by how often the run pays the cost, so the range of the
wall-clock is what the measured spread would give if it held for the whole run. Breakdown rows (sampling,
reward, training, weight sync: parts of a step) are shown but not added again.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Spread:
    """A measured cost: its typical value (the median) and the lowest and highest value seen."""

    mid: float
    low: float
    high: float
    samples: int = 1
    """How many measurements it comes from."""

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        """The median, minimum and maximum of ``values`` (none: zero, from no sample)."""
        if not values:
            return cls(0.0, 0.0, 0.0, 0)
        return cls(statistics.median(values), min(values), max(values), len(values))

    @classmethod
    def exact(cls, value: float) -> Spread:
        """One measurement."""
        return cls(value, value, value, 1)

    def times(self, k: float) -> Spread:
        return Spread(self.mid * k, self.low * k, self.high * k, self.samples)

    def plus(self, other: Spread) -> Spread:
        return Spread(
            self.mid + other.mid,
            self.low + other.low,
            self.high + other.high,
            min(self.samples, other.samples),
        )


ZERO = Spread(0.0, 0.0, 0.0, 0)


def total(spreads: Sequence[Spread]) -> Spread:
    """The sum of ``spreads`` (typical values add, and so do the ends of the ranges)."""
    if not spreads:
        return ZERO
    out = spreads[0]
    for s in spreads[1:]:
        out = out.plus(s)
    return out


def per_step(seconds: Sequence[float], period: int = 1) -> Spread:
    """The cost of one step from consecutive steps' ``seconds``. With ``period`` k > 1 (``sync_interval``:
    one step explores k batches, the next k - 1 only train) whole periods are summed and divided by k, so
    the typical step is the period's mean; a trailing partial period is left out (kept when no period is
    whole)."""
    if period <= 1 or len(seconds) < period:
        return Spread.of(seconds)
    whole = len(seconds) // period * period
    sums = [sum(seconds[i : i + period]) / period for i in range(0, whole, period)]
    return Spread.of(sums)


class PlanError(ValueError):
    """A config ``trine plan`` cannot measure (a Ray cluster, tasks brought by agents or a stored buffer),
    or processes that failed while it measured them."""


@dataclass(frozen=True)
class Options:
    """How much ``trine plan`` measures."""

    steps: int = 3
    """Steps measured per stage after the warm-up."""
    warmup: int | None = None
    """Warm-up steps per stage (None: :func:`warmup_steps`)."""
    min_seconds: float = 3.0
    """Keep measuring a stage's steps until this many seconds (at most ``max_steps`` steps)."""
    eval_tasks: int = 0
    """Evaluate at most this many tasks per eval taskset and scale the time up (0: the whole pass)."""
    max_steps: int = 200
    """Most steps measured per stage, whatever ``min_seconds`` asks."""


def warmup_steps(wiring: str, max_staleness: int | None, given: int | None = None) -> int:
    """Steps timed whole before the measured ones: ``given``, else 1, and for the ``async`` wiring 1 +
    ``buffer.max_staleness`` (2 when unbounded): the explorer's head start, which makes the first steps
    of an async run faster than the rest; at most 5."""
    if given is not None:
        return given
    if wiring == "async":
        return 1 + min(max_staleness if max_staleness is not None else 2, 4)
    return 1


def enough(measured: Sequence[float], options: Options) -> bool:
    """Whether a stage's measured step seconds suffice: ``options.steps`` of them and ``min_seconds`` in
    all, or ``max_steps``."""
    if len(measured) >= options.max_steps:
        return True
    return len(measured) >= options.steps and sum(measured) >= options.min_seconds


def increments(cumulative: Sequence[float]) -> list[float]:
    """Per-step amounts of a running total logged every step (``sync/seconds``: the seconds spent moving
    weights so far): the differences between consecutive values (none below zero)."""
    return [max(b - a, 0.0) for a, b in zip(cumulative, cumulative[1:])]


def eval_count(total_steps: int, every: int, at_start: bool, start_reused: bool = False) -> int:
    """Evaluations :func:`trine.loop._run_stage` runs in a stage of ``total_steps``: one at the start
    (``eval.at_start``, unless the previous stage's last one is reused: same weights, same settings), one
    every ``every`` steps, and one at the last step (once, when it falls on the cadence)."""
    n = 1 if at_start and not start_reused else 0
    if total_steps <= 0:
        return n
    if every:
        return n + total_steps // every + (1 if total_steps % every else 0)
    return n + 1


def save_count(total_steps: int, save_every: int) -> int:
    """Checkpoints a stage writes: one every ``trainer.save_every`` steps and one at its last step (once,
    when it falls on the cadence)."""
    if total_steps <= 0:
        return 0
    if save_every:
        return total_steps // save_every + (1 if total_steps % save_every else 0)
    return 1


def steady_step(coupled: Spread, *bounds: Spread) -> Spread:
    """The step of a run whose explorer and trainer run concurrently (mode async): the measured interval
    between steps, but never faster than the busiest side (``bounds``: each side's busy seconds per
    trainer step), whose pace the run settles to once the buffer's head start (up to
    ``buffer.max_staleness`` batches explored while the trainer loads) is used up."""
    mid, low, high = coupled.mid, coupled.low, coupled.high
    for b in bounds:
        if b.samples:
            mid, low, high = max(mid, b.mid), max(low, b.low), max(high, b.high)
    return Spread(mid, low, high, coupled.samples)


@dataclass(frozen=True)
class Cost:
    """One row of the plan: a cost, how often the run pays it, and whether the wall-clock adds it
    (``counted`` False: a part of another row, e.g. sampling inside the step)."""

    name: str
    each: Spread
    count: int
    counted: bool = True
    note: str = ""

    @property
    def total(self) -> Spread:
        return self.each.times(self.count)


@dataclass(frozen=True)
class ProcessEstimate:
    """One process of a ``launch: processes`` run: what it took to start, the pace of its unit of work
    (a trainer's step, an explorer's batch) and how much of it was busy, its memory."""

    name: str
    startup: float
    """Seconds from the launch to the end of its first step (trainer) or batch (explorer): processes
    starting, imports, the model, the first weights (and the trainer's evaluation at the start)."""
    unit: str
    """``step`` or ``batch``."""
    each: Spread
    """Seconds between two of its units (waits included)."""
    busy: Spread
    """Seconds of each unit spent training (trainer) or exploring, pacing excluded (explorer)."""
    count: int
    """Units over the whole run (an explorer's: estimated from the rows a step takes)."""
    peak_rss_mb: float | None = None


@dataclass(frozen=True)
class StageEstimate:
    """One stage: its measured costs, extrapolated over its steps."""

    name: str
    wiring: str
    launcher: str
    total_steps: int
    warmup_steps: int
    measured_steps: int
    costs: list[Cost]
    sampling_tokens_per_second: float | None = None
    training_tokens_per_second: float | None = None
    peak_rss_mb: float | None = None
    """Peak resident memory of the plan's process up to the end of this stage (MiB)."""
    peak_gpu_mb: float | None = None
    """Peak CUDA memory allocated while this stage ran (MiB; None without CUDA)."""
    processes: list[ProcessEstimate] = field(default_factory=list)
    note: str = ""
    """What to know about this stage's measurement (e.g. responses cut at ``max_tokens``)."""

    @property
    def seconds(self) -> Spread:
        return total([c.total for c in self.costs if c.counted])


@dataclass(frozen=True)
class RunEstimate:
    """The whole run: start-up, every stage, the end; and what it was measured on."""

    config: str
    startup: Cost
    stages: list[StageEstimate]
    end: Cost
    machine: str
    """Device, torch threads, cores and load while measuring."""
    plan_seconds: float
    """How long the measurement took."""
    notes: list[str] = field(default_factory=list)

    @property
    def seconds(self) -> Spread:
        return total([self.startup.total, *(s.seconds for s in self.stages), self.end.total])

    def as_dict(self) -> dict:
        """Everything, for ``--json``: the rows, each stage's total and the run's."""
        out = asdict(self)
        out["seconds"] = asdict(self.seconds)
        for stage, data in zip(self.stages, out["stages"]):
            data["seconds"] = asdict(stage.seconds)
            for cost, row in zip(stage.costs, data["costs"]):
                row["total"] = asdict(cost.total)
        return out


def fmt_seconds(value: float) -> str:
    """``0.0312 s``, ``3.21 s``, ``52 s``, ``4 min 10 s``, ``2 h 05 min``."""
    if not math.isfinite(value):
        return "?"
    if value < 0.1:
        return f"{value:.3g} s"
    if value < 10:
        return f"{value:.2f} s"
    if value < 120:
        return f"{value:.0f} s"
    if value < 7200:
        return f"{int(value // 60)} min {int(value % 60):02d} s"
    return f"{int(value // 3600)} h {int(value % 3600 // 60):02d} min"


def fmt_range(s: Spread) -> str:
    """``0.029–0.040 s`` (nothing when the range is a single value)."""
    if math.isclose(s.low, s.high, rel_tol=1e-3, abs_tol=1e-6):
        return ""
    low, high = fmt_seconds(s.low), fmt_seconds(s.high)
    return f"{low.removesuffix(' s')}–{high}" if s.high < 120 else f"{low}–{high}"


def report_lines(est: RunEstimate) -> list[str]:
    """The plan as text: one row per cost (breakdown rows indented, their totals in parentheses), the
    processes of a ``launch: processes`` stage, tokens/s and memory per stage, the wall-clock with its range."""
    rows: list[list[str]] = [["stage", "cost", "each (median)", "measured range", "×", "total"]]

    def add(stage: str, cost: Cost) -> None:
        name = cost.name if cost.counted else f"  {cost.name}"
        shown = fmt_seconds(cost.total.mid)
        rows.append([stage, name, fmt_seconds(cost.each.mid), fmt_range(cost.each), str(cost.count),
                     shown if cost.counted else f"({shown})"])  # fmt: skip

    add("-", est.startup)
    for stage in est.stages:
        for cost in stage.costs:
            add(stage.name, cost)
        s = stage.seconds
        rows.append([stage.name, "stage total", "", "", "", f"{fmt_seconds(s.mid)} ({fmt_range(s) or '-'})"])
    add("-", est.end)
    s = est.seconds
    out = [f"trine plan {est.config}: measured on {est.machine}, in {fmt_seconds(est.plan_seconds)}", ""]
    out += table(rows)
    out += ["", f"expected wall-clock: {fmt_seconds(s.mid)} (measured range {fmt_range(s) or '-'})"]
    for stage in est.stages:
        if stage.processes:
            out += ["", f"{stage.name}: processes"]
            out += table(process_rows(stage.processes))
    out.append("")
    for stage in est.stages:
        out.append(f"{stage.name}: {stage_line(stage)}")
        out += [f"  note: {stage.note}"] if stage.note else []
    out += [f"note: {n}" for n in est.notes]
    return out


def stage_line(stage: StageEstimate) -> str:
    """``sync, 200 steps (1 warm-up + 3 measured) | sampling 1,234 tok/s | training 5,678 tok/s | peak
    RSS 512 MiB``."""
    parts = [
        f"{stage.wiring} ({stage.launcher}), {stage.total_steps} steps "
        f"({stage.warmup_steps} warm-up + {stage.measured_steps} measured)"
    ]
    if stage.sampling_tokens_per_second:
        parts.append(f"sampling {stage.sampling_tokens_per_second:,.0f} tok/s")
    if stage.training_tokens_per_second:
        parts.append(f"training {stage.training_tokens_per_second:,.0f} tok/s")
    if stage.peak_rss_mb is not None:
        parts.append(f"peak RSS {stage.peak_rss_mb:,.0f} MiB")
    if stage.peak_gpu_mb is not None:
        parts.append(f"peak GPU {stage.peak_gpu_mb:,.0f} MiB")
    return " | ".join(parts)


def process_rows(processes: list[ProcessEstimate]) -> list[list[str]]:
    rows = [
        ["process", "first unit done", "per unit (median)", "measured range", "busy", "units", "peak RSS"]
    ]
    for p in processes:
        rss = f"{p.peak_rss_mb:,.0f} MiB" if p.peak_rss_mb is not None else "?"
        rows.append([p.name, fmt_seconds(p.startup), f"{fmt_seconds(p.each.mid)} / {p.unit}", fmt_range(p.each),
                     fmt_seconds(p.busy.mid), f"{p.count} {p.unit}es" if p.unit == "batch" else f"{p.count} steps",
                     rss])  # fmt: skip
    return rows


def table(rows: list[list[str]]) -> list[str]:
    """Rows as left-aligned columns (the first row is the header, underlined)."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return [lines[0], "  ".join("-" * w for w in widths), *lines[1:]]
