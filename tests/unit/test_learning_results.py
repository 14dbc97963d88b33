"""The learning numbers the docs quote come from stored runs (scripts/learning_results.py), and the
install commands use the constraints those runs were produced with."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location(
        "learning_results", ROOT / "scripts" / "learning_results.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_results_block_is_rendered_from_its_stored_runs():
    script = _script()
    for name, job in script.JOBS.items():
        stored = ROOT / "docs" / "results" / f"{name}.json"
        assert stored.is_file(), f"{stored} is missing: run python scripts/learning_results.py {name}"
        text = (ROOT / job.doc).read_text()
        found = re.search(rf"<!-- results:{name}:start -->\n(.*)\n<!-- results:{name}:end -->", text, re.S)
        assert found, f"{job.doc} lost its <!-- results:{name}:start/end --> block"
        assert found.group(1) == script.block(name), (
            f"{job.doc}'s results:{name} block differs from docs/results/{name}.json: "
            f"run python scripts/learning_results.py {name} --render (never edit the numbers by hand)"
        )
        result = json.loads(stored.read_text())
        assert result["config"] == job.config
        assert {(r["seed"], r["kernels"]) for r in result["runs"]} == {
            (s, k) for s in job.seeds for k in job.kernels
        }, f"docs/results/{name}.json does not hold every seed × kernels run of the job"


def test_the_main_job_learns_robustly_in_every_stored_run():
    """The recipe's promise (issue 23): every seed and both kernels end at >= 80% avg@8 after GRPO, and
    GRPO never lowers pass@8."""
    result = json.loads((ROOT / "docs" / "results" / "main.json").read_text())
    for run in result["runs"]:
        grpo = [x for x in run["evals"] if x["stage"] == "grpo"]
        assert grpo[-1]["eval/addition/avg@8"] >= 0.8, run["seed"]
        assert grpo[-1]["eval/addition/pass@8"] >= grpo[0]["eval/addition/pass@8"], run["seed"]


def test_spread_covers_every_run_and_two_standard_deviations():
    script = _script()
    assert script.spread([0.5, 0.5, 0.5]) == 0.0
    assert abs(script.spread([0.4, 0.6]) - 2 * 0.1414213562) < 1e-6  # 2 sd (0.283) > widest (0.1)
    values = [0.9] * 9 + [0.0]  # one outlier: the widest distance (0.81) beats 2 sd (0.57)
    assert abs(script.spread(values) - 0.81) < 1e-9


def test_a_curve_has_a_column_per_eval_step_and_step_metrics_their_first_and_last_window():
    script = _script()
    job = script.Job(
        config="c.yaml", doc="d.md", taskset="t", metrics=("avg@4",), table="curve",
        train_metrics=("tools/calls",), window=2,
    )  # fmt: skip
    runs = [
        {
            "evals": [{"step": s, "stage": "main", "eval/t/avg@4": v} for s, v in ((0, 0.0), (10, end))],
            "steps": [{"step": i, "stage": "main", "tools/calls": c} for i, c in enumerate(calls, 1)],
        }
        for end, calls in ((0.5, [2, 4, 100, 120]), (0.7, [4, 6, 110, 130]))
    ]
    assert script.tables(job, runs) == [
        "| metric | step 0 | step 10 |",
        "|---|---|---|",
        "| `eval/t/avg@4` | 0.0% ± 0.0 | 60.0% ± 28.3 |",
        "",
        "| metric | first 2 steps | last 2 steps |",
        "|---|---|---|",
        "| `tools/calls` | 4.00 ± 2.83 | 115 ± 14 |",
    ]


def test_install_commands_use_the_constraints_which_never_pin_torch():
    text = (ROOT / "README.md").read_text()
    install_and_run, install_and_test = re.findall(r"```bash\n(.+?)\n```", text)[:2]
    for command in (install_and_run, install_and_test):
        assert "-c constraints.txt" in command, command
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not a name==version pin"
            pins[name.lower()] = version
    assert not [n for n in pins if n == "torch" or n.startswith(("nvidia-", "triton"))], (
        "constraints.txt must not pin torch or its CUDA wheels: an existing torch is never replaced"
    )
    for needed in ("transformers", "tokenizers", "safetensors", "numpy", "pydantic"):
        assert needed in pins, f"constraints.txt does not pin {needed}"
