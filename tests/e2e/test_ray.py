"""The same config on Ray (``cluster.backend: ray``): a two-node cluster on this machine (a head with the
trainer and the buffer writer, a second node whose custom resource ``explorer_node`` draws both explorer
actors), weights by gloo broadcast, and no run directory for the explorers (``cluster.explorer_dir``). The
run learns; the second node's explorer killed with SIGKILL mid-run is started again and the run finishes
with no task lost or explored twice; a resource request no node can grant is refused before anything
starts."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers import EXAMPLE, read_metrics, trine_process

pytest.importorskip("ray", reason="the Ray tests need ray (the `ray` extra)")

pytestmark = pytest.mark.slow

KEY = "eval/addition/avg@8"
STEPS = 40
LIFT = 0.08
"""avg@8 lift over 40 async steps from the SFT start, with an explorer killed at step 10. The other async
layouts lift 0.19-0.25 in 50 steps (test_delayed_rewards.py); measured here: see the test's message."""


def _kill_explorer_mid_run(run_dir: Path, homes: Path, proc: subprocess.Popen, limit: float = 240) -> int:
    """SIGKILL explorer 0's actor process (its status file is in ``homes``, on its node) once the trainer is
    past step 10; returns the trainer's step."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        steps = [r["step"] for r in _rows(run_dir / "metrics.jsonl") if "trainer/loss" in r]
        status = homes / "0" / "status.json"
        if steps and steps[-1] >= 10 and status.is_file():
            os.kill(json.loads(status.read_text())["pid"], signal.SIGKILL)
            return steps[-1]
        time.sleep(0.05)
    raise AssertionError(f"the trainer did not reach step 10 within {limit}s")


def _rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def two_nodes(monkeypatch):
    """A Ray cluster of two nodes on this machine: the head (1 CPU) and a node with 1 CPU and the custom
    resource ``explorer_node``; yields (address, head node id, second node id)."""
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    monkeypatch.setenv("RAY_worker_niceness", "0")  # as `trine run` starts its own cluster: see launch._init
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    second = cluster.add_node(num_cpus=1, resources={"explorer_node": 2})
    try:
        yield cluster.address, cluster.head_node.node_id, second.node_id
    finally:
        cluster.shutdown()


def test_ray_on_two_nodes_learns_without_the_run_dir_and_survives_a_killed_explorer(
    sft_start, arithmetic_config, tmp_path, two_nodes
):
    address, head, second = two_nodes
    eval_set = {
        "name": "addition",
        "path": str(EXAMPLE / "data" / "eval.jsonl"),
        "sampling": {"temperature": 1.0, "max_tokens": 6},
    }
    homes = tmp_path / "node2"
    cfg = arithmetic_config(
        {
            "mode": "async",
            "num_threads": 1,
            "cluster": {
                "backend": "ray",
                "address": address,
                "explorer_resources": {"explorer_node": 1},
                "explorer_dir": str(homes),
            },
            "explorer": {"instances": 2},
            "buffer": {"storage": "sql", "max_staleness": 1},
            "sync": {"wait_timeout": 180},
            "model": {"path": str(sft_start)},
            "tasks": {
                "batch_size": 16,
                "total_steps": STEPS,
                "eval": [eval_set],
                "train": {"repeat": 8, "sampling": {"max_tokens": 6}},
            },
            "trainer": {"lr": 1e-3, "save_every": 10},
            "eval": {"every": 20, "k": 8, "at_start": True},
        },
        name="ray",
    )
    run_dir = tmp_path / "ray"
    proc = trine_process("run", str(cfg))
    killed_at = _kill_explorer_mid_run(run_dir, homes / "ray" / "explorers", proc)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert "resource plan (Ray):" in out and "explorer 0 died" in out, out
    assert killed_at < STEPS
    plan = out[out.index("resource plan (Ray):") :]
    assert re.search(rf"\n\s+trainer\s.*\({head[:8]}\)", plan), out  # on the head
    assert re.search(rf"\n\s+explorer\s.*\({second[:8]}\)", plan), out  # both on the second node
    assert not (run_dir / "explorers").exists()  # the explorers kept their files on their node
    assert all((homes / "ray" / "explorers" / str(i) / "metrics.jsonl").is_file() for i in (0, 1))

    rows = read_metrics(run_dir)
    steps = [r["step"] for r in rows if "trainer/loss" in r]
    assert steps == list(range(1, STEPS + 1))
    evals = [r[KEY] for r in rows if KEY in r]
    assert max(evals[1:]) - evals[0] >= LIFT, f"avg@8 {evals}: the Ray run should learn"
    assert all(r["sync/seconds"] >= 0 for r in rows if "trainer/loss" in r)

    db = sqlite3.connect(run_dir / "buffer.db")
    batches = db.execute("SELECT producer, producer_batch, size FROM experiences_batches").fetchall()
    for producer in ("explorer-0", "explorer-1"):
        mine = sorted(b for p, b, _ in batches if p == producer)
        assert mine and mine == list(range(len(mine))), producer  # none lost, none put twice
    samples = Counter(db.execute("SELECT task_id, run_id FROM experiences").fetchall())
    assert max(samples.values()) == 1  # no task sample produced twice, by either explorer
    kept = db.execute(
        "SELECT task_seq, COUNT(*) FROM experiences WHERE reward_status != 'dropped' GROUP BY task_seq"
    ).fetchall()
    assert all(n == 8 for _, n in kept), kept  # each task's rows stored once (repeat 8)
    consumed = db.execute("SELECT COUNT(*) FROM experiences WHERE consumed_at IS NOT NULL").fetchone()[0]
    assert consumed == STEPS * 16 * 8  # every step trained one batch, none twice


def test_two_trainer_rank_actors_split_each_step(arithmetic_config, tmp_path):
    """``cluster.trainer_ranks: 2``: two trainer actors over FSDP2 shards (gloo on CPU), rank 0 taking each
    batch from the buffer for both and broadcasting the weights to the explorer actor."""
    cfg = arithmetic_config(
        {
            "mode": "async",
            "num_threads": 1,
            "cluster": {"backend": "ray", "num_cpus": 2, "trainer_ranks": 2, "trainer_cpus": 0.4},
            "buffer": {"storage": "sql", "max_staleness": 2},
            "sync": {"wait_timeout": 180},
            "tasks": {"batch_size": 2, "total_steps": 4, "train": {"repeat": 4}},
            "trainer": {"fsdp": True},
        },
        name="ranks",
    )
    proc = trine_process("run", str(cfg))
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out
    assert re.search(r"trainer\s+2\s+0\.4\s", out), out  # the printed resource plan: two trainer actors
    run_dir = tmp_path / "ranks"
    assert [r["step"] for r in read_metrics(run_dir) if "trainer/loss" in r] == [1, 2, 3, 4]
    assert [r["step"] for r in read_metrics(run_dir / "ranks" / "1") if "trainer/loss" in r] == [1, 2, 3, 4]
    db = sqlite3.connect(run_dir / "buffer.db")
    consumed = db.execute("SELECT COUNT(*) FROM experiences WHERE consumed_at IS NOT NULL").fetchone()[0]
    assert consumed == 4 * 2 * 4  # every step trained one batch, once


def test_a_resource_request_no_node_can_grant_is_refused_before_anything_starts(arithmetic_config, tmp_path):
    cfg = arithmetic_config(
        {
            "mode": "async",
            "cluster": {"backend": "ray", "num_cpus": 2, "explorer_cpus": 1.5, "trainer_gpus": 1},
            "explorer": {"instances": 2},
            "buffer": {"storage": "sql"},
        },
        name="toobig",
    )
    proc = trine_process("run", str(cfg))
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 2, out
    assert "asks for 3.6 CPUs" in out and "has 2" in out, out  # 0.5 + 0.1 + 2 × 1.5
    assert "asks for 1 GPUs" in out and "has 0" in out, out
    assert "explorer_cpus" in out, out  # the fix names the setting
    assert not (tmp_path / "toobig" / "metrics.jsonl").exists()


def test_a_ray_run_shows_rewards_and_ends_with_the_summary_like_the_other_modes(arithmetic_config, tmp_path):
    """The trainer actor's step lines show the reward of the batch it trained on (its explorers are other
    actors), each explorer actor prints a line per batch, and the driver ends with the summary table and
    the run directory, as ``trine run`` does in the other modes."""
    cfg = arithmetic_config(
        {
            "mode": "async",
            "num_threads": 1,
            "cluster": {"backend": "ray", "num_cpus": 2},
            "buffer": {"storage": "sql", "max_staleness": 1},
            "sync": {"wait_timeout": 180},
            "tasks": {"batch_size": 2, "total_steps": 3, "train": {"repeat": 2}},
            "monitor": {"sinks": ["console", "jsonl"], "plot": False},
        },
        name="story",
    )
    proc = trine_process("run", str(cfg))
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out
    # Ray forwards actors' output on its own schedule and may lose an actor's last line at shutdown (seen
    # once in CI: step 3's line missing, the table's step count 3): every step line that arrived shows a
    # reward, and none arrives after the table.
    steps = re.findall(r"\[main\] step \d/3 \|[^\n]*", out)
    assert len(steps) >= 2 and all(" | reward " in line for line in steps), out
    assert "explorer-0 batch 1 | weights v0 | reward " in out, out
    table = out[out.index("Trine run summary") :]
    assert "[main] step" not in table, out  # the table ends the run
    assert re.search(r"steps\s*│\s*0\s*│\s*3\s*│", table), out
    assert "reward (mean of 1 step)" in table and "steps" in table, out
    assert f"run directory: {tmp_path / 'story'}" in table, out
