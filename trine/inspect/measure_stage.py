"""``trine plan``: a run in this process, measured stage by stage (:func:`plan_inline`,
:func:`measure_stage`).

The stage is built by :func:`trine.build.build_stage` on the run's model (the previous stage's weights, as
in a run) and driven by its mode's step generator (:func:`trine.modes.steps`) the way :mod:`trine.loop`
drives it: each step counted, logged to the monitor and beaten into ``status.json``, so a measured step
costs what a run's step costs. Warm-up steps are timed whole; then one evaluation (of the whole eval set,
or of its first ``eval_tasks`` tasks per taskset, scaled up) and one checkpoint are timed. The parts of a
step come from the metrics the step logs (``time/explore_seconds``, ``time/train_seconds``,
``sync/seconds``), the reward from its own calls on the taskset's answers; peak memory from the process
(``ru_maxrss``) and CUDA (``max_memory_allocated``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import itertools
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trine.config import RunConfig
from trine.inspect.estimate import (
    Cost,
    Options,
    RunEstimate,
    Spread,
    StageEstimate,
    enough,
    eval_count,
    increments,
    per_step,
    save_count,
    steady_step,
    warmup_steps,
)


def plan_inline(
    probe: list[RunConfig],
    config: str,
    options: Options,
    say: Callable[[str], None],
    tmp: Path,
    part: str = "all",
    after_finish: Callable[[], None] | None = None,
) -> RunEstimate:
    """The run in this process: start-up (from the process's start to its model loaded), each stage
    measured (:func:`measure_stage`), the end (the monitor closed, the plots drawn, then
    ``after_finish()``: explorer processes seeing the run end). ``part="trainer"``: the trainer of a
    ``launch: processes`` run, its explorers started by the caller."""
    from trine import build
    from trine.inspect import preflight
    from trine.rundir import RunDir
    from trine.threads import machine

    cores, load = machine()
    say(f"measuring start-up (imports, data checks, model) in {tmp} ...")
    with quiet(tmp / "plan.log"):
        preflight.check(probe)
        rd = RunDir.open(probe, build.load_policy)
    startup = Cost("start-up (Python, imports, checks, model)", Spread.exact(process_age()), 1)
    device = str(next(rd.model.parameters()).device)
    stages, previous_key = [], None
    try:
        for index, cfg in enumerate(probe):
            say(f"[{cfg.stage}] measuring {cfg.plan.wiring} steps ...")
            with quiet(tmp / "plan.log"):
                stage, previous_key = measure_stage(cfg, index, rd, options, previous_key, part)
            stages.append(stage)
        began = time.perf_counter()
        with quiet(tmp / "plan.log"):
            rd.finish("finished")
            if after_finish is not None:
                after_finish()
        end = Cost("end (monitor close, plots)", Spread.exact(time.perf_counter() - began), 1)
    except BaseException as err:
        rd.fail(err)
        raise
    where = (
        f"{device}, {rd.threads} torch thread{'s' if rd.threads > 1 else ''} ({cores} cores, load {load:.1f})"
    )
    return RunEstimate(config, startup, stages, end, where, 0.0)


def measure_stage(
    cfg: RunConfig, index: int, rd: Any, options: Options, previous_key: str | None, part: str = "all"
) -> tuple[StageEstimate, str | None]:
    """Build stage ``index`` on the run's model (``part="trainer"``: a trainer process's side only), time
    its steps, one evaluation and one checkpoint; returns its estimate and its evaluation's key (the next
    stage reuses an equal one at its start)."""
    from trine import build, modes

    gpu = _gpu()
    if gpu is not None:
        gpu.reset_peak_memory_stats()
    began = time.perf_counter()
    st = build.build_stage(cfg, rd.model, rd.tokenizer, rd.path, part)
    built = time.perf_counter() - began
    warm = warmup_steps(cfg.plan.wiring, cfg.buffer.max_staleness, options.warmup)
    try:
        seconds, metrics = _steps(st, rd, modes.steps(st), warm, options)
        eval_seconds, key, reused = _evaluation(st, rd, options, previous_key)
        began = time.perf_counter()
        rd.save(st, index, done=False)
        saved = time.perf_counter() - began
    finally:
        st.close()
    warm = min(warm, len(seconds))
    measured, total_steps = seconds[warm:], st.total_steps
    step = per_step(measured, cfg.sync.sync_interval if cfg.plan.wiring == "sync" else 1)
    if cfg.plan.wiring in ("async", "offset"):
        step = steady_step(step, Spread.of(_values(metrics[warm:], "time/train_seconds")))
    e = cfg.eval
    costs = [
        Cost("build (roles, engine, tasksets)", Spread.exact(built), 1),
        Cost(f"first {warm} step{'s' if warm != 1 else ''} (warm-up)", Spread.exact(sum(seconds[:warm])), 1),
        Cost("step", step, max(total_steps - warm, 0) if measured else 0),
        *breakdown(cfg, metrics[warm:], total_steps),
        Cost(
            "evaluation",
            Spread.exact(eval_seconds),
            eval_count(total_steps, e.every, e.at_start, reused) if st.evaluator else 0,
        ),
        Cost("checkpoint", Spread.exact(saved), save_count(total_steps, cfg.trainer.save_every)),
    ]
    estimate = StageEstimate(
        name=cfg.stage,
        wiring=cfg.plan.wiring,
        launcher=cfg.plan.launcher,
        total_steps=total_steps,
        warmup_steps=warm,
        measured_steps=len(measured),
        costs=costs,
        sampling_tokens_per_second=sampling_rate(metrics[warm:]),
        training_tokens_per_second=_median(_values(metrics[warm:], "trainer/tokens_per_second")),
        peak_rss_mb=peak_rss_mb(),
        peak_gpu_mb=gpu.max_memory_allocated() / 2**20 if gpu is not None else None,
        note=truncation_note(cfg, metrics[warm:]),
    )
    return estimate, key


def truncation_note(cfg: RunConfig, metrics: list[dict[str, float]]) -> str:
    """A note when most measured responses ran to ``max_tokens``: a stage measured on its start weights
    samples as long as it may, and a run whose responses get shorter samples faster than this estimate."""
    cut = _values(metrics, "explorer/truncated_fraction")
    if not cut or sum(cut) / len(cut) < 0.5:
        return ""
    limit = cfg.tasks.train.sampling.max_tokens if cfg.tasks.train else "max_tokens"
    return (
        f"{sum(cut) / len(cut):.0%} of the measured responses ran to max_tokens ({limit}) on the weights "
        "this stage starts from here; if the run's responses get shorter, its sampling gets faster than this"
    )


def _steps(
    st: Any, rd: Any, steps: Iterator[dict[str, float]], warm: int, options: Options
) -> tuple[list[float], list[dict[str, float]]]:
    """Drive the mode's steps as the loop does (count, log, heartbeat) for ``warm`` steps, then until
    ``options.steps`` steps and ``options.min_seconds`` are measured; every step's seconds and metrics."""
    seconds: list[float] = []
    metrics: list[dict[str, float]] = []
    with contextlib.closing(steps) as gen:
        tick = time.perf_counter()
        for m in gen:
            rd.step, st.step = rd.step + 1, st.step + 1
            m = {**m, "time/step_seconds": time.perf_counter() - tick, "stage": st.cfg.stage}
            rd.monitor.log(m, rd.step)
            rd.beat()
            now = time.perf_counter()
            seconds.append(now - tick)
            metrics.append(m)
            tick = now
            if enough(seconds[warm:], options):
                break
    return seconds, metrics


