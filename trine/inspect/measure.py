"""``trine plan CONFIG``: measure a few real steps of every stage, then extrapolate to the whole run.

Nothing is written into the run's directory: the stages are copied with ``run_dir`` set to a temporary
directory (removed at the end), a model that ``model.init_preset`` would build is built there, metric
sinks that leave the machine (wandb, mlflow) are left out and a PostgreSQL ``buffer.url`` is replaced by
SQLite in the temporary directory. Then the real path runs, in this process: the config's data checks,
:class:`~trine.rundir.RunDir` (threads, model load, monitor), and per stage :func:`trine.build.build_stage`
and its mode's step generator (:func:`trine.modes.steps`), timed step by step with the per-step logging
the loop does; then one evaluation, one checkpoint, and at the end the monitor's close and plots.

Each stage runs ``warmup`` steps (timed whole: first calls, an async explorer's ramp-up), then at least
``steps`` more and until ``min_seconds`` have passed (:mod:`trine.inspect.measure_stage`);
:mod:`trine.inspect.estimate` turns the samples into the run's wall-clock. With ``launch: processes`` this
process is the trainer beside real explorer processes (:mod:`trine.inspect.measure_processes`).
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trine.config import RunConfig
from trine.inspect.estimate import Options, PlanError, RunEstimate
from trine.inspect.measure_stage import plan_inline

REMOTE_SINKS = ("wandb", "mlflow")
"""Metric sinks the plan leaves out: they would log a run that does not exist to a service."""


def refusals(stages: list[RunConfig]) -> list[str]:
    """Why ``trine plan`` cannot measure these stages (empty: it can), one line per stage and reason."""
    out = []
    for i, cfg in enumerate(stages):
        where = f"stages.{i} ({cfg.stage})" if len(stages) > 1 else "the config"
        if cfg.plan.launcher == "ray":
            out.append(f"{where} runs on Ray (cluster.backend: ray), which trine plan does not measure; "
                       "plan it with cluster.backend=local (launch=processes for its processes)")  # fmt: skip
        if cfg.tasks.source in ("serve", "buffer"):
            out.append(f"{where} has tasks.source: {cfg.tasks.source}: its steps come from agents or stored "
                       "rows, which a plan cannot replay without touching the run's buffer")  # fmt: skip
    return out


def plan(
    stages: list[RunConfig],
    config: str,
    options: Options,
    say: Callable[[str], None],
    plugins: list[Path] | None = None,
) -> RunEstimate:
    """Measure ``stages`` (loaded from ``config``; ``plugins``: the ``--plugin`` files it needs) and estimate
    the whole run (see the module docstring)."""
    problems = refusals(stages)
    if problems:
        raise PlanError("trine plan cannot measure this config: " + "; ".join(problems))
    began = time.perf_counter()
    notes = _notes(stages)
    with tempfile.TemporaryDirectory(prefix="trine-plan-") as tmp:
        probe = [copy_stage(cfg, Path(tmp)) for cfg in stages]
        if probe[0].plan.launcher == "processes":
            from trine.inspect.measure_processes import plan_processes

            est = plan_processes(probe[0], Path(tmp), config, options, say, list(plugins or []))
        else:
            est = plan_inline(probe, config, options, say, Path(tmp))
    if any(cfg.monitor.sinks != p.monitor.sinks for cfg, p in zip(stages, probe)):
        notes.append(
            "the wandb / mlflow sinks were left out of the measurement (their logging is not counted)"
        )
    return dataclasses.replace(est, plan_seconds=time.perf_counter() - began, notes=[*est.notes, *notes])


def copy_stage(cfg: RunConfig, tmp: Path) -> RunConfig:
    """``cfg`` with everything it would write moved into ``tmp`` (see the module docstring)."""
    update: dict[str, Any] = {"run_dir": str(tmp / "run"), "resume": False}
    m = cfg.model
    if m.init_preset and not Path(m.path).exists():  # built on first run: build it in tmp, timed
        update["model"] = m.model_copy(update={"path": str(tmp / "model")})
    sinks = [s for s in cfg.monitor.sinks if s not in REMOTE_SINKS]
    update["monitor"] = cfg.monitor.model_copy(update={"sinks": sinks})
    if cfg.buffer.url is not None:
        update["buffer"] = cfg.buffer.model_copy(update={"url": None})
    return cfg.model_copy(update=update)


def _notes(stages: list[RunConfig]) -> list[str]:
    """What the reader should know about the measurement of ``stages``."""
    from trine.trainer.checkpoint import list_checkpoints

    out = []
    if stages[0].num_threads == "auto":
        out.append("num_threads: auto chose the threads from the load at the start of the plan; a run started "
                   "at another load may choose another count (set num_threads to pin it)")  # fmt: skip
    limit = stages[0].stop_after_steps
    if limit is not None:
        out.append(f"stop_after_steps: {limit}: `trine run` stops after {limit} steps (run again to go on); "
                   "this is the estimate of every stage to its end")  # fmt: skip
    early = [cfg.stage for cfg in stages if cfg.eval.plateau is not None]
    if early:
        out.append(f"eval.plateau may end {', '.join(early)} early: this is the estimate of every step")
    found = list_checkpoints(stages[0].run_path / "checkpoints") if stages[0].resume else []
    if found:
        out.append(f"{stages[0].run_path} has a checkpoint ({found[-1].name}): `trine run` resumes there, "
                   "so it takes less than this estimate of the whole run")  # fmt: skip
    return out
