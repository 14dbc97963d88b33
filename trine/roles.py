"""The two sides of the loop (DESIGN §1): the explorer side turns tasks into experiences in the buffer,
the trainer side turns buffer contents into new weights. The buffer is the only arrow between them.

- :class:`ExplorerSide` ``produce(version, count)``: weight sync (pull) → task scheduler → explorer →
  shaping (DAPO) → operators → MIX expert rows → ``buffer.put``, one put per explored batch; the
  batch's ``explorer/*`` metrics wait in :meth:`ExplorerSide.report` for the step line that trains it.
- :class:`TrainerSide` ``consume()``: ``buffer.get(batch_size, current_version, timeout)`` →
  ``trainer.step`` → weight sync (push) every ``sync_interval`` versions.

A :class:`Stage` holds one stage's roles for :mod:`trine.loop` and a mode of :mod:`trine.modes`;
:mod:`trine.build` makes it from the config. The roles import no stage package at run time.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from trine.refill import pass_rates, shape_batch
from trine.types import Experience, Task

if TYPE_CHECKING:
    from trine.buffer import Buffer
    from trine.buffer.operators import Pipeline
    from trine.config import RunConfig
    from trine.explorer import Explorer
    from trine.models.protocol import RolloutModel
    from trine.sync import WeightSync
    from trine.tasks import TaskScheduler, TaskSet
    from trine.trainer import Trainer


@dataclass(frozen=True)
class Shaping:
    """The algorithm's rollout-side settings for :func:`trine.refill.shape_batch` (plain values)."""

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
    """Reward at which a rollout counts as a success (pass-rate feedback to the scheduler)."""
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
    _started: dict[int, Task] = field(default_factory=dict, repr=False)

    @property
    def engine(self) -> RolloutModel:
        return self.explorer.model

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
        for experiences, _ in results:  # pass rates back to the scheduler (curricula use them)
            self.scheduler.feedback(*pass_rates(experiences, self.success_threshold))
        for j, (experiences, metrics) in enumerate(results):
            experiences = self._shape(experiences, metrics, first + j, version)
            if self.operators is not None:
                experiences, op_metrics = self.operators(experiences, step=first + j)
                metrics.update(op_metrics)
            if self.expert is not None:
                experiences = experiences + self.expert.rows(len(experiences), version)
            self._put(experiences, {**metrics, **extra})
        return len(results)

    def _put(self, experiences: list[Experience], report: dict[str, float]) -> None:
        """One explored batch into the buffer (the report first: a trainer that sees the batch finds it)."""
        self.reports.append(report)
        if self.producer is None:
            self.buffer.put(experiences)
        else:  # a buffer shared by processes (SQLBuffer) records whose batch it is
            self.buffer.put(experiences, producer=self.producer, producer_batch=self.batches)  # type: ignore[call-arg]
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
            "buffer": self.buffer.state_dict(),
            "engine": self.engine.state_dict(),
            "sync": self.sync.state_dict(),
        }
        if self.expert is not None:
            state["expert"] = self.expert.scheduler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.batches = int(state["batches"])
        self.reports = deque(state["reports"])
        self.unfinished = list(state.get("unfinished", []))
        self.buffer.load_state_dict(state["buffer"])
        self.engine.load_state_dict(state["engine"])
        self.sync.load_state_dict(state["sync"])
        if self.expert is not None and "expert" in state:
            self.expert.scheduler.load_state_dict(state["expert"])


def _mean(values: list[Any]) -> Any:
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return sum(numbers) / len(numbers) if numbers else values[-1]


@dataclass
class TrainerSide:
    """buffer → trainer → weight sync."""

    trainer: Trainer
    buffer: Buffer | None
    """None in ``mode: train`` (batches come from :class:`SupervisedSource`)."""
    sync: WeightSync | None
    sync_interval: int = 1
    batch_size: int | None = None
    """Experiences per step (``trainer.batch_size``); None = one explored batch, whole."""
    get_timeout: float | None = None
    stepping: bool = False
    """True from the moment :meth:`consume` took a batch until its weights are pushed (the batch in
    flight; an explorer pacing itself counts it)."""
    on_worker: Callable[..., Any] | None = None
    """Runs a function on the worker thread of the engine that samples the trainer's own weights
    (``HFEngine.call``), so one thread does all the torch work; None: run inline."""
    colocated: Any = None
    """An engine on the trainer's GPU that sleeps while the trainer steps (vLLM ``enable_sleep_mode``):
    ``sleep()`` → step → the new weights loaded into it (when pushed) → ``wake_up()``."""

    @property
    def version(self) -> int:
        return self.trainer.version

    def batches_waiting(self) -> int:
        """Explored batches in the buffer that no step has taken yet."""
        return self.buffer.batches_waiting() if self.buffer is not None else 0

    def train(self, experiences: list[Experience]) -> dict[str, float]:
        """``trainer.step`` (on the engine's worker thread when the engine samples these weights)."""
        if self.on_worker is None:
            return self.trainer.step(experiences)
        return self.on_worker(self.trainer.step, experiences)

    def consume(self, timeout: float | None = None) -> dict[str, float]:
        """One step on the next batch from the buffer (waiting up to ``timeout`` seconds, default
        ``buffer.get_timeout``, then :class:`~trine.buffer.BufferTimeout` with nothing consumed);
        pushes the weights every ``sync_interval`` versions."""
        assert self.buffer is not None and self.sync is not None, "consume() needs a buffer and a weight sync"
        t = self.trainer
        wait = self.get_timeout if timeout is None else timeout
        experiences = self.buffer.get(self.batch_size, current_version=t.version, timeout=wait)
        self.stepping = True
        if self.colocated is not None:
            self.colocated.sleep()
        try:
            metrics = {
                **self.train(experiences),
                **self.buffer.metrics(),  # incl. buffer/staleness_mean|max of this batch (current_version given)
                "sync/seconds": self.sync.seconds,
                **self.sync.metrics(),
                "trainer/version": float(t.version),
            }
            if t.version % self.sync_interval == 0:  # shared weights: records the version only
                self.sync.push(t.model, t.version)
                if self.colocated is not None:  # straight in while it sleeps (the explorer's pull then skips)
                    from trine.models.export import rollout_state_dict

                    self.colocated.load_weights(rollout_state_dict(t.model), t.version)
        finally:
            if self.colocated is not None:
                self.colocated.wake_up()
            self.stepping = False
        return metrics


