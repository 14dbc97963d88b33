"""A verifiers environment trained through ``trine serve``, offline: verifiers 0.4 runs in its own virtualenv
(scripts/side_venv.sh; its openai/mcp pins clash with Trine's), ``vf-eval`` plays the locally defined taskset
examples/verifiers/trine_sums against the served model through examples/verifiers/driver.py (a recording
proxy), the driver posts each trace's reward to ``/v1/feedback``, and ``trine train`` trains on those rows.
Skipped, with the reason, where pip cannot install verifiers or uv cannot prepare its chat program."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers import ROOT, read_metrics, served_url, trine, write_config

pytest.importorskip("fastapi", reason="trine serve needs the fastapi/uvicorn of the dev extra")

ROUNDS, QUESTIONS, SAMPLES, STEPS = 3, 4, 2, 2


@pytest.fixture(scope="module")
def verifiers_python() -> str:
    made = subprocess.run(
        ["bash", str(ROOT / "scripts" / "side_venv.sh"), "verifiers", "verifiers==0.4.0", "uv"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if made.returncode != 0:
        pytest.skip(f"verifiers could not be installed in its own venv: {made.stderr.strip()[-600:]}")
    return made.stdout.strip().splitlines()[-1]


def _config(tmp_path: Path, model: Path) -> Path:
    data = yaml.safe_load((ROOT / "examples" / "serve_agent" / "config.yaml").read_text())
    data.update(run_dir=str(tmp_path / "run"), model={"path": str(model)})
    data["tasks"]["total_steps"] = STEPS
    data["trainer"]["batch_size"] = QUESTIONS * SAMPLES  # one driver round per step
    data["buffer"].update(end_after_idle=None, get_timeout=300)
    data["serve"]["port"] = 0
    data["monitor"] = {"sinks": ["jsonl"], "plot": False}
    return write_config(tmp_path / "serve.yaml", data)


def test_a_verifiers_environment_trains_through_trine_serve(verifiers_python, sft_start, tmp_path):
    config = _config(tmp_path, sft_start)
    server = trine("serve", str(config))
    trainer = None
    try:
        url = served_url(server)
        trainer = trine("train", str(config))
        command = [
            verifiers_python,
            str(ROOT / "examples" / "verifiers" / "driver.py"),
            "--base-url",
            url,
            "--model",
            "serve_agent",
            "--rounds",
            str(ROUNDS),
            "--questions",
            str(QUESTIONS),
            "--samples",
            str(SAMPLES),
            "--out",
            str(tmp_path / "vf"),
        ]
        driven = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
        if driven.returncode != 0 and "failed to prepare uv script" in driven.stderr + driven.stdout:
            pytest.skip(f"verifiers' chat program needs uv and PyPI once: {driven.stderr[-600:]}")
        assert driven.returncode == 0, driven.stdout + driven.stderr
        log = [json.loads(line) for line in driven.stdout.splitlines() if line.startswith("{")]
        out, _ = trainer.communicate(timeout=300)
        assert trainer.returncode == 0, out
    finally:
        for proc in (server, trainer):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)

    assert [r["traces"] for r in log] == [QUESTIONS * SAMPLES] * ROUNDS
    # every call got its trace's reward
    assert all(r["posted"] == r["traces"] and r["unmatched"] == 0 for r in log), log
    with sqlite3.connect(tmp_path / "run" / "buffer.db") as db:
        rows = db.execute("select task_id, reward from experiences").fetchall()
    rewarded = [reward for _, reward in rows if reward is not None]
    assert len(rewarded) == ROUNDS * QUESTIONS * SAMPLES and set(rewarded) <= {0.0, 1.0}
    assert sum(rewarded) / len(rewarded) == pytest.approx(sum(r["reward"] for r in log) / ROUNDS)
    assert len({task for task, _ in rows}) == ROUNDS * QUESTIONS  # the rollouts of a task: one GRPO group
    trained = [m for m in read_metrics(tmp_path / "run") if "trainer/loss" in m]
    assert len(trained) == STEPS, trained
