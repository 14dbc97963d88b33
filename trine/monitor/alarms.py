"""Alarms: signs in the logged metrics that a run learns to game its reward, raised while it runs.

A reward with partial credit can climb while what it stands for falls: responses grow to ``max_tokens``,
``explorer/truncated_fraction`` goes to 1, greedy accuracy drops, and every sign is in ``metrics.jsonl``
with nothing pointing at it. The rules here are pure functions over the metric history (a list of
``(step, metrics)`` in logging order) that return an :class:`Alarm` or None:

- :func:`reward_vs_eval_alarm` (``reward_vs_eval``, "reward hacking?"): between the last two evaluations
  the training reward rose while the eval's main metric fell;
- :func:`truncation_alarm` (``truncation``): most responses of the last steps were cut at ``max_tokens``;
- :func:`length_alarm` (``length``): single-turn responses of the last steps run to ``max_tokens``.

:class:`AlarmSink` is a metric sink (the run directory adds it to the run's monitor, so it sees every
logged line, the start-of-stage evaluation included): it keeps the history, applies the rules with the
stage's ``monitor.alarms`` settings, and hands each alarm, once per stage and kind, to ``on_alarm``
(which prints it and records it in ``status.json``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

History = list[tuple[int, dict[str, Any]]]
"""Logged metrics in order: ``(step, metrics)``."""

REWARD = "explorer/reward_mean"
TRUNCATED = "explorer/truncated_fraction"
LENGTH = "explorer/response_length_mean"
TURNS = "explorer/turns_mean"
MAIN_EVAL = ("accuracy", "avg@", "pass@")
"""The eval's main metric: the first ``eval/<taskset>/accuracy`` key, else avg@k, else pass@k."""
KEEP = 2000
"""Logged lines an :class:`AlarmSink` keeps per stage (the rules look at the last evaluations only)."""


