"""`trine plan` on real configs: it writes nothing where the run goes, and its estimate is within 25% of
the real wall-clock of the main job and of an async run with trainer and explorer processes.

The comparisons run `benchmarks/plan_vs_real.py`'s `compare` (plan, then run at once, each a `trine`
process timed from start to exit) on shortened configs, with one torch thread pinned so that plan and
run use the same count whatever the load does between them; RESULTS.md has the full-length numbers.
They compare two wall-clocks taken a minute apart, so they are marked ``alone``: the README's test command
runs them after the parallel suite, with nothing else on the machine (in the parallel suite, with the
load going from 4 to 13 between plan and run, the ratios were 0.71 and 1.83)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARGIN = 0.25
"""The issue's bar: the estimate within 25% of the real wall-clock."""


def _bench():
    spec = importlib.util.spec_from_file_location("plan_vs_real", ROOT / "benchmarks" / "plan_vs_real.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bench = _bench()


def _files(root: Path) -> dict[str, float]:
    return {str(p.relative_to(root)): p.stat().st_mtime for p in sorted(root.rglob("*"))}


@pytest.mark.slow
def test_plan_writes_nothing_where_the_run_goes_and_shows_every_cost(tmp_path):
    config, overrides = bench.main_job(
        tmp_path, "num_threads=1", "stages.0.tasks.total_steps=30", "stages.1.tasks.total_steps=6"
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine")
    before = _files(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "trine.cli", "plan", str(config), *overrides, "--steps", "2", "--min-seconds", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert _files(tmp_path) == before  # no file in the run directory, and the model not built at model.path
    out = done.stdout
    for row in ["start-up (Python, imports, checks, model)", "sft    step", "sft      training step",
                "grpo     sampling + reward (per batch)", "grpo   evaluation", "grpo   checkpoint",
                "end (monitor close, plots)", "expected wall-clock:", "peak RSS"]:  # fmt: skip
        assert row in out, f"{row!r} missing from:\n{out}"
    assert "sft: train (inline), 30 steps (1 warm-up + 2 measured)" in out
    assert "grpo: sync (inline), 6 steps (1 warm-up + 2 measured) | sampling" in out
    assert "building" not in out  # the run's own console lines went to the plan's log, not here


def _within(result: dict, what: str) -> None:
    ratio = result["ratio"]
    costs = [
        f"{s['name']} {c['name']}: {c['each']['mid']:.3f} s x {c['count']}"
        for s in result["plan"]["stages"]
        for c in s["costs"]
    ]
    assert 1 - MARGIN <= ratio <= 1 + MARGIN, (
        f"{what}: trine plan said {result['estimate']:.1f} s ({result['low']:.0f}-{result['high']:.0f}), the run "
        f"took {result['real']:.1f} s (ratio {ratio:.2f}); load averages {result['loads']}; measured on "
        f"{result['machine']}; costs: {costs}"
    )


@pytest.mark.slow
@pytest.mark.alone
def test_the_main_jobs_estimate_is_within_25_percent_of_its_wall_clock(tmp_path):
    config, overrides = bench.main_job(
        tmp_path, "num_threads=1", "stages.0.tasks.total_steps=300", "stages.1.tasks.total_steps=120"
    )
    _within(bench.compare(config, overrides, tmp_path / "run", timeout=600), "the main job (300 + 120 steps)")


@pytest.mark.slow
@pytest.mark.alone
def test_an_async_processes_estimate_is_within_25_percent_of_its_wall_clock(tmp_path):
    config, overrides = bench.async_job(tmp_path, 60, "num_threads=1")
    _within(bench.compare(config, overrides, tmp_path / "run", timeout=600), "async processes (60 steps)")
