"""The loop: tasks → explorer → buffer → trainer → weights, and its modes, in data-flow order.

A run is a list of stages (one unless the config chains several); each stage is built by
:mod:`trine.build` and driven by one of three step generators — different wirings of the same
objects — each yielding one metrics dict per training step:

- ``_sync_steps``: colocated shared weights; explore ``sync_interval`` batches, train on them, repeat.
- ``_offset_steps``: the explorer runs ``sync_offset`` batches ahead in a thread, from a weight
  snapshot that is updated every ``sync_interval`` steps.
- ``_train_steps``: trainer only, on supervised rows made from the taskset.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from trine import build, preflight
from trine.config import RunConfig
from trine.refill import pass_rates, shape_batch
from trine.rundir import RunDir
from trine.tasks.supervised import preference_experiences, sft_experiences

EVAL_TABLE_ROWS = 8
"""Eval rollouts per taskset sent to the monitor as a table (``eval/<taskset>/samples``) at each eval."""


def run(stages: list[RunConfig]) -> dict[str, Any]:
    """Run every stage in order (resuming where the run directory left off); returns the summary."""
    preflight.check(stages)  # data and model files, before anything is written
    rd = RunDir.open(stages)
    if rd.done:
        print(f"already finished: nothing to do ({rd.path} is complete at step {rd.step})", flush=True)
        return rd.summary
    if rd.checkpoint is not None:
        print(f"resuming from step {rd.step} (checkpoint {rd.checkpoint})", flush=True)
    try:
        for index, cfg in enumerate(stages):
            if index < rd.resume_at():
                continue
            stage = build.build_stage(cfg, rd.model, rd.tokenizer, rd.path)
            rd.restore(stage, index)
            _run_stage(stage, index, rd)
            limit = cfg.stop_after_steps
            if stage.step < stage.total_steps or (limit and rd.step >= limit and index < len(stages) - 1):
                return rd.finish("stopped")  # run again to continue
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM under `trine run` (cli.Terminated)
        rd.interrupted(type(err).__name__)
        raise
    except BaseException as err:
        rd.fail(err)
        raise
    return rd.finish("finished")


def _run_stage(st: build.Stage, index: int, rd: RunDir) -> None:
    """Drive one stage's steps: log each, evaluate and checkpoint when due."""
    cfg = st.cfg
    record = rd.summary["stages"].setdefault(cfg.stage, {"seconds": 0.0})
    if st.step == 0 and cfg.eval.at_start and st.eval_sets:
        record["eval_start"] = _evaluate(st, rd.step, rd.monitor)
        rd.monitor.log({**record["eval_start"], "stage": cfg.stage}, rd.step)
    if cfg.mode == "train":
        steps = _train_steps(st, rd.tokenizer)
    else:
        steps = _offset_steps(st) if cfg.sync.sync_offset > 0 else _sync_steps(st)
    tick = time.perf_counter()
    for metrics in steps:
        rd.step, st.step = rd.step + 1, st.step + 1
        last = st.step >= st.total_steps
        stop = cfg.stop_after_steps is not None and rd.step >= cfg.stop_after_steps
        if st.eval_sets and (last or (cfg.eval.every and st.step % cfg.eval.every == 0)):
            record["eval_end"] = _evaluate(st, rd.step, rd.monitor)
            metrics.update(record["eval_end"])
        now = time.perf_counter()
        metrics.update({"time/step_seconds": now - tick, "stage": cfg.stage})
        record["seconds"] += now - tick
        rd.monitor.log(metrics, rd.step)
        rd.beat()
        if last or stop or (cfg.trainer.save_every and st.step % cfg.trainer.save_every == 0):
            rd.save(st, index, done=last)
        if stop and not last:
            break
        tick = time.perf_counter()


def _sync_steps(st: build.Stage):
    """Colocated: explore ``sync_interval`` batches with the current weights (concurrently, one
    long tail), then train on each in turn."""
    while st.step < st.total_steps:
        if not st.pending:
            version = st.trainer.version
            st.sync.pull(st.engine, version)
            _explore_batches(st, st.step, min(st.cfg.sync.sync_interval, st.total_steps - st.step), version)
        if not st.pending:
            return
        metrics = _train_on(st)
        if st.trainer.version % st.cfg.sync.sync_interval == 0:  # shared: records the version only
            st.sync.push(st.trainer.model, st.trainer.version)
        yield metrics


