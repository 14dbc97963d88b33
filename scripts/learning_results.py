"""The learning numbers the docs quote, produced from real runs (never typed by hand).

Each job runs one example config over several seeds (of the model's initialisation where the job builds
its model, and of sampling) and, for the main job, under two sets of CPU kernels: the machine's own and
torch's plain ones (``ATEN_CPU_CAPABILITY=default``), so that a table says what the *recipe* does, not
what one machine's rounding did. The runs' eval curves are stored in ``docs/results/<job>.json`` with the
machine they ran on, and the job's block in its doc (between ``<!-- results:<job>:start -->`` and
``<!-- results:<job>:end -->``) is rendered from that file: mean ± spread, where the spread covers every
run and two standard deviations. ``tests/unit/test_learning_results.py`` fails when a block and its file
disagree, and the slow ``tests/e2e/test_main_job.py`` fails when the main job ends further below the
README's avg@8 than its stated spread.

A job's eval metrics form a table of one of two shapes: ``stages`` (a row per stage and metric, its start
→ end, as the main job's) or ``curve`` (a row per metric, a column per eval step). Keys of the step lines
(``train_metrics``: ``explorer/turns_mean``, ``tools/calls``, ...) add a table of their mean over the
first and the last ``window`` steps. A run is made by the job's ``runner`` in ``scripts/learning_runners.py``:
``trine run`` of its config, or (the serve agent) ``trine serve`` + ``trine train`` + a client.

    python scripts/learning_results.py main              # run (6 runs, ~10 min on 2 cores), store, render
    python scripts/learning_results.py main --render     # render the doc block from the stored file only
    python scripts/learning_results.py --list            # the jobs, their configs and docs
"""

# No `from __future__ import annotations`: the tests load this file by path (not in sys.modules), where
# dataclasses cannot resolve string annotations.
import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import re
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"
KERNEL_ENV = "ATEN_CPU_CAPABILITY"


@dataclass(frozen=True)
class Job:
    """One block of a doc: ``config`` run over ``seeds`` × ``kernels``; the eval metrics ``metrics`` of
    taskset ``taskset`` rendered into ``doc`` as a ``table``: ``stages`` (a row per stage and metric, start
    → end of each stage) or ``curve`` (a row per metric, a column per eval step); then the step lines'
    ``train_metrics``, each as its mean over the first and the last ``window`` steps."""

    config: str
    doc: str
    taskset: str
    metrics: tuple[str, ...]
    seeds: tuple[int, ...] = (0, 1, 2)
    kernels: tuple[str, ...] = ("native", "default")
    build_model: bool = False  # each seed builds its own model (model.init_preset) in the run's directory
    plugins: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    table: str = "stages"  # or "curve"
    train_metrics: tuple[str, ...] = ()
    window: int = 5
    unit: str = "steps"  # what a step line counts, for the train_metrics table's headers
    runner: str = "trine_run"  # the function of scripts/learning_runners.py that makes one run


AGENTS = {"seeds": (0, 1), "kernels": ("native",)}  # the agent examples: two seeds, the CPU's own kernels
TOOL_USE = {
    "config": "examples/tool_use/grpo.yaml",
    "doc": "examples/tool_use/README.md",
    "taskset": "multiply",
    "metrics": ("avg@4", "accuracy"),
    "table": "curve",
    "train_metrics": ("tools/calls", "trainer/entropy"),
    **AGENTS,
}
GUESS = {
    "config": "examples/guess_number/grpo.yaml",
    "doc": "examples/guess_number/README.md",
    "taskset": "guess",
    "metrics": ("avg@4", "accuracy"),
    "table": "curve",
    "plugins": ("examples/guess_number/game.py",),
    "train_metrics": ("explorer/reward_mean", "explorer/turns_mean", "trainer/entropy"),
    "window": 10,
    **AGENTS,
}

