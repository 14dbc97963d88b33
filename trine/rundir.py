"""The run directory: resolved config, status, checkpoints, resume state and the run summary.

``RunDir.open(stages)`` prepares ``runs/<name>/`` (or continues it), loads the policy (from the
last checkpoint when resuming) and the monitor; ``save``/``restore`` checkpoint and restore a
stage (:meth:`trine.stage.Stage.state_dict` / :func:`restore_stage`: what a checkpoint holds besides
the weights);
``finish``/``interrupted``/``fail`` record how the run ended in ``status.json`` (see
:mod:`trine.status`: pid, host, torch threads and a heartbeat while it runs) so that a directory whose run
failed or died says so, and send the alert (``monitor.alerts``, :mod:`trine.monitor.alerts`; also on
``stuck`` and ``alarm``). ``begin`` hands a stage to the stuck rule (:mod:`trine.monitor.progress`: what
its sides wait for), ``save`` and ``evaluate`` mark their time as not a step's, and ``evaluate`` ends a
stage on a plateau (``eval.plateau``). Each checkpoint records the torch threads too: a run resumed with another count
says so (CPU results can depend on it, :mod:`trine.threads`).

Resuming rewinds the records to the checkpoint: the lines of ``metrics.jsonl`` and
``rollouts.jsonl`` written after it (by the timeline that crashed or was killed) are moved to
``metrics.jsonl.rewound`` / ``rollouts.jsonl.rewound``, so that any reader (pandas, jq) sees each
step once; TensorBoard hides them (``purge_step``); see the W&B and MLflow sinks for theirs.
"""

from __future__ import annotations

import contextlib
import logging
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from trine.config import RunConfig
from trine.stage import Stage
from trine.status import Heartbeat, beat_interval, read_status, write_status

log = logging.getLogger("trine.rundir")

RECORDS = ("metrics.jsonl", "rollouts.jsonl")
"""Append-only records in the run directory, cut back to the checkpoint on resume."""