def _offset_steps(st: build.Stage):
    """Pipelined: the explorer thread runs ``sync_offset`` batches ahead of the trainer."""
    k, m = st.cfg.sync.sync_interval, st.cfg.sync.sync_offset
    ready: queue.Queue = queue.Queue()
    stop, errors = threading.Event(), []

    def explore() -> None:
        b = st.step + len(st.pending)
        try:
            while b < st.total_steps and not stop.is_set():
                version = max(0, k * ((b - m) // k))
                st.sync.pull(st.engine, version)
                with st.gate:
                    if stop.is_set() or not _explore_batches(st, b, 1, version):
                        break
                ready.put(b)
                b += 1
        except BaseException as err:  # surfaced in the trainer's thread
            if not stop.is_set():
                errors.append(err)
        finally:
            ready.put(None)

    thread = threading.Thread(target=explore, name="trine-explorer", daemon=True)
    thread.start()
    finished = False
    try:
        while st.step < st.total_steps:
            while not st.pending and not finished:
                finished = ready.get() is None
            if errors:
                raise errors[0]
            if not st.pending:
                return
            metrics = _train_on(st)
            if st.trainer.version % k == 0:
                st.sync.push(st.trainer.model, st.trainer.version)
            yield metrics
    finally:
        stop.set()
        st.sync.close()
        thread.join()


def _train_steps(st: build.Stage, tokenizer: Any):
    """Trainer only: supervised rows, or preference pairs (DPO), made from the taskset."""
    ts = st.cfg.tasks.train
    while st.step < st.total_steps:
        tasks = st.scheduler.next_batch(st.cfg.tasks.batch_size)
        if not tasks:
            return
        if st.algorithm.pairwise:
            yield st.train(preference_experiences(tasks, tokenizer, ts.chosen_key, ts.rejected_key))
        else:
            yield st.train(sft_experiences(tasks, tokenizer, ts.response_key))


def _explore_batches(st: build.Stage, first: int, count: int, version: int) -> bool:
    """tasks → explorer → buffer for ``count`` batches of one version; False when tasks run out."""
    batches = []
    for _ in range(count):
        tasks = st.scheduler.next_batch(st.cfg.tasks.batch_size)
        if not tasks:
            break
        batches.append(tasks)
    results = st.explorer.explore_batches(batches, first_index=first, version=version)
    for experiences, _ in results:  # pass rates back to the scheduler (curricula use them)
        st.scheduler.feedback(*pass_rates(experiences, st.cfg.eval.success_threshold))
    for j, (experiences, metrics) in enumerate(results):
        experiences = _shape(st, experiences, metrics, first + j, version)
        if st.operators is not None:
            experiences, op_metrics = st.operators(experiences, step=first + j)
            metrics.update(op_metrics)
        st.buffer.put(experiences)
        st.pending.append((first + j, len(experiences), metrics))
    return len(batches) == count


def _shape(st: build.Stage, experiences: list, metrics: dict[str, float], index: int, version: int) -> list:
    """:func:`trine.refill.shape_batch` with the stage's settings; refills draw tasks from the
    scheduler and explore them with the batch's version."""

    def draw_more(n: int) -> list | None:
        tasks = st.scheduler.next_batch(n)
        return st.explorer.explore(tasks, batch_index=index, version=version)[0] if tasks else None

    a = st.algorithm
    return shape_batch(
        experiences,
        metrics,
        max_tokens=st.cfg.tasks.train.sampling.max_tokens,
        batch_size=st.cfg.tasks.batch_size,
        draw_more=draw_more,
        dynamic_sampling=a.dynamic_sampling,
        max_extra_draws=a.max_extra_draws,
        overlong_buffer=a.overlong_buffer,
        overlong_penalty=a.overlong_penalty,
    )


def _train_on(st: build.Stage) -> dict[str, float]:
    """buffer → trainer for the oldest explored batch."""
    _, n, metrics = st.pending[0]
    experiences = (
        st.buffer.get(n, current_version=st.trainer.version, timeout=st.cfg.buffer.get_timeout) if n else []
    )
    st.pending.pop(0)
    if st.expert is not None:  # MIX: expert rows ride along with the rollouts
        tasks = st.expert.next_batch(max(1, round(st.algorithm.expert_ratio * len(experiences))))
        experiences = experiences + sft_experiences(
            tasks, st.engine.tokenizer, st.cfg.tasks.expert.response_key
        )
    metrics = {
        **metrics,
        **st.train(experiences),
        **st.buffer.metrics(),  # incl. buffer/staleness_mean|max of this batch (current_version given)
        "sync/seconds": st.sync.seconds,
        "trainer/version": float(st.trainer.version),
    }
    return metrics


def _evaluate(st: build.Stage, step: int, monitor: Any) -> dict[str, float]:
    """``eval/<taskset>/*`` for every eval taskset, with the trainer's current weights; a few of the
    rollouts (prompt, response, reward) go to the monitor as the table ``eval/<taskset>/samples``."""
    args = st.cfg.eval.model_dump(include={"k", "greedy", "success_threshold"})
    seed = st.cfg.seed + step
    out: dict[str, float] = {}
    for ts in st.eval_sets:
        rows: list[dict[str, Any]] = []
        out.update(st.eval_explorer.evaluate(list(ts), name=ts.name, seed=seed, samples=rows, **args))
        if rows:
            monitor.log_table(f"eval/{ts.name}/samples", rows[:EVAL_TABLE_ROWS], step)
    return out
