"""Experiment trackers as metric sinks: Weights & Biases and MLflow (both imported lazily).

Both keep one tracker run per Trine run directory: the tracker's run id and the last step sent are
kept in ``<run_dir>/<sink>_run.json``. Resuming from a checkpoint continues the same tracker run.
Neither tracker can take back points already logged (W&B's "rewind" is an online-only preview;
MLflow's metric history is append-only), so on resume the sink skips the steps the tracker already
has, those logged between the checkpoint and the crash: each step appears once, with the crashed
timeline's values for the replayed steps (a resumed Trine run replays them with the same numbers,
timings aside). A fresh start in a directory (no checkpoint) opens a new tracker run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from trine.monitor.sinks import _require, scalars


class _RunRecord:
    """``<run_dir>/<sink>_run.json``: the tracker's run id and the last step sent to it."""

    def __init__(self, run_dir: str | Path | None, sink: str):
        self.path = Path(run_dir) / f"{sink}_run.json" if run_dir is not None else None
        self.data: dict[str, Any] = {}

    def resumable(self, resume_step: int | None) -> dict[str, Any]:
        """The recorded run to continue when resuming from a checkpoint (``resume_step`` > 0), else {}."""
        if self.path is None or not resume_step or not self.path.is_file():
            return {}
        return json.loads(self.path.read_text())

    def write(self, **data: Any) -> None:
        """Update the record (atomically)."""
        self.data.update(data)
        if self.path is not None:
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps(self.data))
            os.replace(tmp, self.path)


def _columns(rows: list[dict[str, Any]]) -> list[str]:
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    return columns


class WandbSink:
    """Logs to Weights & Biases (``pip install wandb``); ``config`` is stored with the run.

    ``WANDB_MODE=offline`` writes the run under ``WANDB_DIR`` (``wandb sync`` uploads it later);
    ``init_args`` go to ``wandb.init`` as they are (entity, tags, dir, ...). Tables (``log_table``)
    become ``wandb.Table`` values. Resume: with ``run_dir`` and a ``resume_step`` > 0 (a checkpoint),
    the run recorded in ``run_dir/wandb_run.json`` is continued (``wandb.init(id=..., resume="allow")``)
    and the steps it already has are skipped (see the module docstring). Offline, each resume writes a
    new ``offline-run-*`` directory with the same run id; sync them in order.
    """

    def __init__(
        self,
        project: str = "trine",
        name: str | None = None,
        config: dict[str, Any] | None = None,
        run_dir: str | Path | None = None,
        resume_step: int | None = None,
        **init_args: Any,
    ):
        wandb = _require("wandb", "wandb")
        self.wandb = wandb
        self.record = _RunRecord(run_dir, "wandb")
        prior = self.record.resumable(resume_step)
        if prior.get("id"):
            init_args = {"id": prior["id"], "resume": "allow", **init_args}
        self.run = wandb.init(project=project, name=name, config=config or {}, **init_args)
        self.skip_through = int(prior.get("last_step", -1))
        self.record.write(id=self.run.id, last_step=self.skip_through)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Log the numeric metrics at ``step`` (steps the run already has are skipped)."""
        if step <= self.skip_through:
            return
        self.run.log(scalars(metrics), step=step)
        if step > self.record.data["last_step"]:
            self.record.write(last_step=step)

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        """Log ``rows`` (dicts with the same keys) as a ``wandb.Table`` called ``name`` at ``step``."""
        if step <= self.skip_through or not rows:
            return
        columns = _columns(rows)
        table = self.wandb.Table(columns=columns, data=[[row.get(c) for c in columns] for row in rows])
        self.run.log({name: table}, step=step)

    def close(self) -> None:
        """Finish the wandb run."""
        self.run.finish()


def _mlflow_key(key: str) -> str:
    # MLflow metric names allow alphanumerics, _ - . space : and / only (so avg@8 -> avg_at_8).
    key = key.replace("@", "_at_")
    return "".join(c if c.isalnum() or c in "_-. :/" else "_" for c in key)


class MlflowSink:
    """Logs to MLflow (``pip install mlflow``, or ``mlflow-skinny`` + ``alembic`` for a local SQLite
    store) under ``experiment``; ``tracking_uri`` None = MLflow's default (``MLFLOW_TRACKING_URI``).

    Metric keys are made MLflow-safe (``avg@8`` -> ``avg_at_8``). Tables (``log_table``) go to
    ``mlflow.log_table`` as the artifact ``<name>/step_<step>.json`` (with a ``step`` column; read
    back with ``mlflow.load_table``). Resume: with ``run_dir`` and a
    ``resume_step`` > 0, the run recorded in ``run_dir/mlflow_run.json`` is continued
    (``mlflow.start_run(run_id=...)``) and the steps it already has are skipped (its metric history
    is append-only: logging them again would give those steps two values).
    """

    def __init__(
        self,
        experiment: str = "trine",
        run_name: str | None = None,
        tracking_uri: str | None = None,
        config: dict[str, Any] | None = None,
        run_dir: str | Path | None = None,
        resume_step: int | None = None,
    ):
        mlflow = _require("mlflow", "mlflow")
        if tracking_uri:
            mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_experiment(experiment)
        self.mlflow = mlflow
        self.record = _RunRecord(run_dir, "mlflow")
        prior = self.record.resumable(resume_step)
        if prior.get("run_id"):
            self.run = mlflow.start_run(run_id=prior["run_id"])
        else:
            self.run = mlflow.start_run(run_name=run_name)
            if config:
                mlflow.log_dict(config, "config.json")
        self.skip_through = int(prior.get("last_step", -1))
        self.record.write(run_id=self.run.info.run_id, last_step=self.skip_through)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Log the numeric metrics at ``step`` (keys made MLflow-safe; steps the run has are skipped)."""
        if step <= self.skip_through:
            return
        self.mlflow.log_metrics({_mlflow_key(k): v for k, v in scalars(metrics).items()}, step=step)
        if step > self.record.data["last_step"]:
            self.record.write(last_step=step)

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        """Write ``rows`` with a ``step`` column as the run's table artifact ``<name>/step_<step>.json``.

        One file per step: appending to one artifact makes MLflow re-read it through pandas, which
        turns earlier string cells such as a response ``"3"`` into numbers.
        """
        if step <= self.skip_through or not rows:
            return
        columns = _columns(rows)
        data = {"step": [step] * len(rows), **{c: [row.get(c) for row in rows] for c in columns}}
        artifact = f"{name}/step_{step:06d}.json"
        self.mlflow.log_table(data, artifact_file=artifact, run_id=self.run.info.run_id)

    def close(self) -> None:
        """End the MLflow run."""
        self.mlflow.end_run()
