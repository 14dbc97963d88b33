"""The main job, as the README's first command runs it, still gives the README's result."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_main_job_ends_within_the_readme_spread(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "learning_results", ROOT / "scripts" / "learning_results.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    mean, band = script.final("main", "avg@8")
    run_dir, model = tmp_path / "run", tmp_path / "model"  # seed 0 builds the README's model here
    done = subprocess.run(
        [sys.executable, "-m", "trine.cli", "run", "examples/arithmetic/config.yaml",
         f"run_dir={run_dir}", f"model.path={model}", "monitor.plot=false"],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    evals = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if '"eval/' in x]
    grpo = [x for x in evals if x["stage"] == "grpo"]
    end = grpo[-1]["eval/addition/avg@8"]
    assert end >= mean - band, (
        f"the main job ended at avg@8 {end:.3f}, below the README's {mean:.3f} ± {band:.3f}: the recipe "
        "regressed (or the README's table is stale: python scripts/learning_results.py main)"
    )
    assert grpo[-1]["eval/addition/pass@8"] >= grpo[0]["eval/addition/pass@8"], "GRPO lowered pass@8"
