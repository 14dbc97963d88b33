"""Is the run getting anywhere? Two rules, each a pure function, and the watch that applies the first.

- **Stuck** (:func:`stuck_threshold`, :class:`StepWatch`): a run whose step has not advanced for
  ``monitor.stuck_after`` × its median recent step time, and at least ``monitor.stuck_min_seconds``, is
  ``stuck``. The run is never stopped for it: ``status.json`` gets a ``stuck`` record (since when, for how
  long, the median step, and what each side waits for) while its state stays ``running``;
  :func:`trine.status.describe` then says ``stuck`` with the reason, and so do ``trine status`` and the
  studio. Time spent evaluating or saving a checkpoint, or between stages, does not count (the watch
  keeps a small *phase* record: ``starting``, ``step``, ``eval``, ``checkpoint``). The heartbeat thread
  (:class:`trine.status.Heartbeat`) asks :meth:`StepWatch.check` at each beat, so nothing runs in the
  step path but :meth:`StepWatch.advance` at each step.
- **Plateau** (:func:`plateau`): a stage whose last ``eval.plateau.evals`` evaluations brought no gain of
  more than ``min_delta`` over the best before them ends at that evaluation (:mod:`trine.rundir`).
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from typing import Any

RECENT_STEPS = 20
"""Steps whose durations make the median of the stuck rule."""
STEP = "step"
"""The phase in which a run that does not advance is stuck (the others: starting, eval, checkpoint)."""


def stuck_threshold(durations: Sequence[float], stuck_after: float, min_seconds: float) -> float:
    """Seconds without a step after which a run is stuck: ``max(min_seconds, stuck_after × median(durations))``
    (``min_seconds`` alone while there is no step duration yet)."""
    if not durations:
        return min_seconds
    return max(min_seconds, stuck_after * statistics.median(durations))


def plateau(values: Sequence[float], evals: int, min_delta: float) -> str | None:
    """Why a stage's evaluations have plateaued, or None: ``values`` are its eval metric at each evaluation in
    order; it has plateaued when there are more than ``evals`` of them and the best of the last ``evals`` is
    no more than ``min_delta`` above the best before them."""
    if len(values) <= evals:
        return None
    before, recent = max(values[:-evals]), max(values[-evals:])
    if recent > before + min_delta:
        return None
    plus = f" + min_delta {min_delta:g}" if min_delta else ""
    return (
        f"no gain over the last {evals} evaluation{'s' if evals != 1 else ''}: best {recent:.4g}, not above "
        f"the earlier best {before:.4g}{plus}"
    )


def _iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="seconds")


class StepWatch:
    """Watches the step of one process for the stuck rule (see the module docstring).

    ``waiting()`` says what each side waits on now (``{"trainer": "...", "explorer": "...", "tasks": "..."}``),
    asked only while stuck; ``on_stuck(record)`` is called once each time the run becomes stuck (the record
    :meth:`check` returns), from the heartbeat thread; ``say`` prints a line when it becomes stuck and when
    it moves again.
    """

    def __init__(
        self,
        stuck_after: float,
        min_seconds: float,
        waiting: Callable[[], dict[str, str]] | None = None,
        on_stuck: Callable[[dict[str, Any]], None] | None = None,
        say: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stuck_after, self.min_seconds = stuck_after, min_seconds
        self.waiting, self.on_stuck, self.say, self.clock = waiting, on_stuck, say, clock
        self.durations: deque[float] = deque(maxlen=RECENT_STEPS)
        self.step: int | None = None
        self.phase = "starting"
        self._lock = threading.Lock()
        now = clock()
        self._since = now  # the last step advance (or the start)
        self._phase_since = now
        self._paused = 0.0  # seconds since the last advance spent outside the step phase
        self.stuck: dict[str, Any] | None = None

    def configure(self, stuck_after: float, min_seconds: float) -> None:
        """New thresholds (a stage's ``monitor`` section)."""
        self.stuck_after, self.min_seconds = stuck_after, min_seconds

    def set_phase(self, phase: str) -> None:
        """What the run is doing now: ``step`` (stuck when it does not advance), or ``starting`` / ``eval`` /
        ``checkpoint`` (time that counts neither as a step's nor as stalled)."""
        with self._lock:
            now = self.clock()
            if self.phase != STEP:
                self._paused += now - self._phase_since
            self.phase, self._phase_since = phase, now

    @contextlib.contextmanager
    def during(self, phase: str) -> Iterator[None]:
        """``phase`` while the block runs, then the phase before."""
        before = self.phase
        self.set_phase(phase)
        try:
            yield
        finally:
            self.set_phase(before)

    def advance(self, step: int) -> None:
        """The run is at ``step``: a step later than the last one records its duration and clears ``stuck``."""
        with self._lock:
            now = self.clock()
            if self.step is not None and step > self.step:
                paused = self._paused + (now - self._phase_since if self.phase != STEP else 0.0)
                seconds = max(0.0, now - self._since - paused) / (step - self.step)
                self.durations.extend([seconds] * min(step - self.step, RECENT_STEPS))
            if self.step is None or step != self.step:
                self.step, self._since, self._paused, self._phase_since = step, now, 0.0, now
                cleared, self.stuck = self.stuck, None
            else:
                cleared = None
        if cleared is not None and self.say is not None:
            self.say(f"no longer stuck: step {step} after {cleared['seconds']:.0f}s")

    def stalled(self) -> float | None:
        """Seconds in the step phase since the last advance (None outside the step phase)."""
        with self._lock:
            if self.phase != STEP:
                return None
            return max(0.0, self.clock() - self._since - self._paused)

    def check(self) -> dict[str, Any] | None:
        """The ``stuck`` record of ``status.json`` when the run is stuck now, else None (see the class)."""
        stalled = self.stalled()
        if stalled is None:
            self.stuck = None
            return None
        durations = list(self.durations)
        limit = stuck_threshold(durations, self.stuck_after, self.min_seconds)
        if stalled < limit:
            self.stuck = None
            return None
        first = self.stuck is None
        record: dict[str, Any] = {
            "since": _iso(time.time() - stalled),
            "seconds": round(stalled, 1),
            "threshold_seconds": round(limit, 1),
            "median_step_seconds": round(statistics.median(durations), 3) if durations else None,
            "step": self.step,
            "waiting": self._waiting(),
        }
        median = record["median_step_seconds"]
        record["reason"] = stuck_reason(
            self.step, stalled, median, self.stuck_after, self.min_seconds, record["waiting"]
        )
        self.stuck = record
        if first:
            if self.say is not None:
                self.say(f"STUCK {record['reason']}")
            if self.on_stuck is not None:
                self.on_stuck(record)
        return record

    def _waiting(self) -> dict[str, str]:
        if self.waiting is None:
            return {}
        try:
            return dict(self.waiting())
        except Exception as err:  # noqa: BLE001 - enrich: what could be read of the run's state
            return {"unknown": f"could not read what the run waits for ({type(err).__name__}: {err})"}


def stuck_reason(
    step: int | None,
    seconds: float,
    median: float | None,
    stuck_after: float,
    min_seconds: float,
    waiting: dict,
) -> str:
    """``step 12 has not advanced for 640s (10× the median step 64s); trainer waiting for rows (3 of 8 in the
    buffer); explorer waiting for admission (...)``: the head, then what each side waits for (``waiting``:
    side -> what it waits for; ``tasks`` -> a whole phrase)."""
    if median is None:
        rule = f"no step yet; monitor.stuck_min_seconds={min_seconds:g}s"
    elif stuck_after * median >= min_seconds:
        rule = f"{stuck_after:g}× the median step {median:.3g}s"
    else:
        rule = f"median step {median:.3g}s; monitor.stuck_min_seconds={min_seconds:g}s"
    head = f"step {'?' if step is None else step} has not advanced for {seconds:.0f}s ({rule})"
    return "; ".join([head, *(what if who == "tasks" else f"{who} {what}" for who, what in waiting.items())])
