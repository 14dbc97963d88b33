"""Two trainer ranks under torchrun (gloo on CPU): a supervised run sharded by FSDP2 takes the same steps
as one process, writes its run directory once (rank 1 keeps its own files apart), and resumes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from tests.helpers import EXAMPLE, read_metrics, trine, write_arithmetic_config, write_config
from trine.models import load_model

pytestmark = pytest.mark.slow

KEYS = ("trainer/loss", "trainer/grad_norm", "trainer/batch_size")


def _config(tmp_path, model_dir, name: str, **extra) -> str:
    cfg = {
        "name": name,
        "run_dir": str(tmp_path / name),
        "seed": 0,
        "num_threads": 1,
        "mode": "train",
        "model": {"path": str(model_dir)},
        "algorithm": {"name": "sft"},
        "tasks": {
            "batch_size": 8,
            "total_steps": 4,
            "train": {"path": str(EXAMPLE / "data" / "train.jsonl")},
            "eval": [
                {
                    "name": "addition",
                    "path": str(EXAMPLE / "data" / "eval.jsonl"),
                    "sampling": {"max_tokens": 4},
                }
            ],
        },
        "trainer": {"lr": 3e-3, "fsdp": True, "micro_batch_tokens": 64, "save_every": 2},
        "eval": {"at_start": False, "k": 2},  # at the end: every rank samples the same, over the shards
        "monitor": {"sinks": ["jsonl"], "plot": False},
        **extra,
    }
    return str(write_config(tmp_path / f"{name}.yaml", cfg))


def _torchrun(config: str, *overrides: str, command: str = "run") -> subprocess.CompletedProcess:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(port),
    ]
    launcher += ["-m", "trine.cli", command, config, *overrides]
    return subprocess.run(launcher, capture_output=True, text=True, timeout=400)


def test_two_ranks_train_like_one_process_and_resume(tmp_path, tiny_model_dir):
    alone = _config(tmp_path, tiny_model_dir, "alone")
    subprocess.run(
        [sys.executable, "-m", "trine.cli", "run", alone], check=True, capture_output=True, timeout=300
    )
    reference = read_metrics(tmp_path / "alone")

    ranked = _config(tmp_path, tiny_model_dir, "ranked")
    done = _torchrun(ranked)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = read_metrics(tmp_path / "ranked")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for got, want in zip(rows, reference, strict=True):
        assert {k: got[k] for k in KEYS} == pytest.approx({k: want[k] for k in KEYS}, rel=1e-4, abs=1e-6)
    follower = tmp_path / "ranked" / "ranks" / "1"
    assert [r["step"] for r in read_metrics(follower)] == [1, 2, 3, 4]  # its own records, apart
    evals = [r["eval/addition/avg@2"] for r in (rows[-1], read_metrics(follower)[-1], reference[-1])]
    assert evals[0] == evals[1] == evals[2]  # the ranks evaluated the same samples as one process
    assert json.loads((tmp_path / "ranked" / "status.json").read_text())["state"] == "finished"
    weights = load_model(tmp_path / "ranked" / "checkpoints" / "step_4").state_dict()
    single = load_model(tmp_path / "alone" / "checkpoints" / "step_4").state_dict()
    assert max(float((weights[k] - v).abs().max()) for k, v in single.items()) < 1e-4

    stopped = _config(tmp_path, tiny_model_dir, "stopped")
    first = _torchrun(stopped, "stop_after_steps=2")
    assert first.returncode == 0, first.stderr[-3000:]
    again = _torchrun(stopped)  # every rank resumes from its own step-2 checkpoint (its optimizer shard)
    assert again.returncode == 0, again.stderr[-3000:]
    resumed = read_metrics(tmp_path / "stopped")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for got, want in zip(resumed, rows, strict=True):
        assert {k: got[k] for k in KEYS} == pytest.approx({k: want[k] for k in KEYS}, rel=1e-4, abs=1e-6)


def test_ranks_refuse_a_config_they_cannot_split(tmp_path, tiny_model_dir):
    config = _config(tmp_path, tiny_model_dir, "unsharded")
    done = _torchrun(config, "trainer.fsdp=false")
    assert done.returncode != 0
    assert "2 trainer ranks (torchrun)" in done.stderr and "trainer.fsdp is false" in done.stderr


def test_a_two_rank_trainer_process_learns_from_an_explorer_process(tmp_path, tiny_model_dir):
    """``torchrun --nproc-per-node 2 trine train`` next to ``trine explore``: rank 0 takes each batch from the
    SQL buffer and hands it to rank 1, the explorer gets rank 0's weights, every step is trained once."""
    from trine.buffer.inspect import read_rows

    config = write_arithmetic_config(
        tmp_path,
        tiny_model_dir,
        "procs",
        {
            "mode": "async",
            "launch": "processes",
            "num_threads": 1,
            "tasks": {"batch_size": 2, "total_steps": 4, "train": {"repeat": 4}},
            "buffer": {"storage": "sql", "max_staleness": 2},
            "trainer": {"fsdp": True, "save_every": 2},
            "sync": {"wait_timeout": 120},
        },
    )
    explorer = trine("explore", str(config), "--explorer-id", "0", "--explorers", "1")
    try:
        done = _torchrun(str(config), command="train")
        assert done.returncode == 0, done.stderr[-3000:]
        out, _ = explorer.communicate(timeout=120)
        assert explorer.returncode == 0, out
    finally:
        if explorer.poll() is None:
            explorer.kill()
    run_dir = tmp_path / "procs"
    trained = [r for r in read_metrics(run_dir) if "trainer/loss" in r]
    assert [r["step"] for r in trained] == [1, 2, 3, 4] and all(r["trainer/batch_size"] == 8 for r in trained)
    assert [r["step"] for r in read_metrics(run_dir / "ranks" / "1") if "trainer/loss" in r] == [1, 2, 3, 4]
    consumed = [e for e, status in read_rows(run_dir) if status == "trained"]
    assert len(consumed) == 4 * 8 and len({e.id for e in consumed}) == 32  # each experience trained once
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"
