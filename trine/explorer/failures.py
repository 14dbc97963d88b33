"""The one failure rule of the explorer: when more than ``explorer.max_skip_ratio`` of the answers of the
last :data:`SKIP_WINDOW` training batches failed, the run stops (:class:`SkipRatioError`, naming the
reasons, how many of each and an example of each).

An answer is one rollout a task asks for (``repeat`` of them; a multi-step rollout is one answer). It
fails when its task was skipped (the workflow raised, timed out, or returned nothing valid: all of the
task's ``repeat`` answers are lost), or when it came back with a failure status (:data:`FAILED_STATUSES`:
its reward raised or timed out, its environment or a tool failed, a turn timed out) — such an answer is
stored for inspection but kept out of the loss, so a run where every reward raises trains on nothing and
must not end ``finished``. A batch whose failed share is above ``explorer.warn_skip_ratio`` is logged.
Evaluation is not counted.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from dataclasses import dataclass, field

from trine.types import Experience, Task

log = logging.getLogger("trine.explorer")

SKIP_WINDOW = 10
"""Training batches over which ``max_skip_ratio`` is measured (all batches so far, early on)."""

FAILED_STATUSES = ("reward_error", "env_error", "tool_error", "timeout")
"""Trajectory statuses of an answer that failed (``ok`` and ``truncated`` did not)."""


class SkipRatioError(RuntimeError):
    """More than ``explorer.max_skip_ratio`` of the recent answers failed: the run stops."""


@dataclass
class _Batch:
    """What failed in one batch."""

    answers: int = 0
    """Answers asked for (a skipped task's ``repeat`` included)."""
    tasks: int = 0
    lost: int = 0
    """Answers of skipped tasks."""
    skipped: Counter = field(default_factory=Counter)
    """Skipped tasks by reason (``error``, ``timeout``, ``reward_timeout``, ``empty``, ``invalid``)."""
    statuses: Counter = field(default_factory=Counter)
    """Answers by failure status."""

    @property
    def failed(self) -> int:
        return self.lost + sum(self.statuses.values())


class FailureWindow:
    """The failures of the last :data:`SKIP_WINDOW` batches, with one example message per reason."""

    def __init__(self, max_ratio: float, warn_ratio: float) -> None:
        self.max_ratio = max_ratio
        self.warn_ratio = warn_ratio
        self._recent: deque[_Batch] = deque(maxlen=SKIP_WINDOW)
        self._examples: dict[str, str] = {}

    def add(self, tasks: list[Task], outcomes: list[tuple[list[Experience], int, str | None]], details: list[str],
            index: int) -> None:  # fmt: skip
        """Count batch ``index`` (its tasks, their outcomes ``(experiences, retries, skip reason)`` and the
        detail of each skip); warn about it, or raise :class:`SkipRatioError` when the window fails."""
        batch = _Batch(tasks=len(tasks))
        for task, (exps, _, reason), detail in zip(tasks, outcomes, details):
            if reason:
                batch.skipped[reason] += 1
                batch.lost += task.repeat
                batch.answers += task.repeat
                self._examples[f"skip:{reason}"] = f"task {task.task_id}: {detail}"
                continue
            answers = _answers(exps)
            batch.answers += len(answers)
            for e in answers:
                if e.status in FAILED_STATUSES:
                    batch.statuses[e.status] += 1
                    self._examples[f"status:{e.status}"] = f"task {e.task_id or task.task_id}: {_why(e)}"
        if batch.answers and batch.failed / batch.answers > self.warn_ratio:
            log.warning(
                "batch %d: %d of %d answers failed (%s), more than explorer.warn_skip_ratio=%s",
                index,
                batch.failed,
                batch.answers,
                _short(batch),
                self.warn_ratio,
            )
        self._recent.append(batch)
        self._check()

    def _check(self) -> None:
        answers = sum(b.answers for b in self._recent)
        failed = sum(b.failed for b in self._recent)
        if not answers or failed / answers <= self.max_ratio:
            return
        tasks = sum(b.tasks for b in self._recent)
        skipped: Counter = sum((b.skipped for b in self._recent), Counter())
        statuses: Counter = sum((b.statuses for b in self._recent), Counter())
        causes = []
        if skipped:
            each = "; ".join(
                f"{r}: {n} (e.g. {self._examples[f'skip:{r}']})" for r, n in skipped.most_common()
            )
            causes.append(
                f"{sum(skipped.values())} of {tasks} tasks were skipped, losing all their answers: {each}"
            )
        causes += [
            f"answers with status {s}: {n} (e.g. {self._examples[f'status:{s}']})"
            for s, n in statuses.most_common()
        ]
        raise SkipRatioError(
            f"{failed} of {answers} answers of the last {len(self._recent)} batch(es) failed, more than "
            f"explorer.max_skip_ratio={self.max_ratio}. {'. '.join(causes)}. Each failure is logged with its "
            "task id; fix the workflow or reward (a reward that raises marks its answer reward_error, which "
            "is not trained on), raise explorer.timeout or explorer.reward_timeout if tasks time out, or "
            "raise explorer.max_skip_ratio (1.0 turns this check off)."
        )


def _answers(exps: list[Experience]) -> list[Experience]:
    """One experience per answer: each rollout's last step when the workflow is multi-step."""
    if any("last_step" in e.info for e in exps):
        return [e for e in exps if e.info.get("last_step")]
    return list(exps)


def _why(e: Experience) -> str:
    """What an answer's failure status came from (its reward's error, its trajectory's reason)."""
    text = str(e.info.get("reward_error") or e.info.get("status_reason") or "no reason recorded")
    return text if len(text) <= 300 else text[:297] + "..."


def _short(batch: _Batch) -> str:
    """``4 of 4 tasks skipped: empty 2, error 1; reward_error 3``."""
    parts = []
    if batch.skipped:
        reasons = ", ".join(f"{r} {n}" for r, n in sorted(batch.skipped.items()))
        parts.append(f"{sum(batch.skipped.values())} of {batch.tasks} tasks skipped: {reasons}")
    parts += [f"{s} {n}" for s, n in sorted(batch.statuses.items())]
    return "; ".join(parts)
