"""The trainer side of the loop (DESIGN §1): buffer → trainer → weight sync."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trine.types import Experience

if TYPE_CHECKING:
    from trine.buffer import Buffer
    from trine.sync import WeightSync
    from trine.trainer import Trainer
    from trine.trainer.rewards import VersionRewards
    from trine.trainer.side import TrainerSide


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
    rewards: VersionRewards | None = None
    """Adds the reward per weights version to each step's metrics (a trainer process, ``trine train``)."""
    waiting_since: float | None = None
    """``time.monotonic()`` when :meth:`consume` began waiting for rows it has not got yet (None: not
    waiting); kept over the short waits a mode repeats, cleared when a batch comes (:meth:`waiting_on`)."""

    @property
    def version(self) -> int:
        return self.trainer.version

    def batches_waiting(self) -> int:
        """Explored batches in the buffer that no step has taken yet."""
        return self.buffer.batches_waiting() if self.buffer is not None else 0

    def waiting_on(self) -> dict[str, str]:
        """``{"trainer": "waiting for rows (3 of 8 in the buffer, 1 pending a reward) for 640s"}`` while
        :meth:`consume` waits for a batch, else ``{}`` (for a stuck run's report; read from another thread)."""
        since = self.waiting_since
        if since is None or self.buffer is None:
            return {}
        m = self.buffer.metrics()
        rows = f"{m['buffer/size']:.0f}" + ("" if self.batch_size is None else f" of {self.batch_size}")
        pending = f", {m['buffer/pending']:.0f} pending a reward" if m.get("buffer/pending") else ""
        what = "an explored batch" if self.batch_size is None else "rows"
        seconds = time.monotonic() - since
        return {"trainer": f"waiting for {what} ({rows} in the buffer{pending}) for {seconds:.0f}s"}

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
        if self.waiting_since is None:
            self.waiting_since = time.monotonic()
        experiences = self.buffer.get(self.batch_size, current_version=t.version, timeout=wait)
        self.waiting_since = None
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
                **(self.rewards.add(experiences) if self.rewards is not None else {}),
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