@dataclass
class RunDir:
    path: Path
    stages: list[RunConfig]
    model: Any = None
    tokenizer: Any = None
    monitor: Any = None
    step: int = 0
    """Global step: steps done over all stages."""
    summary: dict[str, Any] = field(default_factory=dict)
    checkpoint: Path | None = None
    """The checkpoint being resumed from (None for a fresh run)."""
    state: dict[str, Any] = field(default_factory=dict)
    trainer_state: dict[str, Any] = field(default_factory=dict)
    heartbeat: Heartbeat | None = None
    threads: int = 0
    """The torch threads this process runs with (:func:`trine.threads.use_threads`), recorded in
    ``status.json`` and in each checkpoint."""
    watch: Any = None
    """The stuck rule (:class:`trine.monitor.progress.StepWatch`), checked by the heartbeat thread."""
    alerts: Any = None
    """Where alerts go (:class:`trine.monitor.alerts.Alerts`)."""
    stage_name: str | None = None
    """The stage running now (in alerts)."""

    @classmethod
    def open(cls, stages: list[RunConfig], load_policy: Callable[..., tuple[Any, Any]]) -> RunDir:
        """Continue (or start) the run directory of ``stages``; when its last checkpoint says every
        stage is done, nothing is loaded or written (check :attr:`done`). ``load_policy(cfg, path=...,
        say=...)`` loads the model and tokenizer (from the checkpoint's directory when resuming), saying so."""
        from trine.monitor import build_monitor
        from trine.monitor.figures import preload as preload_plots
        from trine.threads import about, resumed_note, say_now, use_threads
        from trine.trainer.checkpoint import list_checkpoints, load_states

        first = stages[0]
        path = first.run_path
        found = list_checkpoints(path / "checkpoints") if first.resume else []
        checkpoint = found[-1] if found else None
        trainer_state, state = load_states(checkpoint) if checkpoint else ({}, {})
        step = state.get("global_step", 0)
        summary = state.get("summary", {"run_dir": str(path), "stages": {}})
        rd = cls(path, stages, step=step, summary=summary, checkpoint=checkpoint, state=state)
        if rd.done:  # killed after its last checkpoint, before it said so: say so now
            if (path / "status.json").is_file() and read_status(path).get("state") != "finished":
                write_status(path, "finished", step=step, reason="the last checkpoint completed every stage")
            return rd
        rd.trainer_state = trainer_state
        rd.threads = use_threads(first.num_threads)
        if checkpoint is not None and (
            note := resumed_note(state.get("threads"), rd.threads, checkpoint.name)
        ):
            say_now(note)
        path.mkdir(parents=True, exist_ok=True)
        config = _resolved_config(stages, path)
        (path / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        rewind_records(path, state)
        interval = beat_interval(first.sync.wait_timeout)  # explorer processes watch it (launch/liveness)
        rd.alerts, rd.watch = _watchers(rd, first)
        rd.heartbeat = Heartbeat(path, step, interval=interval, about=about(rd.threads), watch=rd.watch)
        try:
            say(f"run {first.name}: {_plan(stages)} in {path}")
            rd.model, rd.tokenizer = load_policy(first, path=str(checkpoint) if checkpoint else None, say=say)
            totals = [s.tasks.total_steps for s in stages]
            if first.monitor.plot:  # the end-of-run plots' matplotlib import, while the run runs
                preload_plots()
            rd.monitor = build_monitor(
                first.monitor.sinks,
                path,
                total_steps=None if None in totals else sum(totals),
                config=config,
                resume_step=step,
            )
            rd.monitor.sinks.append(_alarm_sink(stages, rd.heartbeat, rd.alert))
        except BaseException as err:
            rd.fail(err)
            raise
        return rd

    @property
    def done(self) -> bool:
        """True when the checkpoint resumed from finished the last stage: nothing left to run."""
        return bool(self.state) and self.resume_at() >= len(self.stages)

    def resume_at(self) -> int:
        """Index of the first stage that still has work."""
        return self.state["stage_index"] + self.state["stage_done"] if self.state else 0

    def begin(self, stage: Stage, index: int) -> None:
        """Start stage ``index``: :meth:`restore` it, and watch its steps with its ``monitor`` settings
        (what its sides wait for: :meth:`Stage.waiting_on`)."""
        self.restore(stage, index)
        self.stage_name = stage.cfg.stage
        if self.watch is not None:
            self.watch.configure(stage.cfg.monitor.stuck_after, stage.cfg.monitor.stuck_min_seconds)
            self.watch.waiting = stage.waiting_on
            self.watch.set_phase("step")

    def evaluate(self, stage: Stage, record: dict[str, Any]) -> dict[str, float]:
        """Evaluate the stage at the current step (its time is not a step's for the stuck rule); the eval
        metrics and ``time/eval_seconds``. With ``eval.plateau``, a plateau ends the stage here (its
        ``total_steps`` becomes this step; ``stage/ended_early`` 1, the reason in the summary, the console
        and ``status.json``'s ``ended_early``)."""
        began = time.perf_counter()
        with self._during("eval"):
            record["eval_end"] = stage.evaluator.evaluate(self.step, self.monitor)
        record["eval_key"] = stage.evaluator.key(self.step)
        out = {**record["eval_end"], "time/eval_seconds": time.perf_counter() - began}
        if stage.cfg.eval.plateau is not None and stage.step < stage.total_steps:
            if why := _plateau(stage.cfg.eval.plateau, record):
                stage.total_steps = stage.step
                record["ended"] = f"stage ended early at step {self.step}: plateau of {why}"
                say(f"[{stage.cfg.stage}] {record['ended']}")
                if self.heartbeat is not None:
                    self.heartbeat.note(
                        "ended_early", {"stage": stage.cfg.stage, "step": self.step, "reason": why}
                    )
                out["stage/ended_early"] = 1.0
        return out

    def evaluate_start(self, stage: Stage, record: dict[str, Any]) -> None:
        """The evaluation before the stage's first step, logged (reused when the stage before ended on the
        same weights: its end)."""
        seen = stage.evaluator.seen(self.step, self.summary["stages"])  # the stage before's end: same weights
        what = "reusing the evaluation of" if seen else "evaluating"
        say(f"[{stage.cfg.stage}] {what} step {self.step} on {stage.evaluator.plan()} ...")
        with self._during("eval"):
            record["eval_start"] = seen or stage.evaluator.evaluate(self.step, self.monitor)
        if not seen:
            self.monitor.log({**record["eval_start"], "stage": stage.cfg.stage}, self.step)

    def alert(self, event: str, reason: str, **extra: Any) -> None:
        """Send the alert ``event`` (``monitor.alerts``) at the current step and stage."""
        if self.alerts is not None:
            self.alerts.send(event, reason, step=self.step, stage=self.stage_name, **extra)

    def _during(self, phase: str) -> Any:
        """``phase`` for the stuck rule while the block runs (``eval``, ``checkpoint``)."""
        return self.watch.during(phase) if self.watch is not None else contextlib.nullcontext()

    def restore(self, stage: Stage, index: int) -> None:
        """Put ``stage`` back where the checkpoint left it, if the checkpoint is inside it."""
        from trine.trainer.checkpoint import set_rng_state

        if self.state and index == self.state["stage_index"]:
            restore_stage(stage, self.state, self.trainer_state, self.checkpoint)
            set_rng_state(self.state["rng"])

    def beat(self) -> None:
        """Record in ``status.json`` that the run is alive at the current step."""
        if self.heartbeat is not None:
            self.heartbeat.beat(self.step)

    def save(self, stage: Stage, index: int, done: bool) -> None:
        """Checkpoint the stage (weights, trainer, task cursor, buffer, explorer RNG, the sizes of the
        records) atomically."""
        from trine.trainer.checkpoint import save_checkpoint

        trainer = stage.trainer.trainer
        with self._during("checkpoint"), stage.gate:  # the explorer appends rollouts under the gate
            state = {
                **stage.state_dict(),
                "stage_index": index,
                "global_step": self.step,
                "stage_done": done,
                "summary": self.summary,
                "threads": self.threads,
                "records": {n: (self.path / n).stat().st_size for n in RECORDS if (self.path / n).is_file()},
            }
            from trine.trainer.policy import own_weights

            save_checkpoint(
                self.path / "checkpoints",
                self.step,
                model=trainer.model,
                tokenizer=self.tokenizer,
                trainer_state=trainer.state_dict(),
                loop_state=state,
                keep=stage.cfg.trainer.keep_checkpoints,
                extra_models={"ref_model": ref}
                if (ref := own_weights(trainer.ref_model)) is not None
                else None,
            )
        if done and self.watch is not None:  # the stage is over: building the next one is no step
            self.watch.set_phase("starting")

    def finish(self, how: str) -> dict[str, Any]:
        """Close the monitor, record ``how`` the run ended, draw the plots; returns the summary."""
        self.monitor.close()
        details = {"reason": "stop_after_steps reached; run again to continue"} if how == "stopped" else {}
        self._end(how, **details)
        if how == "finished" and self.stages[0].monitor.plot:
            from trine.monitor.plot import plot_run

            self.summary["plots"] = [str(p) for p in plot_run(self.path)]
        return self.summary

    def interrupted(self, how: str = "KeyboardInterrupt") -> None:
        """Ctrl-C or SIGTERM: close the monitor and record ``stopped`` (run again to continue from the
        last checkpoint); ``how`` names the interruption in the status's reason."""
        self._close_monitor()
        self._end("stopped", reason=f"interrupted ({how}); run again to resume")

    def fail(self, err: BaseException) -> None:
        """Close the monitor and record ``failed`` with the error and its traceback."""
        self._close_monitor()
        self._end("failed", error=f"{type(err).__name__}: {err}", traceback=traceback.format_exc())

    def _close_monitor(self) -> None:
        try:
            if self.monitor is not None:
                self.monitor.close()
        except Exception as err:  # enrich: the run's own error is the one to report
            log.warning("closing the monitor failed: %s: %s", type(err).__name__, err)

    def _end(self, state: str, **details: Any) -> None:
        if self.heartbeat is not None:
            self.heartbeat.step = self.step
            self.heartbeat.end(state, **details)
        if self.alerts is not None:  # at most monitor.alerts.timeout_seconds
            self.alert(state, str(details.get("reason") or details.get("error") or state))
            self.alerts.close()


def _alarm_sink(stages: list[RunConfig], heartbeat: Heartbeat, alert: Callable[..., None]) -> Any:
    """The sink that raises the stages' alarms (``monitor.alarms``), says each, keeps it in
    ``status.json`` and sends its alert."""
    from trine.monitor.alarms import AlarmSink

    def raised(alarm: Any) -> None:
        say(f"ALARM {alarm.message}")
        heartbeat.alarm(alarm.as_dict())
        alert("alarm", alarm.message, alarm=alarm.as_dict())

    settings = {
        s.stage: (s.monitor.alarms, s.tasks.train.sampling.max_tokens if s.tasks.train else None)
        for s in stages
    }
    return AlarmSink(settings, raised)


def _watchers(rd: RunDir, cfg: RunConfig) -> tuple[Any, Any]:
    """The run's alerts (``monitor.alerts``) and its stuck rule (``monitor.stuck_after``), which says when
    the run becomes stuck and sends that alert."""
    from trine.monitor.alerts import Alerts
    from trine.monitor.progress import StepWatch

    alerts = Alerts(cfg.monitor.alerts, cfg.name, rd.path)
    m = cfg.monitor
    stuck = lambda record: rd.alert("stuck", record["reason"], stuck=record)  # noqa: E731
    return alerts, StepWatch(m.stuck_after, m.stuck_min_seconds, on_stuck=stuck, say=say)


def _plateau(settings: Any, record: dict[str, Any]) -> str | None:
    """Add the stage's latest evaluation (``record["eval_end"]``) to its history (``record["plateau"]``,
    the one at its start first) and say why it has plateaued (:func:`trine.monitor.progress.plateau`)."""
    from trine.monitor.alarms import main_eval_key
    from trine.monitor.progress import plateau

    latest = record["eval_end"]
    key = settings.metric or main_eval_key(latest)
    history = record.setdefault("plateau", [])
    if not history and isinstance(record.get("eval_start", {}).get(key), (int, float)):
        history.append(record["eval_start"][key])
    if key is None or not isinstance(latest.get(key), (int, float)):
        found = ", ".join(sorted(k for k in latest if k.startswith("eval/"))) or "none"
        watched = f"eval.plateau.metric={key!r} is" if key else "no accuracy, avg@k or pass@k is"
        raise ValueError(
            f"{watched} not among the evaluation's metrics ({found}); set eval.plateau.metric to one of them"
        )
    history.append(latest[key])
    why = plateau(history, settings.evals, settings.min_delta)
    return f"{key}: {why}" if why else None


def restore_stage(stage: Stage, state: dict[str, Any], trainer_state: dict[str, Any], path: Path) -> None:
    """Put a freshly built stage back where the checkpoint at ``path`` left it."""
    trainer = stage.trainer.trainer
    from trine.trainer.policy import own_weights

    trainer.load_state_dict(trainer_state)
    ref = own_weights(trainer.ref_model)
    if ref is not None:  # the reference is the stage's starting weights, not the checkpoint's
        from safetensors.torch import load_file

        ref.load_state_dict(load_file(str(Path(path) / "ref_model" / "model.safetensors")), strict=False)
    stage.load_state_dict(state)


def say(text: str) -> None:
    """A progress line on the console (what the run is doing before its first step line)."""
    print(text, flush=True)


def _plan(stages: list[RunConfig]) -> str:
    """``sft (train, 200 steps) → grpo (sync, 300 steps)``; one stage: ``sync, 300 steps``."""

    def what(s: RunConfig) -> str:
        return s.mode + (f", {s.tasks.total_steps} steps" if s.tasks.total_steps else "")

    return what(stages[0]) if len(stages) == 1 else " → ".join(f"{s.stage} ({what(s)})" for s in stages)


def _resolved_config(stages: list[RunConfig], path: Path) -> dict[str, Any]:
    """The config as run, with ``run_dir`` set to the directory actually used."""
    dumped = [{**s.model_dump(mode="json", exclude={"stages"}), "run_dir": str(path)} for s in stages]
    return dumped[0] if len(dumped) == 1 else {"stages": dumped}


def rewind_records(path: Path, state: dict[str, Any]) -> None:
    """Cut ``metrics.jsonl`` and ``rollouts.jsonl`` back to what they held at the checkpoint ``state``
    (everything, for a fresh start), moving the cut lines to ``<name>.rewound`` for forensics.

    The checkpoint records each file's size; a checkpoint written before it did is handled for
    ``metrics.jsonl`` by step (lines after its ``global_step`` are cut).
    """
    sizes = state.get("records") if state else {}
    for name in RECORDS:
        file = path / name
        if not file.is_file():
            continue
        keep = sizes.get(name, 0) if sizes is not None else None
        data = file.read_bytes()
        if keep is None:  # older checkpoint: no sizes
            if name != "metrics.jsonl":
                continue
            keep = _bytes_through_step(data, state.get("global_step", 0))
        if keep >= len(data):
            continue
        with (path / f"{name}.rewound").open("ab") as out:
            out.write(data[keep:] if data.endswith(b"\n") else data[keep:] + b"\n")
        with file.open("rb+") as handle:
            handle.truncate(keep)
        log.info(
            "%s: moved %d bytes written after the checkpoint to %s.rewound", file, len(data) - keep, name
        )


def _bytes_through_step(data: bytes, step: int) -> int:
    """Length of the leading lines of a metrics file whose ``step`` is at most ``step``."""
    import json

    end = 0
    for line in data.splitlines(keepends=True):
        try:
            if json.loads(line).get("step", 0) > step:
                break
        except ValueError:
            break
        end += len(line)
    return end
