"""End-to-end runs of the real loop on a tiny model: resume, sync_offset and sync_interval."""

from __future__ import annotations

import json
import threading

import pytest

from tests.helpers import read_metrics
from trine.config import load_config
from trine.loop import run

pytestmark = pytest.mark.slow

VOLATILE = ("time/", "trainer/tokens_per_second", "sync/seconds")


def _stable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def test_stop_and_resume_is_bit_identical(arithmetic_config, tmp_path):
    full = arithmetic_config({"trainer": {"save_every": 3}}, name="full")
    before = set(threading.enumerate())  # a session's engine fixture may hold its own worker
    run(load_config(full))
    left = [t.name for t in set(threading.enumerate()) - before if t.name.startswith("trine-engine")]
    assert not left, f"the rollout engine's worker outlived the run: {left}"  # issue 25 item 12
    reference = _stable(read_metrics(tmp_path / "full"))
    assert [r["step"] for r in reference] == [1, 2, 3, 4, 5, 6]

    part = arithmetic_config({"trainer": {"save_every": 3}, "stop_after_steps": 3}, name="part")
    run(load_config(part))
    status = json.loads((tmp_path / "part" / "status.json").read_text())
    assert status["state"] == "stopped" and status["step"] == 3
    assert [r["step"] for r in read_metrics(tmp_path / "part")] == [1, 2, 3]

    run(load_config(part, ["stop_after_steps=null"]))  # same run directory: resumes at step 4
    resumed = _stable(read_metrics(tmp_path / "part"))
    assert [r["step"] for r in resumed] == [1, 2, 3, 4, 5, 6]
    assert resumed == reference  # same task order, same samples, same updates, bit for bit
    assert json.loads((tmp_path / "part" / "status.json").read_text())["state"] == "finished"


def test_sync_offset_explores_one_step_ahead(arithmetic_config, tmp_path):
    cfg = arithmetic_config({"sync": {"sync_offset": 1}}, name="offset")
    run(load_config(cfg))
    rows = read_metrics(tmp_path / "offset")
    # batch b is sampled with weights version b-1: every batch after the first is one version stale
    assert [r["buffer/staleness_max"] for r in rows] == [0, 1, 1, 1, 1, 1]
    assert [r["trainer/version"] for r in rows] == [1, 2, 3, 4, 5, 6]


def test_sync_interval_two_reuses_weights_for_two_batches(arithmetic_config, tmp_path):
    cfg = arithmetic_config({"sync": {"sync_interval": 2}}, name="interval")
    run(load_config(cfg))
    rows = read_metrics(tmp_path / "interval")
    # two batches per weight version: the second batch of each pair is trained one version late
    assert [r["buffer/staleness_max"] for r in rows] == [0, 1, 0, 1, 0, 1]


def test_copy_sync_without_offset_samples_exactly_what_shared_weights_do(arithmetic_config, tmp_path):
    """``sync.method: copy`` with ``sync_offset: 0`` explores from a snapshot pushed every
    ``sync_interval`` steps: the same weights at the same moments as the colocated default."""
    shared = arithmetic_config({"sync": {"sync_interval": 2}}, name="shared")
    copied = arithmetic_config({"sync": {"sync_interval": 2, "method": "copy"}}, name="copied")
    run(load_config(shared))
    run(load_config(copied))
    reference = _stable(read_metrics(tmp_path / "shared"))
    copied_rows = _stable(read_metrics(tmp_path / "copied"))
    # the same samples exactly; the trainer's float metrics up to the last bits (the step runs on the
    # engine's thread with shared weights, inline with a copy: CPU kernels may round differently per thread)
    assert [{k: v for k, v in r.items() if not k.startswith("trainer/")} for r in copied_rows] == [
        {k: v for k, v in r.items() if not k.startswith("trainer/")} for r in reference
    ]
    for got, want in zip(copied_rows, reference, strict=True):
        trained = {k: v for k, v in want.items() if k.startswith("trainer/")}
        assert {k: got[k] for k in trained} == pytest.approx(trained, rel=1e-5, abs=1e-7)
    assert [r["buffer/staleness_max"] for r in reference] == [0, 1, 0, 1, 0, 1]


def test_offset_run_resumes(arithmetic_config, tmp_path):
    over = {"sync": {"sync_offset": 1, "sync_interval": 2}, "trainer": {"save_every": 2}}
    full = arithmetic_config(over, name="ofull")
    run(load_config(full))
    part = arithmetic_config({**over, "stop_after_steps": 3}, name="opart")
    run(load_config(part))
    run(load_config(part, ["stop_after_steps=null"]))
    # buffer/size depends on how far the explorer thread has got when the trainer logs: timing, not state
    resumed, reference = (
        [{k: v for k, v in r.items() if k != "buffer/size"} for r in _stable(read_metrics(tmp_path / d))]
        for d in ("opart", "ofull")
    )
    assert resumed == reference


def broken_loss(**_):
    raise RuntimeError("this loss always fails")


def test_a_run_whose_first_step_fails_says_so(arithmetic_config, tmp_path):
    cfg = arithmetic_config({"algorithm": {"loss": "tests.e2e.test_loop:broken_loss"}}, name="broken")
    with pytest.raises(RuntimeError, match="always fails"):
        run(load_config(cfg))
    status = json.loads((tmp_path / "broken" / "status.json").read_text())
    assert status["state"] == "failed" and status["step"] == 0
    assert "RuntimeError: this loss always fails" in status["error"]
    assert not (tmp_path / "broken" / "checkpoints").exists()  # nothing half-written looks valid


def test_mixed_tasksets_with_weights_and_a_curriculum(arithmetic_config, tmp_path):
    """Two tasksets mixed 3:1 per batch; the curriculum gets the explorer's pass rates as feedback."""
    from tests.helpers import EXAMPLE

    other = {"path": str(EXAMPLE / "data" / "eval.jsonl"), "name": "other", "weight": 1.0}
    cfg = arithmetic_config(
        {
            "tasks": {
                "batch_size": 4,
                "total_steps": 4,
                "mix": [other],
                "curriculum": {},
                "train": {"weight": 3.0},
            },
            "explorer": {"dump_rollouts": True},
        },
        name="mixed",
    )
    run(load_config(cfg))
    rows = [json.loads(line) for line in (tmp_path / "mixed" / "rollouts.jsonl").read_text().splitlines()]
    per_batch = {}
    for r in rows:
        per_batch.setdefault(r["batch"], []).append(r["task_id"].split("/")[0])
    assert all(sorted(v) == ["other", "train", "train", "train"] for v in per_batch.values())


def test_operator_pipeline_between_explorer_and_buffer(arithmetic_config, tmp_path):
    """buffer.operators runs on every explored batch, with per-operator counts and timing in the metrics."""
    ops = [{"name": "invalid_reward"}, {"name": "length", "max_length": 3}, {"name": "duplicate_responses"}]
    cfg = arithmetic_config({"buffer": {"operators": ops}, "tasks": {"total_steps": 2}}, name="ops")
    run(load_config(cfg))
    rows = read_metrics(tmp_path / "ops")
    for r in rows:
        assert r["operators/length/in"] == 16 and r["operators/length/out"] <= 16
        assert r["operators/duplicate_responses/out"] == r.get("trainer/batch_size", 0)  # stored == trained
        assert "operators/invalid_reward/seconds" in r