JOBS: dict[str, Job] = {
    "main": Job(
        config="examples/arithmetic/config.yaml",
        doc="README.md",
        taskset="addition",
        metrics=("accuracy", "avg@8", "pass@8"),
        build_model=True,
    ),
    "tool_use_warmup": Job(  # config.yaml's two SFT stages, evaluated every 100 steps of the first
        **{**TOOL_USE, "config": "examples/tool_use/config.yaml", "train_metrics": ()},
        build_model=True,
        overrides=("stop_after_steps=850", "stages.0.eval.every=100", "stages.1.eval.at_start=false"),
    ),
    "tool_use": Job(**TOOL_USE),
    "tool_use_token_mean": Job(**TOOL_USE, overrides=("algorithm.loss_agg=token-mean",)),
    "guess_number": Job(**GUESS),
    "guess_number_token_mean": Job(**GUESS, overrides=("algorithm.loss_agg=token-mean",)),
    "guess_number_sft": Job(  # config.yaml's SFT stage, evaluated every 200 steps
        config="examples/guess_number/config.yaml",
        doc="examples/guess_number/README.md",
        taskset="guess",
        metrics=("avg@4", "accuracy"),
        table="curve",
        build_model=True,
        plugins=("examples/guess_number/game.py",),
        overrides=("stop_after_steps=800", "stages.0.eval.every=200"),
        **AGENTS,
    ),
    "serve_agent": Job(
        config="examples/serve_agent/config.yaml",
        doc="docs/agents.md",
        taskset="",
        metrics=(),
        build_model=True,
        train_metrics=("agent/reward", "agent/policy_version"),
        unit="agent rounds",
        runner="serve_agent",
        **AGENTS,
    ),
}


# --------------------------------------------------------------------------------------------- running


def machine() -> dict:
    """What the numbers were measured on."""
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "native_kernels": torch.backends.cpu.get_cpu_capability(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "date": datetime.date.today().isoformat(),
    }


def run_one(job: Job, seed: int, kernel: str, workdir: Path) -> dict:
    """One run of the job (its runner) under ``kernel``; returns its eval lines, the ``train_metrics`` of
    its step lines (when it has any) and its wall-clock seconds."""
    env = dict(os.environ)
    env.pop(KERNEL_ENV, None)
    if kernel != "native":
        env[KERNEL_ENV] = kernel
    spec = importlib.util.spec_from_file_location(
        "learning_runners", ROOT / "scripts" / "learning_runners.py"
    )
    runners = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runners)  # type: ignore[union-attr]
    started = time.monotonic()  # the seed's model is shared by its kernels' runs
    lines = getattr(runners, job.runner)(
        job, seed, env, workdir / f"seed{seed}-{kernel}", workdir / f"model-seed{seed}"
    )
    seconds = time.monotonic() - started
    evals = [
        {"step": x["step"], "stage": x["stage"], **{k: v for k, v in x.items() if k.startswith("eval/")}}
        for x in lines
        if any(k.startswith("eval/") for k in x)
    ]
    result = {"seed": seed, "kernels": kernel, "seconds": round(seconds, 1), "evals": evals}
    if job.train_metrics:
        # The step lines (not the lines of evals alone); one lacking a key counts 0 for it: a workflow
        # counter such as tools/calls is left out of a step that counted none.
        steps = [
            x for x in lines if any(k not in ("step", "stage", "time/unix") and "eval/" not in k for k in x)
        ]
        keys = job.train_metrics
        result["steps"] = [
            {"step": x["step"], "stage": x["stage"], **{k: x.get(k, 0.0) for k in keys}} for x in steps
        ]
    return result


def run_job(name: str, job: Job, seeds: tuple[int, ...], kernels: tuple[str, ...]) -> dict:
    runs = []
    with tempfile.TemporaryDirectory(prefix=f"trine-results-{name}-") as tmp:
        for seed in seeds:
            for kernel in kernels:
                result = run_one(job, seed, kernel, Path(tmp))
                print(f"{name}: seed {seed}, {kernel} kernels: {_final_line(job, result)}", flush=True)
                runs.append(result)
    return {"job": name, "config": job.config, "machine": machine(), "runs": runs}