def _evaluation(
    st: Any, rd: Any, options: Options, previous_key: str | None
) -> tuple[float, str | None, bool]:
    """One evaluation's seconds (scaled up from ``options.eval_tasks`` tasks per taskset when set), the
    evaluation's key and whether the stage's start reuses the previous stage's last evaluation."""
    ev = st.evaluator
    if ev is None:
        return 0.0, None, False
    key = ev.key(0)  # the same step on both sides: equal keys mean equal settings
    reused = key == previous_key
    scale = 1.0
    if options.eval_tasks and any(len(ts) > options.eval_tasks for ts in ev.tasksets):
        heads = [_Head(ts.name, list(itertools.islice(iter(ts), options.eval_tasks))) for ts in ev.tasksets]
        scale = sum(len(ts) for ts in ev.tasksets) / sum(len(h) for h in heads)
        ev = dataclasses.replace(ev, tasksets=heads)
    began = time.perf_counter()
    ev.evaluate(rd.step, rd.monitor)
    return (time.perf_counter() - began) * scale, key, reused


@dataclasses.dataclass
class _Head:
    """The first tasks of an eval taskset (what :meth:`Evaluator.evaluate` reads: a name and the tasks)."""

    name: str
    tasks: list[Any]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.tasks)

    def __len__(self) -> int:
        return len(self.tasks)


