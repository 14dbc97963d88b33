"""The run directory: resolved config, status, checkpoints, resume state and the run summary.

``RunDir.open(stages)`` prepares ``runs/<name>/`` (or continues it), loads the policy (from the
last checkpoint when resuming) and the monitor; ``save``/``restore`` checkpoint and restore a
stage; ``finish``/``fail`` record how the run ended in ``status.json`` so that a directory whose
run failed says so.
"""

from __future__ import annotations

import json
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trine import build
from trine.config import RunConfig


@dataclass
class RunDir:
    path: Path
    stages: list[RunConfig]
    model: Any
    tokenizer: Any
    monitor: Any
    step: int = 0
    """Global step: steps done over all stages."""
    summary: dict[str, Any] = field(default_factory=dict)
    checkpoint: Path | None = None
    """The checkpoint being resumed from (None for a fresh run)."""
    state: dict[str, Any] = field(default_factory=dict)
    trainer_state: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def open(cls, stages: list[RunConfig]) -> RunDir:
        from trine.monitor import build_monitor
        from trine.trainer.checkpoint import list_checkpoints, load_states

        first = stages[0]
        path = Path(first.run_dir) if first.run_dir else Path("runs") / first.name
        build.set_threads(first.num_threads)
        found = list_checkpoints(path / "checkpoints") if first.resume else []
        checkpoint = found[-1] if found else None
        trainer_state, state = load_states(checkpoint) if checkpoint else ({}, {})
        path.mkdir(parents=True, exist_ok=True)
        dumped = [s.model_dump(mode="json", exclude={"stages"}) for s in stages]
        (path / "config.yaml").write_text(
            yaml.safe_dump(dumped[0] if len(dumped) == 1 else {"stages": dumped}, sort_keys=False)
        )
        _status(path, "running", step=state.get("global_step", 0))
        model, tokenizer = build.load_policy(first, path=str(checkpoint) if checkpoint else None)
        totals = [s.tasks.total_steps for s in stages]
        monitor = build_monitor(
            first.monitor.sinks, path, total_steps=None if None in totals else sum(totals)
        )
        summary = state.get("summary", {"run_dir": str(path), "stages": {}})
        return cls(
            path,
            stages,
            model,
            tokenizer,
            monitor,
            state.get("global_step", 0),
            summary,
            checkpoint,
            state,
            trainer_state,
        )

    def resume_at(self) -> int:
        """Index of the first stage that still has work."""
        return self.state["stage_index"] + self.state["stage_done"] if self.state else 0

    def restore(self, stage: build.Stage, index: int) -> None:
        """Put ``stage`` back where the checkpoint left it, if the checkpoint is inside it."""
        from trine.trainer.checkpoint import set_rng_state

        if self.state and index == self.state["stage_index"]:
            build.restore_stage(stage, self.state, self.trainer_state, self.checkpoint)
            set_rng_state(self.state["rng"])

    def save(self, stage: build.Stage, index: int, done: bool) -> None:
        """Checkpoint the stage (weights, trainer, task cursor, buffer, explorer RNG) atomically."""
        from trine.trainer.checkpoint import save_checkpoint

        trainer = stage.trainer
        with stage.gate:
            state = {
                **build.stage_state(stage),
                "stage_index": index,
                "global_step": self.step,
                "stage_done": done,
                "summary": self.summary,
            }
            save_checkpoint(
                self.path / "checkpoints",
                self.step,
                model=trainer.model,
                tokenizer=self.tokenizer,
                trainer_state=trainer.state_dict(),
                loop_state=state,
                keep=stage.cfg.trainer.keep_checkpoints,
                extra_models={"ref_model": trainer.ref_model} if trainer.ref_model is not None else None,
            )

    def finish(self, how: str) -> dict[str, Any]:
        """Close the monitor, record ``how`` the run ended, draw the plots; returns the summary."""
        self.monitor.close()
        _status(self.path, how, step=self.step)
        if how == "finished" and self.stages[0].monitor.plot:
            from trine.monitor.plot import plot_run

            self.summary["plots"] = [str(p) for p in plot_run(self.path)]
        return self.summary

    def fail(self, err: BaseException) -> None:
        self.monitor.close()
        _status(
            self.path,
            "failed",
            step=self.step,
            error=f"{type(err).__name__}: {err}",
            traceback=traceback.format_exc(),
        )


def _status(path: Path, state: str, **details: Any) -> None:
    """``status.json``: running / stopped / failed (with the error) / finished."""
    (path / "status.json").write_text(json.dumps({"state": state, **details}, indent=2, default=str))
