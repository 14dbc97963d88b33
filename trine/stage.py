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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trine.config import RunConfig
    from trine.explorer.evaluator import Evaluator
    from trine.explorer.side import ExplorerSide
    from trine.trainer.side import TrainerSide
    from trine.trainer.sources import Source


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

    def waiting_on(self) -> dict[str, str]:
        """What each side of the stage waits for now (``trainer``, ``explorer``, ``tasks``): a stuck run's
        report (:class:`trine.monitor.progress.StepWatch`), read from the heartbeat thread."""
        out = self.trainer.waiting_on()
        if self.explorer is not None:
            out.update(self.explorer.waiting_on())
        return out

    def close(self) -> None:
        """Release what the stage's workflows hold (MCP servers, environment pools) and its rollout engines
        (their worker threads) once it is done: nothing of a stage outlives it."""
        explorers = [side.explorer for side in (self.explorer, self.evaluator) if side is not None]
        for explorer in {id(e): e for e in explorers}.values():
            explorer.close_workflows()
        engines = [e.model for e in explorers]  # each explorer's rollout engine
        for engine in {id(e): e for e in engines}.values():
            engine.close()

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