def breakdown(cfg: RunConfig, metrics: list[dict[str, float]], total_steps: int) -> list[Cost]:
    """The parts of a step (shown, not added again): sampling and reward per explored batch, the reward
    alone (timed on the taskset's answers), the training step, the weight sync per push."""
    out = []
    explore = _values(metrics, "time/explore_seconds")
    if explore:
        out.append(Cost("sampling + reward (per batch)", Spread.of(explore), total_steps, counted=False))
        reward = reward_seconds(cfg)
        if reward is not None:
            rows = cfg.tasks.batch_size * cfg.tasks.train.repeat
            out.append(
                Cost(f"reward ({rows} calls per batch)", Spread.exact(reward * rows), total_steps, False)
            )
    train = _values(metrics, "time/train_seconds")
    if train:
        out.append(Cost("training step", Spread.of(train), total_steps, counted=False))
    synced = increments(_values(metrics, "sync/seconds"))  # a running total: per step
    if synced:
        out.append(Cost(f"weight sync ({cfg.sync_method}, per step)", Spread.of(synced), total_steps, False))
    return out


def reward_seconds(cfg: RunConfig, calls: int = 16) -> float | None:
    """Seconds of one call of the train taskset's reward on its first tasks' reference answers, as the
    explorer calls it (:func:`trine.rewards.evaluate_reward`); None where it is not one call per sample
    (not ``single_turn``) or needs the explorer's auxiliary models."""
    from trine import build, registry
    from trine.rewards import evaluate_reward

    ts = cfg.tasks.train
    if ts is None or ts.workflow != "single_turn":
        return None
    fn = registry.resolve("reward", ts.reward)
    try:
        if "models" in inspect.signature(fn).parameters:  # an LLM judge: the explorer's auxiliary models
            return None
    except (TypeError, ValueError):
        return None
    tasks = list(itertools.islice(iter(build.build_taskset(ts)), calls))
    if not tasks:
        return None
    began = time.perf_counter()
    for task in tasks:
        with contextlib.suppress(Exception):  # a reward that raises on an answer costs what it took
            evaluate_reward(fn, "" if task.answer is None else str(task.answer), task, ts.reward_args)
    return (time.perf_counter() - began) / len(tasks)


def sampling_rate(metrics: list[dict[str, float]]) -> float | None:
    """Response tokens sampled per second of exploring, over the measured steps."""
    tokens = seconds = 0.0
    for m in metrics:
        if "time/explore_seconds" in m and "explorer/experiences" in m:
            tokens += m["explorer/experiences"] * m.get("explorer/response_length_mean", 0.0)
            seconds += m["time/explore_seconds"]
    return tokens / seconds if seconds > 0 else None


def _values(metrics: list[dict[str, float]], key: str) -> list[float]:
    return [float(m[key]) for m in metrics if isinstance(m.get(key), (int, float))]


def _median(values: list[float]) -> float | None:
    return Spread.of(values).mid if values else None


def peak_rss_mb() -> float:
    """This process's peak resident memory so far (MiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def _gpu() -> Any:
    """``torch.cuda`` when a CUDA device is there, else None."""
    import torch

    return torch.cuda if torch.cuda.is_available() else None


@contextlib.contextmanager
def quiet(log: Path) -> Iterator[None]:
    """Send what the run prints (its console lines, progress bar) to ``log`` instead of the terminal."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", encoding="utf-8") as f, contextlib.redirect_stdout(f):
        yield


def process_age() -> float:
    """Seconds since this process started (Linux: from ``/proc``; elsewhere: since this module was
    imported, which leaves Python's start and the CLI's imports out)."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time() - _IMPORTED


_IMPORTED = time.time()