def _final_line(job: Job, result: dict) -> str:
    shown = []
    if job.metrics:
        last = result["evals"][-1]
        shown += [f"{m} {last.get(f'eval/{job.taskset}/{m}', float('nan')):.3f}" for m in job.metrics]
    for key, first, last in window_rows(job, [result]):
        shown.append(f"{key} {first[0]:.3g} -> {last[0]:.3g}")
    return f"{', '.join(shown)} ({result['seconds']:.0f} s)"


# ------------------------------------------------------------------------------------------- rendering


def spread(values: list[float]) -> float:
    """Half-width of the band the table states: it covers every run and two standard deviations."""
    mean = statistics.fmean(values)
    widest = max(abs(v - mean) for v in values)
    two_sd = 2 * statistics.stdev(values) if len(values) > 1 else 0.0
    return max(widest, two_sd)


def stage_rows(job: Job, runs: list[dict]) -> list[tuple[str, str, list[float], list[float]]]:
    """(stage, metric, start values, end values) over the runs, in stage order."""
    stages: list[str] = []
    for x in runs[0]["evals"]:
        if x["stage"] not in stages:
            stages.append(x["stage"])
    rows = []
    for stage in stages:
        for metric in job.metrics:
            key = f"eval/{job.taskset}/{metric}"
            start = [next(x[key] for x in r["evals"] if x["stage"] == stage) for r in runs]
            end = [[x[key] for x in r["evals"] if x["stage"] == stage][-1] for r in runs]
            rows.append((stage, key, start, end))
    return rows


def curve_rows(job: Job, runs: list[dict]) -> tuple[list[int], list[tuple[str, list[list[float]]]]]:
    """(the eval steps, [(metric, values over the runs at each step)]): the first eval at each step."""
    steps = list(dict.fromkeys(x["step"] for x in runs[0]["evals"]))
    rows = []
    for metric in job.metrics:
        key = f"eval/{job.taskset}/{metric}"
        rows.append(
            (key, [[next(x[key] for x in r["evals"] if x["step"] == s) for r in runs] for s in steps])
        )
    return steps, rows


def window_rows(job: Job, runs: list[dict]) -> list[tuple[str, list[float], list[float]]]:
    """(key, per-run means over the first ``window`` step lines, per-run means over the last ``window``)."""
    rows = []
    for key in job.train_metrics:
        series = [[x[key] for x in r["steps"]] for r in runs]
        first = [statistics.fmean(v[: job.window]) for v in series]
        last = [statistics.fmean(v[-job.window :]) for v in series]
        rows.append((key, first, last))
    return rows


def _pct(values: list[float]) -> str:
    mean, band = 100 * statistics.fmean(values), 100 * spread(values)
    return f"{mean:.1f}% ± {band:.1f}"


def _num(values: list[float]) -> str:
    """Mean ± spread with three significant digits of the mean (3.25, 0.370, 0.0312, 118)."""
    mean, band = statistics.fmean(values), spread(values)
    digits = min(4, max(0, 2 - math.floor(math.log10(abs(mean))))) if mean else 2
    return f"{mean:.{digits}f} ± {band:.{digits}f}"


def tables(job: Job, runs: list[dict]) -> list[str]:
    """The lines of the job's tables (a blank line between two)."""
    lines = []
    if job.metrics and job.table == "curve":
        steps, rows = curve_rows(job, runs)
        lines += [
            "| metric | " + " | ".join(f"step {s}" for s in steps) + " |",
            "|---" * (len(steps) + 1) + "|",
        ]
        lines += [f"| `{key}` | " + " | ".join(_pct(v) for v in values) + " |" for key, values in rows]
    elif job.metrics:
        lines += ["| stage | metric | start | end |", "|---|---|---|---|"]
        previous = None
        for stage, key, start, end in stage_rows(job, runs):
            lines.append(f"| {stage if stage != previous else ''} | `{key}` | {_pct(start)} | {_pct(end)} |")
            previous = stage
    if job.train_metrics:
        w = job.window
        lines += [""] if lines else []
        lines += [f"| metric | first {w} {job.unit} | last {w} {job.unit} |", "|---|---|---|"]
        lines += [
            f"| `{key}` | {_num(first)} | {_num(last)} |" for key, first, last in window_rows(job, runs)
        ]
    return lines


