"""What a ``trine train`` / ``trine explore`` process refuses before it touches the run: a config that is
not one async stage, a buffer other processes cannot open, settings that differ from the run's, a second
trainer."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.helpers import write_arithmetic_config
from trine.cli import app
from trine.config import load_config
from trine.launch.processes import check_shared_config, trainer_lock

runner = CliRunner()


def _config(tmp_path, model_dir, **extra):
    base = {"mode": "async", "buffer": {"storage": "sql"}, "tasks": {"total_steps": 2}}
    return write_arithmetic_config(tmp_path, model_dir, "procs", base, extra)


def _said(result) -> str:
    return " ".join((result.output or "").split())


def test_a_buffer_that_cannot_be_shared_is_refused(tmp_path, tiny_model_dir):
    config = _config(tmp_path, tiny_model_dir, buffer={"storage": "memory"})
    result = runner.invoke(app, ["train", str(config)])
    assert result.exit_code == 2, result.output
    assert "buffer.storage='memory' cannot be shared between processes; set buffer.storage: sql" in _said(
        result
    )
    assert not (tmp_path / "procs").exists()  # refused before anything was written


def test_only_one_async_stage_runs_as_a_process(tmp_path, tiny_model_dir):
    config = _config(tmp_path, tiny_model_dir, mode="sync", buffer={"storage": "sql"})
    result = runner.invoke(app, ["explore", str(config)])
    assert result.exit_code == 2 and "runs one stage of mode async" in _said(result)


def test_settings_that_differ_from_the_run_are_named(tmp_path, tiny_model_dir):
    config = _config(tmp_path, tiny_model_dir)
    (cfg,) = load_config(config)
    check_shared_config(cfg, tmp_path / "procs")  # the first process records the run's settings
    shared = tmp_path / "procs" / "shared_config.json"
    shared.write_text(json.dumps({**json.loads(shared.read_text()), "seed": 7, "tasks.batch_size": 8}))
    result = runner.invoke(app, ["train", str(config)])
    said = _said(result)
    assert (
        result.exit_code == 2 and "other settings: seed (7 there, 0 here), tasks.batch_size (8 there" in said
    )
    assert "Start every process with the same config" in said


def test_a_second_trainer_is_refused(tmp_path, tiny_model_dir):
    config = _config(tmp_path, tiny_model_dir)
    with trainer_lock(tmp_path / "procs"):
        result = runner.invoke(app, ["train", str(config)])
    assert result.exit_code == 2 and "another trainer" in _said(result) and "is locked" in _said(result)


def test_an_explorer_process_prints_a_line_per_batch():
    """``trine explore``'s line per batch: its index, the weights version, the reward (pending ones as such,
    not NaN), the response length and the seconds (with those spent pacing)."""
    from trine.launch.processes import batch_line

    explored = {
        "explorer/version": 2.0,
        "explorer/reward_mean": 0.53125,
        "explorer/response_length_mean": 4.25,
        "explorer/paced_seconds": 0.4,
    }
    line = batch_line("explorer-1", 3, explored, 1.234)
    assert line == "explorer-1 batch 3 | weights v2 | reward 0.531 | len 4.25 | time 1.23s (paced 0.40s)"
    pending = {"explorer/version": 0.0, "explorer/reward_mean": float("nan"), "explorer/reward_pending": 16.0}
    assert (
        batch_line("explorer-0", 1, pending, 0.5)
        == "explorer-0 batch 1 | weights v0 | reward pending 16 | time 0.50s"
    )
