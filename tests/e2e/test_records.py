"""What a run leaves behind: the run directory used in config.yaml, `stopped` after Ctrl-C, and a table
of eval samples at every eval in W&B (offline) and MLflow (local SQLite store)."""

from __future__ import annotations

import json

import pytest
import yaml

import trine.stage
from tests.helpers import EXAMPLE, read_metrics, wandb_history
from trine.config import load_config
from trine.explorer.evaluator import Evaluator
from trine.loop import run

EVAL_TABLE_ROWS = Evaluator.table_rows  # rollouts per eval taskset sent to the monitor as a table

pytestmark = pytest.mark.slow


def test_config_yaml_records_the_default_run_directory(arithmetic_config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = arithmetic_config({"run_dir": None, "tasks": {"total_steps": 1}}, name="defaulted")
    summary = run(load_config(cfg))
    assert summary["run_dir"] == "runs/defaulted"
    written = yaml.safe_load((tmp_path / "runs" / "defaulted" / "config.yaml").read_text())
    assert written["run_dir"] == "runs/defaulted"  # was null


def test_ctrl_c_ends_stopped_and_the_next_run_resumes(arithmetic_config, tmp_path, monkeypatch, capsys):
    consume = trine.trainer.side.TrainerSide.consume

    def interrupt_at_step_3(side):
        if side.version == 2:  # steps done (one stage, one version per step)
            raise KeyboardInterrupt
        return consume(side)

    cfg = arithmetic_config({"trainer": {"save_every": 1}, "tasks": {"total_steps": 4}}, name="ctrlc")
    monkeypatch.setattr(trine.trainer.side.TrainerSide, "consume", interrupt_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        run(load_config(cfg))
    monkeypatch.undo()
    status = json.loads((tmp_path / "ctrlc" / "status.json").read_text())
    assert status["state"] == "stopped" and status["step"] == 2 and "KeyboardInterrupt" in status["reason"]
    capsys.readouterr()
    run(load_config(cfg))
    assert "resuming from step 2 (checkpoint " in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(tmp_path / "ctrlc")] == [1, 2, 3, 4]
    assert json.loads((tmp_path / "ctrlc" / "status.json").read_text())["state"] == "finished"


@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch):
    """A local SQLite MLflow store, forgotten afterwards (MLflow keeps its URI process-wide)."""
    import mlflow

    monkeypatch.chdir(tmp_path)  # MLflow keeps artifacts under ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    yield uri
    mlflow.set_tracking_uri(None)


def test_every_eval_sends_a_table_of_samples_to_wandb_and_mlflow(
    arithmetic_config, tmp_path, monkeypatch, mlflow_uri
):
    import mlflow
    from mlflow import MlflowClient

    uri = mlflow_uri
    for key, value in {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(tmp_path),
        "WANDB_SILENT": "true",
        "WANDB_CONFIG_DIR": str(tmp_path / "wandb-config"),
    }.items():
        monkeypatch.setenv(key, value)
    evalset = {"name": "addition", "path": str(EXAMPLE / "data" / "eval.jsonl"), "reward": "exact_match"}
    over = {
        "tasks": {"total_steps": 2, "eval": [{**evalset, "sampling": {"max_tokens": 4}}]},
        "eval": {"every": 1, "k": 0},
        "monitor": {"sinks": ["jsonl", "wandb", "mlflow"]},
    }
    try:
        run(load_config(arithmetic_config(over, name="tables")))
    finally:
        import wandb

        wandb.teardown()  # wandb reads its settings (WANDB_DIR...) once per process

    run_id = json.loads((tmp_path / "tables" / "mlflow_run.json").read_text())["run_id"]
    client = MlflowClient(uri)
    steps = [m.step for m in client.get_metric_history(run_id, "eval/addition/accuracy")]
    assert steps == [1, 2]
    for step in steps:
        table = mlflow.load_table(f"eval/addition/samples/step_{step:06d}.json", run_ids=[run_id])
        assert len(table) == EVAL_TABLE_ROWS and set(table["step"]) == {step}
        assert {"prompt", "response", "reward", "answer"} <= set(table.columns)
        assert set(table["mode"]) == {"greedy"}

    (offline,) = (tmp_path / "wandb").glob("offline-run-*")
    history = wandb_history(offline)
    tables = [
        (h["_step"], h["eval/addition/samples.nrows"]) for h in history if "eval/addition/samples.nrows" in h
    ]
    assert tables == [(1, EVAL_TABLE_ROWS), (2, EVAL_TABLE_ROWS)]
    first = json.loads((offline / "files" / history[0]["eval/addition/samples.path"]).read_text())
    rows = [dict(zip(first["columns"], row)) for row in first["data"]]
    prompts = [
        json.loads(line)["question"] for line in (EXAMPLE / "data" / "eval.jsonl").read_text().splitlines()
    ]
    assert [r["prompt"] for r in rows] == prompts[:EVAL_TABLE_ROWS]
    assert all(r["reward"] in (0.0, 1.0) and isinstance(r["response"], str) for r in rows)