def render(name: str, result: dict) -> str:
    """The doc block of a stored result: the table, then how and where it was measured."""
    job = JOBS[name]
    runs = result["runs"]
    lines = tables(job, runs)
    m = result["machine"]
    seeds = sorted({r["seed"] for r in runs})
    kernels = sorted({r["kernels"] for r in runs}, key=lambda k: k != "native")
    named = [
        f"the CPU's own ({m['native_kernels']})" if k == "native" else f"`{KERNEL_ENV}={k}`" for k in kernels
    ]
    seconds = [r["seconds"] for r in runs]
    lines += [
        "",
        f"Mean ± spread of {len(runs)} runs: seeds {', '.join(map(str, seeds))}"
        + (" (the model's initialisation and the sampling)" if job.build_model else " (sampling)")
        + f" × kernels {' and '.join(named)}; the spread covers every run and two standard deviations. "
        f"Each run took {min(seconds):.0f}–{max(seconds):.0f} s on {m['cores']} cores of an {m['cpu']} "
        f"(Python {m['python']}, torch {m['torch']}, transformers {m['transformers']}, {m['date']}), "
        f"written by `python scripts/learning_results.py {name}` into `docs/results/{name}.json`.",
    ]
    return "\n".join(lines)


def final(name: str, metric: str) -> tuple[float, float]:
    """(mean, spread) of ``metric`` at the end of the last stage, as the doc states it."""
    job = JOBS[name]
    result = json.loads((RESULTS / f"{name}.json").read_text())
    key = f"eval/{job.taskset}/{metric}"
    values = [r["evals"][-1][key] for r in result["runs"]]
    return round(statistics.fmean(values), 3), round(spread(values), 3)


def block(name: str) -> str:
    return render(name, json.loads((RESULTS / f"{name}.json").read_text()))


def write_doc(name: str) -> None:
    path = ROOT / JOBS[name].doc
    marker = f"results:{name}"
    text = path.read_text()
    pattern = rf"<!-- {marker}:start -->.*<!-- {marker}:end -->"
    if not re.search(pattern, text, flags=re.S):
        raise SystemExit(f"{path} has no <!-- {marker}:start --> ... <!-- {marker}:end --> block to fill")
    body = f"<!-- {marker}:start -->\n{block(name)}\n<!-- {marker}:end -->"
    path.write_text(re.sub(pattern, lambda _: body, text, flags=re.S))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("jobs", nargs="*", help=f"jobs to run: {', '.join(JOBS)}")
    parser.add_argument("--render", action="store_true", help="only render the doc blocks from docs/results")
    parser.add_argument("--seeds", help="comma-separated seeds (default: the job's)")
    parser.add_argument("--kernels", help="comma-separated: native, default (default: the job's)")
    parser.add_argument("--list", action="store_true", help="list the jobs")
    args = parser.parse_args()
    if args.list or not args.jobs:
        for name, job in JOBS.items():
            run = " ".join([job.config, *job.overrides])
            print(f"{name}: {run} -> {job.doc} (seeds {job.seeds}, kernels {job.kernels}, {job.runner})")
        return
    unknown = [j for j in args.jobs if j not in JOBS]
    if unknown:
        raise SystemExit(f"unknown job(s) {unknown}; expected some of {list(JOBS)}")
    for name in args.jobs:
        job = JOBS[name]
        if not args.render:
            seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else job.seeds
            kernels = tuple(args.kernels.split(",")) if args.kernels else job.kernels
            result = run_job(name, job, seeds, kernels)
            RESULTS.mkdir(parents=True, exist_ok=True)
            (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
        write_doc(name)
        print(block(name))


if __name__ == "__main__":
    main()
