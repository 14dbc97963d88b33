"""``trine bench`` on a run that is still training (a real ``trine run`` subprocess that checkpoints every
step and rotates them, ``keep_checkpoints: 2``): the bench reads only complete checkpoints, skips the ones
rotated away meanwhile with a warning, leaves the run's status alone, and each result equals the eval the
run itself logged at that step."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import EXAMPLE, write_arithmetic_config
from trine.config import load_config
from trine.launch.bench import bench, read_bench
from trine.status import read_status
from trine.trainer.checkpoint import list_checkpoints

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def parity_reward(response: str, task: object, **_: object) -> float:
    """1 for an even-length response: an untrained model scores about half."""
    return float(len(response) % 2 == 0)


def _config(tmp_path: Path, model: Path) -> Path:
    # One eval task: each eval is then one request to the engine (greedy, then k samples), so the draws
    # from the seeded stream cannot depend on how concurrent requests happen to be batched together
    # (timing: the run and the bench would then sample differently from the same seed, because
    # evaluation seeds one stream for all its requests, not each request).
    evals = tmp_path / "eval.jsonl"
    evals.write_text("".join((EXAMPLE / "data" / "eval.jsonl").read_text().splitlines(True)[:1]))
    return write_arithmetic_config(
        tmp_path,
        model,
        "live",
        {
            "num_threads": 1,
            "tasks": {
                "total_steps": 500,  # never reached: the test stops the run
                "batch_size": 2,
                "eval": [
                    {
                        "path": str(evals),
                        "name": "parity",
                        "reward": "tests.e2e.test_bench_live:parity_reward",
                        "sampling": {"temperature": 1.0, "max_tokens": 4},
                    }
                ],
            },
            "eval": {"every": 1, "k": 2},
            "trainer": {"save_every": 1, "keep_checkpoints": 2},
        },
    )


def _wait_for_checkpoints(proc: subprocess.Popen, root: Path, count: int, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while len(list_checkpoints(root)) < count:
        assert proc.poll() is None, f"the run ended early: {proc.communicate()[0]}"
        assert time.monotonic() < deadline, f"no {count} checkpoints in {root} after {limit} s"
        time.sleep(0.1)


def test_bench_reads_a_live_runs_checkpoints_and_matches_its_eval(tmp_path, tiny_model_dir):
    config = _config(tmp_path, tiny_model_dir)
    run_dir = tmp_path / "live"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trine.cli", "run", str(config)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        _wait_for_checkpoints(proc, run_dir / "checkpoints", 2)
        stages = load_config(config)
        said: list[str] = []
        results = [bench(stages, say=said.append) for _ in range(3)]  # the run keeps saving and rotating
        assert proc.poll() is None, "the run must still be training while it is benched"
        assert read_status(run_dir)["state"] == "running"
    finally:
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 143, output
    assert read_status(run_dir)["state"] == "stopped"

    rows = [r for res in results for r in res.rows if not r.cached]
    assert rows, f"nothing was evaluated: {said}"
    notes = [n for res in results for n in res.notes]
    assert all("already in bench.jsonl" in n or "removed meanwhile (rotation)" in n for n in notes), notes
    logged = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        logged[record["step"]] = {k: v for k, v in record.items() if k.startswith("eval/")}
    for row in rows:  # what the run logged at the step, bit for bit
        assert row.metrics == logged[row.step], row.step
    assert sorted(x["step"] for x in read_bench(run_dir)) == sorted(r.step for r in rows)
    assert (run_dir / "plots" / "bench.png").is_file()
