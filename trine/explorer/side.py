"""The explorer side of the loop (DESIGN §1): tasks → explorer → shaping → operators → expert rows → buffer."""

from __future__ import annotations

import copy
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trine.explorer.outcomes import batch_metrics
from trine.explorer.shaping import pass_rates, shape_batch
from trine.types import Experience, Task

if TYPE_CHECKING:
    from trine.buffer import Buffer
    from trine.buffer.operators import Pipeline
    from trine.explorer.claims import TaskClaims
    from trine.explorer.runner import Explorer
    from trine.explorer.side import ExplorerSide
    from trine.models.protocol import RolloutModel
    from trine.sync import WeightSync
    from trine.tasks import TaskScheduler


@dataclass(frozen=True)
class Shaping:
    """The algorithm's rollout-side settings for :func:`trine.explorer.shaping.shape_batch` (plain values)."""

    max_tokens: int
    """The sampling limit the overlong penalty is measured against."""
    batch_size: int
    """Informative groups a dynamic-sampling batch is filled up to (``tasks.batch_size``)."""
    dynamic_sampling: bool = False
    max_extra_draws: int = 4
    overlong_buffer: float = 0
    overlong_penalty: float = 1.0


@dataclass
class ExpertRows:
    """MIX: supervised rows from an expert taskset added to each explored batch, ``ratio`` per rollout."""

    scheduler: TaskScheduler
    ratio: float
    make: Callable[[list[Task]], list[Experience]]
    """Turns expert tasks into supervised experiences (:func:`trine.tasks.supervised.sft_experiences`)."""

    def rows(self, rollouts: int, version: int) -> list[Experience]:
        """``max(1, round(ratio * rollouts))`` expert rows, tagged with the batch's ``version``."""
        rows = self.make(self.scheduler.next_batch(max(1, round(self.ratio * rollouts))))
        for e in rows:
            e.policy_version = version
        return rows


@dataclass(frozen=True)
class StaleRetry:
    """Tasks whose rows the trainer dropped as stale are explored again (a streaming explorer in one
    process; explorer processes retry through the buffer's task ledger)."""

    limit: int
    """``buffer.stale_retries``: times a task is explored again before it counts as lost."""
    max_staleness: int
    """``buffer.max_staleness``: how long a task's rows may still be dropped (:meth:`ExplorerSide.requeue`)."""


EXPLORING = "exploring"
PACED = "paced (staleness bound)"
WEIGHTS = "waiting for weights"


@dataclass
class Activity:
    """What a streaming explorer is doing now, kept up to date by the stream and read by whoever waits on
    it (the trainer's ``sync.wait_timeout`` error says it)."""

    state: str = "not started"
    """``exploring``, ``paced (staleness bound)``, ``waiting for weights`` or ``ended: <why>``."""
    tasks_in_flight: int = 0
    """Tasks started and not yet put that hold a place (running, or finished and waiting for their batch)."""
    tasks_deferred: int = 0
    """Tasks still running past ``explorer.tail_seconds`` (they hold no place)."""

    def describe(self) -> str:
        """``4 tasks in flight (1 more past explorer.tail_seconds), the explorer is exploring``."""
        deferred = f" ({self.tasks_deferred} more past explorer.tail_seconds)" if self.tasks_deferred else ""
        tasks = "1 task" if self.tasks_in_flight == 1 else f"{self.tasks_in_flight} tasks"
        return f"{tasks} in flight{deferred}, the explorer is {self.state}"


