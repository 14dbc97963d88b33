"""The W&B and MLflow sinks against the real packages, offline: W&B in offline mode (read back with
``wandb leet inspect --json``, W&B's own reader of its run files) and MLflow with a local SQLite
store (read back with ``MlflowClient``): metrics, tables of eval samples, and resume (each step once)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers import wandb_history
from trine.monitor import SINKS, Monitor
from trine.monitor.sinks import _require

wandb = pytest.importorskip("wandb", reason="the dev extra installs wandb")
mlflow = pytest.importorskip("mlflow", reason="the dev extra installs mlflow-skinny")

ROWS = [
    {"prompt": "1+2=", "response": "3", "reward": 1.0, "answer": "3"},
    {"prompt": "4+4=", "response": "9", "reward": 0.0, "answer": "8"},
]


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B offline, writing under tmp_path/wandb-files (nothing leaves the machine)."""
    root = tmp_path / "wandb-files"
    root.mkdir()
    for key, value in {"WANDB_MODE": "offline", "WANDB_DIR": str(root), "WANDB_SILENT": "true"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    yield root / "wandb"
    wandb.teardown()  # wandb reads its settings (WANDB_DIR...) once per process: start over next time


def test_wandb_offline_metrics_tables_and_resume(offline_wandb, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    sink = SINKS["wandb"](name="t", config={"seed": 3}, run_dir=run_dir, resume_step=0)
    monitor = Monitor([sink])
    monitor.log({"trainer/loss": 0.5, "eval/t/avg@8": 0.25, "stage": "grpo"}, step=1)
    monitor.log_table("eval/t/samples", ROWS, step=2)
    monitor.log({"trainer/loss": 0.25}, step=2)
    monitor.log({"trainer/loss": 0.125}, step=3)
    monitor.close()
    first = sorted(offline_wandb.glob("offline-run-*"))
    assert len(first) == 1
    history = wandb_history(first[0])
    assert [(h["_step"], h["trainer/loss"]) for h in history] == [(1, 0.5), (2, 0.25), (3, 0.125)]
    assert history[0]["eval/t/avg@8"] == 0.25 and "stage" not in history[0]
    assert history[1]["eval/t/samples._type"] == "table-file" and history[1]["eval/t/samples.nrows"] == 2
    table = json.loads((first[0] / "files" / history[1]["eval/t/samples.path"]).read_text())
    assert table["columns"] == ["prompt", "response", "reward", "answer"]
    assert table["data"] == [list(r.values()) for r in ROWS]

    # killed after step 3, resumed from the checkpoint at step 1: the run continues, steps 2-3 not repeated
    resumed = SINKS["wandb"](name="t", run_dir=run_dir, resume_step=1)
    assert resumed.run.id == sink.run.id
    for step in (2, 3, 4):
        resumed.log({"trainer/loss": 1.0 / step}, step=step)
    resumed.close()
    (second,) = set(offline_wandb.glob("offline-run-*")) - set(first)
    assert f"-{sink.run.id}" in second.name  # the same W&B run (a "-1" suffix within the same second)
    assert [h["_step"] for h in wandb_history(second)] == [4]

    fresh = SINKS["wandb"](name="t", run_dir=run_dir, resume_step=0)  # no checkpoint: a new W&B run
    assert fresh.run.id != sink.run.id
    fresh.close()


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    """A local SQLite tracking store; artifacts under tmp_path/mlruns (MLflow puts them in the cwd)."""
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    yield uri
    if mlflow.active_run() is not None:
        mlflow.end_run()
    mlflow.set_tracking_uri(None)  # MLflow keeps the URI process-wide (and in os.environ): forget it


def test_mlflow_local_store_metrics_tables_and_resume(mlflow_store, tmp_path):
    from mlflow import MlflowClient

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    sink = SINKS["mlflow"](
        experiment="trine-test", tracking_uri=mlflow_store, config={"seed": 3}, run_dir=run_dir, resume_step=0
    )
    run_id = sink.run.info.run_id
    monitor = Monitor([sink])
    monitor.log({"trainer/loss": 0.5, "eval/t/avg@8": 0.25, "stage": "grpo"}, step=1)
    monitor.log_table("eval/t/samples", ROWS, step=1)
    monitor.log({"trainer/loss": 0.25}, step=2)
    monitor.log_table("eval/t/samples", ROWS[:1], step=2)
    monitor.log({"trainer/loss": 0.125}, step=3)
    monitor.close()

    resumed = SINKS["mlflow"](
        experiment="trine-test", tracking_uri=mlflow_store, run_dir=run_dir, resume_step=1
    )
    assert resumed.run.info.run_id == run_id
    for step in (2, 3, 4):
        resumed.log({"trainer/loss": 1.0 / step}, step=step)
    resumed.log_table("eval/t/samples", ROWS[1:], step=4)
    resumed.close()

    client = MlflowClient(tracking_uri=mlflow_store)
    history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "trainer/loss"))
    assert history == [(1, 0.5), (2, 0.25), (3, 0.125), (4, 0.25)]  # each step once
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "eval/t/avg_at_8")] == [(1, 0.25)]
    tables = sorted(a.path for a in client.list_artifacts(run_id, "eval/t/samples"))
    assert tables == [f"eval/t/samples/step_00000{s}.json" for s in (1, 2, 4)]
    table = mlflow.load_table(tables[0], run_ids=[run_id])  # pandas, dtypes inferred
    assert table["step"].tolist() == [1, 1] and table["reward"].tolist() == [1.0, 0.0]
    raw = [json.loads(Path(client.download_artifacts(run_id, t, str(tmp_path))).read_text()) for t in tables]
    assert raw[0]["columns"] == ["step", "prompt", "response", "reward", "answer"]
    assert [row[:3] for t in raw for row in t["data"]] == [
        [1, "1+2=", "3"],
        [1, "4+4=", "9"],
        [2, "1+2=", "3"],
        [4, "4+4=", "9"],
    ]
    config = json.loads(Path(client.download_artifacts(run_id, "config.json", str(tmp_path))).read_text())
    assert config == {"seed": 3}


def test_missing_tracker_package_says_how_to_install(monkeypatch):
    for package in ("wandb", "mlflow"):
        monkeypatch.setitem(sys.modules, package, None)  # `import wandb` now raises ImportError
        with pytest.raises(ImportError, match=f"pip install {package}"):
            _require(package, package)
        with pytest.raises(ImportError, match=f"the {package!r} monitor sink needs"):
            SINKS[package]()