@dataclass
class SupervisedSource:
    """``mode: train``: batches of supervised rows or preference pairs made from the taskset's rows."""

    scheduler: TaskScheduler
    batch_size: int
    make: Callable[[list[Task]], list[Experience]]
    """:func:`~trine.tasks.supervised.sft_experiences` or ``preference_experiences`` with their keys."""

    def next_batch(self, step: int, version: int) -> tuple[list[Experience], dict[str, float]] | None:
        """The next batch and its metrics (none), or None when the taskset is exhausted. (``step`` and
        ``version``, the stage's step and the trainer's version, are for sources that need them: a
        replay of stored steps.)"""
        tasks = self.scheduler.next_batch(self.batch_size)
        return (self.make(tasks), {}) if tasks else None

    def state_dict(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])


@dataclass
class BufferSource:
    """``mode: train`` with ``tasks.source: buffer``: batches of the rows that land in a persistent buffer
    (annotated preference pairs, SFT rows, stored rollouts), taken with ``buffer.get``.

    Each batch is ``buffer.get(rows, timeout=timeout)``. :meth:`more` fetches the next batch ahead, right
    after a step, so the step that turns out to be the last one is known as such (the loop then evaluates
    and checkpoints it as the stage's end); when nothing arrives in time the source ends and ``ended`` says
    why. A checkpoint keeps the batch fetched ahead (it has left the buffer), so a resume trains it first.
    """

    buffer: Buffer
    rows: int
    """Rows per step (``tasks.batch_size``; twice that for preference pairs)."""
    timeout: float
    """Seconds to wait for a batch (``buffer.get_timeout``)."""
    pairwise: bool = False
    """The algorithm trains on preference pairs: every row must be one (kind ``preference``)."""
    ahead: list[Experience] | None = None
    """The next batch, fetched by :meth:`more` and not trained yet."""
    ended: str | None = None
    """Why the source ended early (None while it has not)."""

    def next_batch(self, step: int, version: int) -> tuple[list[Experience], dict[str, float]] | None:
        """The batch fetched ahead, else the next one from the buffer (raising ``TimeoutError`` naming
        the buffer when none arrives: the stage has nothing to train on); None once the source ended."""
        if self.ahead is None and self.ended is None:
            batch = self._get()
            if batch is None:
                raise TimeoutError(
                    f"tasks.source: buffer: no batch of {self.rows} rows arrived in {self.buffer!r} within "
                    f"buffer.get_timeout={self.timeout}s ({self.ended}); check buffer.url and "
                    "buffer.storage_args.table (annotated pairs land in table 'preferences'), or raise get_timeout"
                )
            self.ahead = batch
        if self.ahead is None:
            return None
        batch, self.ahead = self.ahead, None
        return batch, self.buffer.metrics()

    def more(self) -> bool:
        """Fetch the next batch now (waiting up to ``timeout``); False (with ``ended`` set) if none came."""
        if self.ahead is None and self.ended is None:
            self.ahead = self._get()
        return self.ahead is not None

    def _get(self) -> list[Experience] | None:
        try:
            batch = self.buffer.get(self.rows, timeout=self.timeout)
        except TimeoutError as err:  # BufferTimeout: fewer rows than a batch arrived in time
            self.ended = f"no batch of {self.rows} rows within buffer.get_timeout={self.timeout}s: {err}"
            return None
        if self.pairwise:
            odd = [e for e in batch if e.kind != "preference"]
            if odd:
                raise ValueError(
                    f"tasks.source: buffer with a pairwise algorithm trains on preference pairs, but {self.buffer!r} "
                    f"handed out rows of kind {sorted({e.kind for e in odd})}; point buffer.storage_args.table at "
                    "the pairs (annotated pairs land in table 'preferences')"
                )
        return batch

    def state_dict(self) -> dict[str, Any]:
        ahead = None if self.ahead is None else [e.to_dict() for e in self.ahead]
        return {"buffer_source": {"buffer": self.buffer.state_dict(), "ahead": ahead, "ended": self.ended}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = state["buffer_source"]
        self.buffer.load_state_dict(mine["buffer"])
        self.ahead = None if mine["ahead"] is None else [Experience.from_dict(d) for d in mine["ahead"]]
        self.ended = mine["ended"]


class Source(Protocol):
    """What a trainer-only stage trains on (:class:`SupervisedSource`, :class:`BufferSource`, a replay of
    stored steps). A source that may run dry also has ``more() -> bool`` (see :mod:`trine.modes.train`)."""

    def next_batch(self, step: int, version: int) -> tuple[list[Experience], dict[str, float]] | None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class Evaluator:
    """``eval/<taskset>/*`` on the eval tasksets with the weights its explorer samples (the trainer's
    own in a run, a checkpoint's in ``trine bench``)."""

    explorer: Explorer
    tasksets: list[TaskSet]
    k: int = 1
    greedy: bool = True
    success_threshold: float = 1.0
    seed: int = 0
    """Evaluation at global step ``s`` samples with seed ``seed + s``."""
    table_rows: int = 8
    """Rollouts per taskset sent to the monitor as the table ``eval/<taskset>/samples``."""

    def plan(self) -> str:
        """What an evaluation runs, for the console: ``addition (100 tasks × 8 samples + greedy)``."""
        draws = " + ".join([f"{self.k} sample{'s' if self.k > 1 else ''}"] + ["greedy"] * self.greedy)
        return ", ".join(f"{ts.name} ({len(ts)} tasks × {draws})" for ts in self.tasksets)

    def evaluate(self, step: int, monitor: Any = None) -> dict[str, float]:
        """Metrics of every eval taskset at global ``step``; a few rollouts (prompt, response,
        reward) go to ``monitor`` as a table when one is given."""
        out: dict[str, float] = {}
        for ts in self.tasksets:
            rows: list[dict[str, Any]] = []
            out.update(
                self.explorer.evaluate(
                    list(ts),
                    name=ts.name,
                    k=self.k,
                    greedy=self.greedy,
                    success_threshold=self.success_threshold,
                    seed=self.seed + step,
                    samples=rows,
                )
            )
            if rows and monitor is not None:
                monitor.log_table(f"eval/{ts.name}/samples", rows[: self.table_rows], step)
        return out


@dataclass
class Stage:
    """One stage of a run: its roles and what the loop needs around them."""

    cfg: RunConfig
    trainer: TrainerSide
    total_steps: int
    explorer: ExplorerSide | None = None
    """None in ``mode: train``."""
    source: Source | None = None
    """``mode: train`` (and a replay) only."""
    evaluator: Evaluator | None = None
    """None without eval tasksets."""
    step: int = 0
    """Steps of this stage already done (non-zero after a resume)."""

    @property
    def gate(self) -> threading.Lock:
        """The explorer side's gate (a private lock when there is none)."""
        if self.explorer is not None:
            return self.explorer.gate
        return self.__dict__.setdefault("_gate", threading.Lock())

    def close(self) -> None:
        """Release what the stage's workflows hold (MCP servers, environment pools) once it is done."""
        explorers = [side.explorer for side in (self.explorer, self.evaluator) if side is not None]
        for explorer in {id(e): e for e in explorers}.values():
            explorer.close_workflows()

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint needs besides the trainer's weights and state (call with ``gate`` held)."""
        state: dict[str, Any] = {"stage_step": self.step}
        if self.explorer is not None:
            state["explorer"] = self.explorer.state_dict()
            from trine.models.export import base_model

            engine = self.explorer.engine
            own = getattr(engine, "model", None)  # None: an engine holding its own weights (vLLM)
            if own is not None and own is not base_model(self.trainer.trainer.model):  # a snapshot: keep it
                state["engine_weights"] = {
                    k: v.detach().cpu().clone() for k, v in engine.model.state_dict().items()
                }
        elif self.trainer.buffer is not None:  # a trainer process: its read position in the shared buffer
            state["buffer"] = self.trainer.buffer.state_dict()
        if self.source is not None:
            state.update(self.source.state_dict())
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = state["stage_step"]
        if self.explorer is not None:
            self.explorer.load_state_dict(state["explorer"])
            if "engine_weights" in state:
                self.explorer.engine.model.load_state_dict(state["engine_weights"])
            elif getattr(self.explorer.engine, "model", None) is None:  # the trainer's weights, loaded in
                from trine.models.export import rollout_state_dict

                trained = self.trainer.trainer.model
                self.explorer.engine.load_weights(rollout_state_dict(trained), self.trainer.version)
            else:
                self.explorer.engine.policy_version = self.trainer.version
        elif self.trainer.buffer is not None and "buffer" in state:
            self.trainer.buffer.load_state_dict(state["buffer"])
        if self.source is not None:
            self.source.load_state_dict(state)
        if self.explorer is None and self.evaluator is not None:  # mode train: evaluation only
            self.evaluator.explorer.model.policy_version = self.trainer.version