@dataclass
class ExplorerSide:
    """tasks → explorer → shaping/operators → buffer, one explored batch at a time."""

    explorer: Explorer
    scheduler: TaskScheduler
    buffer: Buffer
    sync: WeightSync
    batch_size: int
    """Tasks per explored batch (``tasks.batch_size``)."""
    shaping: Shaping
    success_threshold: float
    """Return at which a rollout counts as a success (pass-rate feedback to the scheduler,
    ``explorer/success_rate``)."""
    operators: Pipeline | None = None
    expert: ExpertRows | None = None
    producer: str | None = None
    """Name of this explorer in a buffer shared by several processes (``explorer-0``): each batch is
    put as (producer, batch index), once (see ``SQLBuffer.put``)."""
    batches: int = 0
    """Batches explored so far (the next batch's index)."""
    gate: threading.Lock = field(default_factory=threading.Lock)
    """Held while a batch is explored and put; a checkpoint takes it to see a consistent state."""
    reports: deque[dict[str, float]] = field(default_factory=deque)
    """``explorer/*`` metrics of batches put but not yet reported in a step line, oldest first."""
    unfinished: list[Task] = field(default_factory=list)
    """Tasks a streaming explorer had drawn but not put when its state was saved: a resumed stream runs
    them first, so none is lost."""
    activity: Activity = field(default_factory=Activity)
    """What the streaming explorer is doing (mode async)."""
    claims: TaskClaims | None = None
    """An explorer process's tasks, pulled from the shared buffer's task ledger instead of drawn from
    :attr:`scheduler` (:mod:`trine.explorer.claims`); None in one process."""
    stale: StaleRetry | None = None
    """In one process with a staleness bound: explore again the tasks whose rows were dropped as stale."""
    tasks_retried: int = 0
    """Tasks explored again (rows dropped as stale) since the last batch report."""
    tasks_lost: int = 0
    """Tasks dropped as stale more than ``stale.limit`` times since the last batch report."""
    _settled: list[tuple[int, int]] = field(default_factory=list, repr=False)
    _next_task: int = 0
    _sent: dict[int, list[Any]] = field(default_factory=dict, repr=False)
    """Tasks put whose rows may still be dropped as stale: number -> [task, version, retries so far, the
    trainer version after which they no longer can (None until :meth:`requeue` first sees it)]."""
    _retries: dict[int, int] = field(default_factory=dict, repr=False)
    """Retries of the tasks being explored again, by ``id``."""
    _started: dict[int, Task] = field(default_factory=dict, repr=False)

    @property
    def engine(self) -> RolloutModel:
        """The rollout model the explorer samples with."""
        return self.explorer.model

    def waiting_on(self) -> dict[str, str]:
        """What this side waits for now, for a stuck run's report (read from another thread):
        ``explorer`` when a streaming explorer is held back (admission by the pacing rule, or new weights),
        ``tasks`` when workflows are running (:meth:`Explorer.waiting_on`)."""
        out = {}
        if self.activity.state == PACED:
            held = self.activity.tasks_in_flight
            out["explorer"] = (
                f"waiting for admission (buffer.max_staleness; {held} task{'s' if held != 1 else ''} in flight)"
            )
        elif self.activity.state == WEIGHTS:
            out["explorer"] = "waiting for new weights"
        if tasks := self.explorer.waiting_on():
            out["tasks"] = tasks
        return out

    def newest_version(self) -> int:
        """The newest weights version the trainer pushed (the engine's own if none is waiting)."""
        latest = self.sync.latest()
        return self.engine.policy_version if latest is None else max(latest, self.engine.policy_version)

    def produce(
        self,
        version: int,
        count: int = 1,
        stop: threading.Event | None = None,
        extra: dict[str, float] | None = None,
    ) -> int:
        """Explore up to ``count`` batches with weights ``version`` (concurrently, one long tail) and
        put each in the buffer; returns how many were explored (fewer when the tasks run out, 0 when
        ``stop`` was set meanwhile). ``extra`` metrics join each batch's report."""
        self.sync.pull(self.engine, version)  # outside the gate: a pull may wait for the trainer's push
        with self.gate:
            return 0 if stop is not None and stop.is_set() else self._produce(version, count, extra or {})

    def _produce(self, version: int, count: int, extra: dict[str, float]) -> int:
        batches = []
        for _ in range(count):
            tasks = self.scheduler.next_batch(self.batch_size)
            if not tasks:
                break
            batches.append(tasks)
        first = self.batches
        results = self.explorer.explore_batches(batches, first_index=first, version=version)
        for experiences, _ in results:  # pass rates of every batch first (curricula use them)
            self.scheduler.feedback(*pass_rates(experiences, self.success_threshold))
        for j, (experiences, metrics) in enumerate(results):
            self.finish_batch(experiences, metrics, first + j, version, extra=extra, feedback=False)
        return len(results)

    def finish_batch(
        self,
        experiences: list[Experience],
        metrics: dict[str, float],
        index: int,
        version: int,
        *,
        refill: bool = True,
        extra: dict[str, float] | None = None,
        feedback: bool = True,
    ) -> None:
        """The one produce pipeline, for explored batch ``index`` sampled with weights ``version``:
        pass rates back to the scheduler (``feedback=False``: the caller gave them already), DAPO shaping
        (``refill=False``: filter only, a stream refills by itself), the operators, expert rows, then
        the put, with ``metrics`` and ``extra`` as its report. Call it under :attr:`gate`."""
        if feedback:
            self.scheduler.feedback(*pass_rates(experiences, self.success_threshold))
        metrics.update(batch_metrics(experiences, self.success_threshold))
        experiences = self._shape(experiences, metrics, index, version, refill)
        if self.operators is not None:
            experiences, op_metrics = self.operators(experiences, step=index)
            metrics.update(op_metrics)
        if self.expert is not None:
            experiences = experiences + self.expert.rows(len(experiences), version)
        self._put(experiences, {**metrics, **(extra or {})})

    def others_in_flight(self, fresh: bool = False) -> int:
        """Tasks other explorer processes hold (claimed, not put): the pacing rule counts them with this
        explorer's (0 in one process); ``fresh``: counted now, not a moment ago (before each claim)."""
        return 0 if self.claims is None else self.claims.others_in_flight(fresh)

    def requeue(self, trainer_version: int) -> list[Task]:
        """The tasks to explore again because the buffer dropped all their rows as stale (``stale``), each
        recorded as started; a task past ``stale.limit`` retries counts as lost. Forgets the tasks whose
        rows can no longer be dropped: every get drops the rows below its floor, so once the trainer is 2
        versions past both the version at which it first saw them and ``version + max_staleness + 1``,
        they were trained or dropped (and reported)."""
        if self.stale is None or self.claims is not None:  # explorer processes: the ledger retries them
            return []
        again = []
        take = getattr(self.buffer, "take_stale_tasks", None)  # the built-in storages; optional for plugins
        for seq in take() if take is not None else []:
            if (entry := self._sent.pop(seq, None)) is None:
                continue
            task, _, retries, _ = entry
            if retries < self.stale.limit:
                self._retries[id(task)] = retries + 1
                again.append(task)
                self.tasks_retried += 1
            else:
                self.tasks_lost += 1
        for seq, entry in list(self._sent.items()):
            if entry[3] is None:
                entry[3] = max(trainer_version, entry[1] + self.stale.max_staleness + 1) + 2
            elif entry[3] < trainer_version:
                del self._sent[seq]
        with self.gate:
            self._started.update((id(t), t) for t in again)
        return again

    def take_unfinished(self) -> list[Task]:
        """The tasks a restored checkpoint had drawn but not put (a resumed stream runs them first),
        recorded as started again; :attr:`unfinished` is emptied."""
        with self.gate:
            tasks, self.unfinished = self.unfinished, []
            self._started = {id(t): t for t in tasks}
        return tasks

    def draw(self, n: int) -> list[Task]:
        """Up to ``n`` tasks from the scheduler, recorded as started: a checkpoint saves them as
        ``unfinished`` until :meth:`release`. [] when the tasks ran out."""
        if self.claims is not None:
            self.claims.renew()
            return self.claims.claim(n)
        with self.gate:  # a checkpoint sees the cursor and the open tasks together
            # each its own object: a taskset hands out the same one in every epoch (known here by its id)
            tasks = [copy.copy(t) for t in self.scheduler.next_batch(n)]
            self._started.update((id(t), t) for t in tasks)
        return tasks

    def release(self, done: list[tuple[Task, Any, Any]], versions: list[int]) -> None:
        """Forget the tasks of ``done`` (finished ``(task, outcome, stats)`` sampled with weights
        ``versions``, their batch is being put) as started. Their rows are tagged with the task's number
        (``info["task_seq"]``): its place in the stream for claimed tasks, put with their claims; in one
        process, a number of this explorer's, remembered until the rows can no longer be dropped as stale
        (:meth:`requeue`). Call under :attr:`gate`."""
        for (task, (experiences, _, _), _), version in zip(done, versions):
            self._started.pop(id(task), None)
            seq = self.claims.seq(task) if self.claims is not None else None
            if self.claims is None and self.stale is not None:
                seq, self._next_task = self._next_task, self._next_task + 1
                self._sent[seq] = [task, version, self._retries.pop(id(task), 0), None]
            if seq is not None:
                for e in experiences:
                    e.info["task_seq"] = seq
        if self.claims is not None:
            self._settled += self.claims.finish([task for task, _, _ in done])

    def _put(self, experiences: list[Experience], report: dict[str, float]) -> None:
        """One explored batch into the buffer (the report first: a trainer that sees the batch finds it)."""
        self.reports.append(report)
        if self.producer is None:
            self.buffer.put(experiences)
        else:  # a buffer shared by processes (SQLBuffer) records whose batch it is, and the tasks it ends
            claims, self._settled = self._settled, []
            put = self.buffer.put
            put(experiences, producer=self.producer, producer_batch=self.batches, claims=claims)  # type: ignore[call-arg]
        self.batches += 1

    def report_all(self) -> dict[str, float]:
        """The reports of every batch not yet reported, as one: each key's mean over the batches, and
        ``explorer/batches`` (how many); {} if none."""
        reports = [self.reports.popleft() for _ in range(len(self.reports))]
        if not reports:
            return {}
        keys = {k for r in reports for k in r}
        out = {k: _mean([r[k] for r in reports if k in r]) for k in sorted(keys)}
        return {**out, "explorer/batches": float(len(reports))}

    def report(self) -> dict[str, float]:
        """The ``explorer/*`` metrics of the oldest batch not yet reported ({} if none)."""
        return self.reports.popleft() if self.reports else {}

    def _shape(
        self,
        experiences: list[Experience],
        metrics: dict[str, float],
        index: int,
        version: int,
        refill: bool = True,
    ) -> list[Experience]:
        """DAPO shaping and refill; refills draw tasks from the scheduler and explore them with the
        batch's ``version`` (``refill=False``: a streaming explorer only filters; the stream refills)."""

        def draw_more(n: int) -> list[Experience] | None:
            if not refill:
                return None
            tasks = self.scheduler.next_batch(n)
            return self.explorer.explore(tasks, batch_index=index, version=version)[0] if tasks else None

        s = self.shaping
        return shape_batch(
            experiences,
            metrics,
            max_tokens=s.max_tokens,
            batch_size=s.batch_size,
            draw_more=draw_more,
            dynamic_sampling=s.dynamic_sampling,
            max_extra_draws=s.max_extra_draws,
            overlong_buffer=s.overlong_buffer,
            overlong_penalty=s.overlong_penalty,
        )

    def state_dict(self) -> dict[str, Any]:
        """Task cursor, explored-batch count, unreported metrics, buffer and engine (call under ``gate``)."""
        state = {
            "scheduler": self.scheduler.state_dict(),
            "batches": self.batches,
            "reports": list(self.reports),
            "unfinished": list(self._started.values()),
            "sent": [[seq, *entry] for seq, entry in self._sent.items()],
            "next_task": self._next_task,
            "buffer": self.buffer.state_dict(),
            "engine": self.engine.state_dict(),
            "sync": self.sync.state_dict(),
        }
        if self.expert is not None:
            state["expert"] = self.expert.scheduler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` saved."""
        self.scheduler.load_state_dict(state["scheduler"])
        self.batches = int(state["batches"])
        self.reports = deque(state["reports"])
        self.unfinished = list(state.get("unfinished", []))
        self._sent = {int(entry[0]): list(entry[1:]) for entry in state.get("sent", [])}
        self._next_task = int(state.get("next_task", 0))
        self.buffer.load_state_dict(state["buffer"])
        self.engine.load_state_dict(state["engine"])
        self.sync.load_state_dict(state["sync"])
        if self.expert is not None and "expert" in state:
            self.expert.scheduler.load_state_dict(state["expert"])


def _mean(values: list[Any]) -> Any:
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return sum(numbers) / len(numbers) if numbers else values[-1]