@dataclass
class Alarm:
    """One raised alarm, as ``status.json`` keeps it (``alarms`` list)."""

    kind: str
    """``reward_vs_eval``, ``truncation`` or ``length``."""
    step: int
    """The step it was raised at."""
    message: str
    """What was seen and what to look at, with the numbers."""
    numbers: dict[str, float] = field(default_factory=dict)
    """The measured values and the thresholds they crossed."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _number(metrics: dict[str, Any], key: str) -> float | None:
    value = metrics.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def main_eval_key(metrics: dict[str, Any]) -> str | None:
    """The eval's main metric among ``metrics``' keys (:data:`MAIN_EVAL`), or None when it has none."""
    keys = sorted(k for k in metrics if k.startswith("eval/") and _number(metrics, k) is not None)
    for suffix in MAIN_EVAL:
        found = [k for k in keys if k.rsplit("/", 1)[-1].startswith(suffix)]
        if found:
            return found[0]
    return None


def reward_vs_eval_alarm(history: History, margin: float) -> Alarm | None:
    """``reward_vs_eval``: the eval's main metric fell by at least ``margin`` between the last two
    evaluations while the training reward rose by at least ``margin`` over the steps between them.

    The reward's rise is ``mean(last k rewards) - mean(first k rewards)`` of the steps after the earlier
    evaluation up to the later one, ``k`` = half of them (at most 5); fewer than 2 steps between: None.
    """
    evals = [(i, step, m) for i, (step, m) in enumerate(history) if main_eval_key(m)]
    if len(evals) < 2:
        return None
    (i0, step0, m0), (i1, step1, m1) = evals[-2], evals[-1]
    key = main_eval_key(m1)
    before, after = _number(m0, key), _number(m1, key)
    between = [r for _, m in history[i0 + 1 : i1 + 1] if (r := _number(m, REWARD)) is not None]
    if before is None or after is None or len(between) < 2:
        return None
    k = min(5, len(between) // 2)
    rise = statistics.fmean(between[-k:]) - statistics.fmean(between[:k])
    drop = before - after
    if rise < margin or drop < margin:
        return None
    return Alarm(
        "reward_vs_eval",
        step1,
        f"reward hacking? training reward rose by {rise:.3f} while {key} fell from {before:.3f} to "
        f"{after:.3f} between steps {step0} and {step1}: the policy may be learning what the reward pays "
        "for rather than the task. Look at the rollouts (trine buffer head --tokens) and run trine check's "
        "reward probes",
        {"reward_rise": rise, "eval_before": before, "eval_after": after, "margin": margin},
    )


def _recent(history: History, key: str, window: int) -> list[float] | None:
    """The last ``window`` values of ``key`` (None when fewer were logged)."""
    values = [v for _, m in history if (v := _number(m, key)) is not None]
    return values[-window:] if len(values) >= window else None


def truncation_alarm(history: History, threshold: float, window: int) -> Alarm | None:
    """``truncation``: ``explorer/truncated_fraction`` averaged at least ``threshold`` over the last
    ``window`` steps (responses cut at ``max_tokens`` end without an answer, and a reward that still pays
    for them teaches length)."""
    values = _recent(history, TRUNCATED, window)
    if values is None or statistics.fmean(values) < threshold:
        return None
    mean = statistics.fmean(values)
    return Alarm(
        "truncation",
        history[-1][0],
        f"truncation: {mean:.0%} of responses were cut at max_tokens over the last {window} steps "
        f"(alarm at {threshold:.0%}). Raise sampling.max_tokens, or check that the reward does not pay "
        "for length",
        {TRUNCATED: mean, "threshold": threshold, "window": float(window)},
    )


def length_alarm(history: History, max_tokens: int, fraction: float, window: int) -> Alarm | None:
    """``length``: the mean response length over the last ``window`` steps reached ``fraction`` of
    ``max_tokens``. Only single-turn steps count (a multi-turn response holds observations too: its
    length is no measure of one turn's; see :func:`truncation_alarm` for those)."""
    if any(TURNS in m for _, m in history[-window:]):
        return None
    values = _recent(history, LENGTH, window)
    if values is None or statistics.fmean(values) < fraction * max_tokens:
        return None
    mean = statistics.fmean(values)
    return Alarm(
        "length",
        history[-1][0],
        f"length: responses averaged {mean:.1f} tokens over the last {window} steps, "
        f"{mean / max_tokens:.0%} of max_tokens={max_tokens} (alarm at {fraction:.0%}). Check that the "
        "reward does not pay for length, or raise sampling.max_tokens",
        {LENGTH: mean, "max_tokens": float(max_tokens), "fraction": fraction, "window": float(window)},
    )


def check_alarms(history: History, settings: Any, max_tokens: int | None) -> list[Alarm]:
    """Every rule of ``settings`` (a ``monitor.alarms`` section) that fires on ``history``."""
    if not settings.enabled or not history:
        return []
    found = [
        reward_vs_eval_alarm(history, settings.reward_vs_eval) if settings.reward_vs_eval else None,
        truncation_alarm(history, settings.truncation, settings.window) if settings.truncation else None,
        length_alarm(history, max_tokens, settings.length, settings.window)
        if settings.length and max_tokens
        else None,
    ]
    return [a for a in found if a is not None]


class AlarmSink:
    """A metric sink that raises alarms: ``stages`` maps a stage's name to its ``(monitor.alarms
    section, train max_tokens or None)``; each alarm goes to ``on_alarm`` once per stage and kind."""

    def __init__(self, stages: dict[str, tuple[Any, int | None]], on_alarm: Callable[[Alarm], None]):
        self.stages = stages
        self.on_alarm = on_alarm
        self.history: dict[str, History] = {}
        self.raised: set[tuple[str, str]] = set()

    def log(self, metrics: dict[str, Any], step: int) -> None:
        stage = str(metrics.get("stage", ""))
        if stage not in self.stages:
            return
        history = self.history.setdefault(stage, [])
        history.append((step, metrics))
        del history[:-KEEP]
        settings, max_tokens = self.stages[stage]
        for alarm in check_alarms(history, settings, max_tokens):
            if (stage, alarm.kind) not in self.raised:
                self.raised.add((stage, alarm.kind))
                self.on_alarm(alarm)

    def close(self) -> None:
        pass
