"""``trine bench``: a run's checkpoints evaluated again reproduce the run's own eval numbers; results are
appended to bench.jsonl once per checkpoint and eval settings; bad input gets errors that say what exists."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import EXAMPLE, write_arithmetic_config
from trine.cli import app
from trine.config import load_config
from trine.launch.bench import BENCH_FILE, BenchError, bench, eval_settings, read_bench, with_stage_starts
from trine.monitor import read_metrics
from trine.monitor.plot import stage_regions

# every test benches the checkpoints of a real run (the loop runs in `finished` or `_run`)
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]


def parity_reward(response: str, task: object, **_: object) -> float:
    """1 for an even-length response: a tiny untrained model scores about half, and each sample counts."""
    return float(len(response) % 2 == 0)


EVAL = {
    "eval": {"every": 1, "k": 3, "greedy": True},
    "tasks": {
        "total_steps": 2,
        "eval": [
            {
                "path": str(EXAMPLE / "data" / "eval.jsonl"),
                "name": "parity",
                "reward": "tests.e2e.test_bench:parity_reward",
                "sampling": {"temperature": 1.0, "max_tokens": 5},
            }
        ],
    },
    "trainer": {"save_every": 1, "keep_checkpoints": 0},
    "num_threads": 1,
}


def _run(tmp: Path, model: Path, name: str, *overrides: dict) -> Path:
    from trine.loop import run

    path = write_arithmetic_config(tmp, model, name, EVAL, *overrides)
    run(load_config(path))
    return path


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_model_dir) -> Path:
    """The config of a finished 2-step run that saved and evaluated at steps 1 and 2 (read-only)."""
    return _run(tmp_path_factory.mktemp("bench"), tiny_model_dir, "run")


def _copy(config: Path, tmp_path: Path) -> list:
    """The stages of ``config`` pointed at a private copy of its run directory."""
    stages = load_config(config)
    shutil.copytree(stages[0].run_dir, tmp_path / "run")
    return load_config(config, [f"run_dir={tmp_path / 'run'}"])


def _snapshot(run_dir: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(run_dir)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in run_dir.rglob("*")
        if p.is_file()
    }


def test_bench_reproduces_the_runs_eval_numbers_and_writes_only_its_files(finished, tmp_path):
    stages = _copy(finished, tmp_path)
    run_dir = tmp_path / "run"
    before = _snapshot(run_dir)
    said: list[str] = []
    result = bench(stages, say=said.append)

    logged = {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}
    assert [r.step for r in result.rows] == [1, 2] and not any(r.cached for r in result.rows)
    for row in result.rows:  # bit-equal to what the run logged at that step, not merely close
        run_eval = {k: v for k, v in logged[row.step].items() if k.startswith("eval/")}
        assert set(run_eval) == {
            "eval/parity/accuracy",
            "eval/parity/avg@3",
            "eval/parity/pass@3",
            "eval/parity/return_mean",
        }
        assert row.metrics == run_eval
    assert 0 < result.rows[0].metrics["eval/parity/avg@3"] < 1, "the parity reward must not be all-or-none"
    lines = read_bench(run_dir)
    assert [(x["step"], x["stage"], x["settings"]) for x in lines] == [
        (1, "main", eval_settings(stages[0]))
    ] + [(2, "main", eval_settings(stages[0]))]
    assert lines[1]["checkpoint"] == str(run_dir / "checkpoints" / "step_2")
    assert lines[1]["saved_ns"] == (run_dir / "checkpoints" / "step_2" / "loop_state.pt").stat().st_mtime_ns
    assert lines[1]["eval/parity/avg@3"] == result.rows[1].metrics["eval/parity/avg@3"]
    assert result.plot == run_dir / "plots" / "bench.png" and result.plot.stat().st_size > 0
    after = _snapshot(run_dir)
    assert {k for k in after if after[k] != before.get(k)} == {BENCH_FILE, "plots/bench.png"}
    assert said[0].startswith("threads: 1 (num_threads: 1; ")  # as the run: CPU results depend on it
    assert said[1:] == [
        f"step {s} (stage main): evaluating {run_dir / 'checkpoints' / f'step_{s}'}" for s in (1, 2)
    ]


def test_a_checkpoint_already_benched_with_the_same_settings_is_not_evaluated_again(finished, tmp_path):
    stages = _copy(finished, tmp_path)
    run_dir = tmp_path / "run"
    first = bench(stages, checkpoints="latest", say=lambda _: None)
    assert [r.step for r in first.rows] == [2] and len(read_bench(run_dir)) == 1

    again = bench(stages, checkpoints="2,1", say=lambda _: None)
    assert [(r.step, r.cached) for r in again.rows] == [(2, True), (1, False)]
    assert again.rows[0].metrics == first.rows[0].metrics
    assert again.notes == [f"step 2: already in {BENCH_FILE} with these eval settings (--force to redo)"]
    assert [x["step"] for x in read_bench(run_dir)] == [2, 1]

    forced = bench(stages, checkpoints="2", force=True, say=lambda _: None)
    assert not forced.rows[0].cached and forced.rows[0].metrics == first.rows[0].metrics
    other = load_config(finished, [f"run_dir={run_dir}", "eval.k=2"])  # other settings: evaluated anew
    changed = bench(other, checkpoints="2", say=lambda _: None)
    assert not changed.rows[0].cached and "eval/parity/avg@2" in changed.rows[0].metrics
    assert [x["step"] for x in read_bench(run_dir)] == [2, 1, 2, 2]
    state = run_dir / "checkpoints" / "step_1" / "loop_state.pt"  # step_1 written again (a re-run)
    os.utime(state, ns=(state.stat().st_atime_ns, state.stat().st_mtime_ns + 1))
    rewritten = bench(stages, checkpoints="1", say=lambda _: None)
    assert not rewritten.rows[0].cached and rewritten.rows[0].saved_ns == state.stat().st_mtime_ns


def test_a_checkpoint_removed_while_benching_is_skipped_with_a_warning(finished, tmp_path):
    stages = _copy(finished, tmp_path)
    ckpt = tmp_path / "run" / "checkpoints"

    def rotate(line: str) -> None:  # the trainer's keep_checkpoints rotation, racing the bench
        if line.startswith("step 1 "):
            shutil.rmtree(ckpt / "step_2")
        elif line.startswith("step 2 "):
            raise AssertionError("step 2 was removed; it must not be evaluated")

    result = bench(stages, say=rotate)
    assert [r.step for r in result.rows] == [1]
    assert result.notes == [f"warning: step 2: {ckpt / 'step_2'} was removed meanwhile (rotation); skipped"]

    def rotate_during(line: str) -> None:  # removed after it was listed and announced
        if "evaluating" in line:
            shutil.rmtree(ckpt / "step_1")

    result = bench(stages, checkpoints="1", force=True, say=rotate_during)
    assert result.rows == [] and "step 1" in result.notes[0] and "removed meanwhile" in result.notes[0]


def test_bad_input_errors_name_what_exists(finished, tmp_path):
    stages = load_config(finished)
    with pytest.raises(BenchError, match=r"no checkpoint for step\(s\) \[7\].*the steps there are \[1, 2\]"):
        bench(stages, checkpoints="1,7")
    with pytest.raises(BenchError, match="expected all, latest or comma-separated steps"):
        bench(stages, checkpoints="last")
    with pytest.raises(BenchError, match=f"no checkpoints in '{tmp_path / 'empty' / 'checkpoints'}'"):
        bench(stages, run_dir=tmp_path / "empty")
    no_eval = load_config(finished, ["tasks.eval=[]"])
    with pytest.raises(BenchError, match=r"tasks\.eval is empty"):
        bench(no_eval)


def test_each_checkpoint_is_benched_with_its_own_stages_eval_settings(tmp_path, tiny_model_dir):
    two = {"stages": [{"stage": "a"}, {"stage": "b", "eval": {"k": 2}}], "tasks": {"total_steps": 1}}
    config = _run(tmp_path, tiny_model_dir, "staged", two)
    stages = load_config(config)
    result = bench(stages, say=lambda _: None)
    assert [(r.step, r.stage) for r in result.rows] == [(1, "a"), (2, "b")]
    assert "eval/parity/avg@3" in result.rows[0].metrics and "eval/parity/avg@2" in result.rows[1].metrics
    logged = {
        r["step"]: r
        for r in map(json.loads, (tmp_path / "staged" / "metrics.jsonl").read_text().splitlines())
    }
    for row in result.rows:
        assert row.metrics == {k: v for k, v in logged[row.step].items() if k.startswith("eval/")}
    assert [x["settings"] for x in read_bench(tmp_path / "staged")] == [eval_settings(s) for s in stages]


def test_the_plot_puts_the_stage_boundary_where_the_first_stage_ended(tmp_path, tiny_model_dir):
    """examples/arithmetic in miniature: its sft stage ends at step 300 of 600 and checkpoints only at
    stage ends (300, 600), so half-way between the checkpoints (450) is not the boundary. Here stage a
    ends at step 1 and b checkpoints only its last step, 4: the boundary is 1.5 (after step 1), as on
    the run's own plot, not 2.5."""
    two = {
        "stages": [
            {"stage": "a", "tasks": {"total_steps": 1}},
            {"stage": "b", "tasks": {"total_steps": 3}, "trainer": {"save_every": 0}, "eval": {"every": 0}},
        ]
    }
    config = _run(tmp_path, tiny_model_dir, "sparse", two)
    run_dir = tmp_path / "sparse"
    result = bench(load_config(config), say=lambda _: None)
    assert [(r.step, r.stage, r.stage_start) for r in result.rows] == [(1, "a", 0), (4, "b", 1)]
    lines = read_bench(run_dir)
    assert [x["stage_start"] for x in lines] == [0, 1]
    assert stage_regions(lines) == [("a", 1, 1.5), ("b", 1.5, 4)]
    assert stage_regions(read_metrics(run_dir / "metrics.jsonl")) == [("a", 1, 1.5), ("b", 1.5, 4)]
    assert result.plot is not None and result.plot.stat().st_size > 0

    # lines written before bench recorded stage_start: the checkpoints' rows fill it in for the plot
    old = [{k: v for k, v in x.items() if k != "stage_start"} for x in lines]
    assert stage_regions(old) == [("a", 1, 2.5), ("b", 2.5, 4)]  # the half-way guess of sparse points
    (run_dir / BENCH_FILE).write_text("".join(json.dumps(x) + "\n" for x in old))
    cached = bench(load_config(config), say=lambda _: None)
    assert [(r.cached, r.stage_start) for r in cached.rows] == [(True, 0), (True, 1)]
    assert stage_regions(with_stage_starts(read_bench(run_dir), cached.rows)) == [
        ("a", 1, 1.5),
        ("b", 1.5, 4),
    ]


def test_bench_command_prints_a_table_and_exits_2_on_bad_input(finished, tmp_path):
    stages = _copy(finished, tmp_path)
    run_dir = Path(stages[0].run_dir)
    runner = CliRunner()
    ok = runner.invoke(app, ["bench", str(finished), "--run-dir", str(run_dir), "--checkpoints", "latest"])
    assert ok.exit_code == 0, ok.output
    assert "Trine bench" in ok.output and "parity/avg@3" in ok.output and "plots/bench.png" in ok.output
    again = runner.invoke(app, ["bench", str(finished), "--run-dir", str(run_dir), "--checkpoints", "2"])
    assert again.exit_code == 0 and "already in bench.jsonl" in again.output
    bad = runner.invoke(app, ["bench", str(finished), "--run-dir", str(run_dir), "--checkpoints", "9"])
    assert bad.exit_code == 2 and "the steps there are [1, 2]" in bad.output
