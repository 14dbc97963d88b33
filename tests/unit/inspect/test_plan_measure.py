"""`trine plan` without measuring: what it refuses, the copy it measures, the processes' numbers from their
lines, and the CLI's errors (the measured runs are in tests/e2e/test_plan_vs_run.py)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from tests.helpers import EXAMPLE, write_config
from trine.cli import app
from trine.config import merge, validate_dict
from trine.inspect.estimate import Cost, Spread, StageEstimate
from trine.inspect.measure import copy_stage, refusals
from trine.inspect.measure_processes import explorer_estimate, with_explorers

EXAMPLE_DATA = EXAMPLE / "data" / "train.jsonl"

runner = CliRunner()


def stage(tmp_path, **extra):
    """One validated stage over the shipped arithmetic data, its model built on first use (not checked)."""
    data = {
        "name": "p",
        "run_dir": str(tmp_path / "run"),
        "model": {"path": str(tmp_path / "model"), "init_preset": "tiny-0.5m"},
        "tasks": {"batch_size": 4, "total_steps": 20, "train": {"path": str(EXAMPLE_DATA), "repeat": 2}},
    }
    stages, errors = validate_dict(merge(data, extra))
    assert not errors, errors
    return stages[0]


def test_it_refuses_ray_runs_and_tasks_it_cannot_replay(tmp_path):
    ray = stage(tmp_path, mode="async", cluster={"backend": "ray"}, buffer={"storage": "sql"})
    assert "runs on Ray" in refusals([ray])[0] and "cluster.backend=local" in refusals([ray])[0]
    assert refusals([stage(tmp_path)]) == []


def test_the_measured_copy_writes_only_into_the_temporary_directory(tmp_path):
    cfg = stage(tmp_path, monitor={"sinks": ["console", "jsonl", "wandb"]}, buffer={"storage": "sql"})
    cfg = cfg.model_copy(update={"buffer": cfg.buffer.model_copy(update={"url": "postgresql://db/x"})})
    tmp = tmp_path / "plan"
    copy = copy_stage(cfg, tmp)
    assert copy.run_path == tmp / "run" and copy.resume is False
    assert copy.model.path == str(tmp / "model")  # built there (timed), not where the run builds it
    assert copy.monitor.sinks == ["console", "jsonl"]  # no run logged to W&B
    assert copy.buffer.url is None  # SQLite in the temporary run directory, not the configured database
    assert cfg.run_path == tmp_path / "run"  # the original is untouched
    built = tmp_path / "model"
    built.mkdir()
    assert copy_stage(cfg, tmp).model.path == str(built)  # an existing model is loaded where it is


def _processes_stage(tmp_path):
    return stage(
        tmp_path, mode="async", launch="processes", buffer={"storage": "sql"}, eval={"every": 5}
    )  # 4 tasks x 2 samples a batch; the trainer takes one batch's rows per step


def _line(step, unix, seconds, train):
    return {"step": step, "time/unix": unix, "time/step_seconds": seconds, "time/train_seconds": train}


def test_the_explorer_processes_join_the_trainers_stage(tmp_path):
    cfg = _processes_stage(tmp_path)
    started = 1000.0  # the explorers were started
    trainer = [_line(1, 1004.0, 3.0, 0.4), _line(2, 1004.5, 0.5, 0.4), _line(3, 1005.0, 0.5, 0.4),
               _line(4, 1005.6, 0.6, 0.4), _line(5, 1006.2, 0.6, 0.45)]  # fmt: skip
    stage = StageEstimate(
        "main", "async", "processes", 20, 3, 2,
        [Cost("first 3 steps (warm-up)", Spread.exact(4.0), 1), Cost("step", Spread(0.6, 0.6, 0.6, 2), 17),
         Cost("training step", Spread(0.4, 0.4, 0.45, 2), 20, counted=False)],
        peak_rss_mb=500.0,
    )  # fmt: skip
    # batches before the trainer's warm-up ended (1005.0) are left out: 0.8 s apart, then 0.7 s with 0.1 paced
    explorer = [
        {"time/unix": t, "explorer/paced_seconds": 0.1} for t in (1003.4, 1004.2, 1005.0, 1005.7, 1006.4)
    ]
    est = with_explorers(stage, cfg, trainer, [explorer], started, {"explorer-0": 400.0})
    costs = {c.name: c for c in est.costs}
    step = costs["step"].each  # the explorer's busy 0.6 s per step is no slower than the trainer's 0.6 s
    assert (step.mid, step.low, step.high) == pytest.approx((0.6, 0.6, 0.6)) and step.samples == 2
    assert costs["sampling, per explorer batch (pacing excluded)"].each.mid == pytest.approx(0.6)
    assert [c.name for c in est.costs][:3] == [
        "first 3 steps (warm-up)",
        "step",
        "sampling, per explorer batch (pacing excluded)",
    ]
    trainer_row, explorer_row = est.processes
    assert trainer_row.startup == pytest.approx(4.0) and trainer_row.busy.mid == pytest.approx(0.4)
    assert trainer_row.peak_rss_mb == 500.0 and trainer_row.count == 20
    assert explorer_row.startup == pytest.approx(3.4) and explorer_row.each.mid == pytest.approx(0.7)
    assert explorer_row.count == 20 and explorer_row.peak_rss_mb == 400.0
    slow = [{"time/unix": 1005.0 + 0.9 * i, "explorer/paced_seconds": 0.0} for i in range(4)]
    bounded = {c.name: c for c in with_explorers(stage, cfg, trainer, [slow], started, {}).costs}
    assert bounded["step"].each.mid == pytest.approx(0.9)  # the explorer is the slower side: its pace


def test_an_explorer_with_no_lines_has_no_numbers():
    est = explorer_estimate("explorer-1", [], 0.0, 10)
    assert est.count == 0 and est.each.samples == 0


def test_the_cli_reports_every_config_error_at_once(tmp_path):
    config = write_config(
        tmp_path / "bad.yaml",
        model={"path": str(tmp_path / "missing")},
        tasks={"batch_size": 0, "train": {"path": str(tmp_path / "none.jsonl")}},
    )
    result = runner.invoke(app, ["plan", str(config)])
    assert result.exit_code == 2
    assert "tasks.batch_size" in result.output and "missing" in result.output
    assert not (tmp_path / "runs").exists()


def test_the_cli_refuses_what_it_cannot_measure_before_loading_anything(tmp_path):
    data = {
        "model": {"path": str(tmp_path / "model"), "init_preset": "tiny-0.5m"},
        "mode": "async",
        "cluster": {"backend": "ray"},
        "buffer": {"storage": "sql"},
        "tasks": {"batch_size": 4, "total_steps": 5, "train": {"path": str(EXAMPLE_DATA)}},
    }
    result = runner.invoke(app, ["plan", str(write_config(tmp_path / "ray.yaml", data))])
    assert result.exit_code == 2, result.output
    assert "cannot measure this config" in result.output and "Ray" in result.output
    assert not (tmp_path / "model").exists()
