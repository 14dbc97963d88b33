"""The loop: tasks → explorer → buffer → trainer → weights, and its modes, in data-flow order.

A run is a list of stages (one unless the config chains several); each stage's roles (:mod:`trine.stage`)
are built by :mod:`trine.build` and driven by its mode's step generator (:mod:`trine.modes`: ``sync``,
``offset``, ``train`` — different wirings of the same objects), which yields one metrics dict per
training step. This module keeps what every mode shares: stages, evaluation and checkpoint cadence,
logging, and the run's status.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from trine import build, modes
from trine.config import RunConfig
from trine.inspect import preflight
from trine.monitor.summary import track_step
from trine.rundir import RunDir
from trine.stage import Stage
from trine.status import at_step_boundaries, check_stop, stop_requested, stopping
from trine.trainer.ranks import rank_stages


def run(stages: list[RunConfig], part: str = "all", source: Any = None) -> dict[str, Any]:
    """Run every stage in order (resuming where the run directory left off); returns the summary.
    ``part="trainer"``: the trainer process of an async run (:mod:`trine.launch.processes`); ``source``:
    train on it alone (a replay, :mod:`trine.launch.replay`)."""
    if part == "all":  # several trainer ranks under torchrun: this rank's view (`trine train`: its own call)
        stages = rank_stages(stages, part)
    preflight.check(stages)  # data and model files, before anything is written
    rd = RunDir.open(stages, build.load_policy)
    if rd.done:
        print(f"already finished: nothing to do ({rd.path} is complete at step {rd.step})", flush=True)
        return rd.summary
    if rd.checkpoint is not None:
        print(f"resuming from step {rd.step} (checkpoint {rd.checkpoint})", flush=True)
    try:
        for index, cfg in enumerate(stages):
            if index < rd.resume_at():
                continue
            print(f"[{cfg.stage}] stage {index + 1}/{len(stages)}: mode {cfg.mode}, building ...", flush=True)
            stage = build.build_stage(cfg, rd.model, rd.tokenizer, rd.path, part, source)
            rd.begin(stage, index)
            try:
                _run_stage(stage, index, rd)
            finally:
                stage.close()
            check_stop()  # a stop signal something swallowed still stops the run (and says so)
            limit = cfg.stop_after_steps
            if stage.step < stage.total_steps or (limit and rd.step >= limit and index < len(stages) - 1):
                return rd.finish("stopped")  # run again to continue
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM under `trine run` (status.Terminated)
        note = getattr(err, "stop_note", "mid-step: the newest checkpoint is where it resumes")
        rd.interrupted(f"{type(err).__name__} {note}")
        raise
    except BaseException as err:
        rd.fail(err)
        raise
    return rd.finish("finished")


def _run_stage(st: Stage, index: int, rd: RunDir) -> None:
    """Drive one stage's steps: log each, evaluate and checkpoint when due. A stop signal (Ctrl-C, SIGTERM)
    ends the stage at the next step boundary with a checkpoint of that step (:func:`_stop_here`)."""
    cfg = st.cfg
    record = rd.summary["stages"].setdefault(cfg.stage, {"seconds": 0.0})
    saved = st.step  # the stage's step of the newest checkpoint (this stage's start, or where it resumed)
    with at_step_boundaries(), contextlib.closing(modes.steps(st)) as steps:
        if st.step == 0 and cfg.eval.at_start and st.evaluator:
            rd.evaluate_start(st, record)
        if stop_requested():
            _stop_here(st, index, rd, saved)
        tick = time.perf_counter()
        for metrics in steps:
            rd.step, st.step = rd.step + 1, st.step + 1
            last = st.step >= st.total_steps
            stop = cfg.stop_after_steps is not None and rd.step >= cfg.stop_after_steps
            if st.evaluator and (last or (cfg.eval.every and st.step % cfg.eval.every == 0)):
                metrics.update(rd.evaluate(st, record))  # eval.plateau: may end the stage at this step
                last = st.step >= st.total_steps
            now = time.perf_counter()
            metrics.update({"time/step_seconds": now - tick, "stage": cfg.stage})
            record["seconds"] += now - tick
            track_step(record, metrics, st.total_steps)
            if getattr(st.source, "ended", None):  # a buffer source ran dry (tasks.source: buffer)
                record["ended"] = st.source.ended
            rd.monitor.log(metrics, rd.step)
            rd.beat()
            if last or stop or (cfg.trainer.save_every and st.step % cfg.trainer.save_every == 0):
                rd.save(st, index, done=last)
                saved = st.step
            if stop_requested():
                _stop_here(st, index, rd, saved)
            if stop or last:
                break
            tick = time.perf_counter()
        if stop_requested():  # the mode stopped waiting for a batch
            _stop_here(st, index, rd, saved)
        if st.step >= st.total_steps and st.step != saved:  # the mode ended the stage after a step (idle)
            rd.save(st, index, done=True)


def _stop_here(st: Stage, index: int, rd: RunDir, saved: int) -> None:
    """A stop signal was received: checkpoint the step the stage is at (unless it is the newest
    checkpoint), then raise the stop (exit 130 / 143; the same command resumes from this step)."""
    stopping()
    if st.step != saved:
        rd.save(st, index, done=st.step >= st.total_steps)
        note = f"at step {rd.step}, checkpoint written"
    else:
        note = f"at step {rd.step}, its checkpoint already written" if rd.step else "before the first step"
    print(f"[{st.cfg.stage}] stopped {note}; run the same command again to resume", flush=True)
    try:
        check_stop()
    except KeyboardInterrupt as err:
        err.stop_note = note  # type: ignore[attr-defined]
        raise
