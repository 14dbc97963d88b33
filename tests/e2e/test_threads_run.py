"""``num_threads: auto`` in real ``trine run`` commands: the line that says what was chosen, the count in
``status.json`` and in the checkpoint, the note when a resume uses another count, and the free cores shared
among the processes of ``launch: processes``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from trine.threads import SHARE_ENV

pytestmark = pytest.mark.slow

AUTO = re.compile(r"threads: (\d+) \(\d+ cores?, load \d+\.\d(, shared by (\d+) processes of this run)?; "
                  r"set num_threads=N to override\)")  # fmt: skip  (no $: processes print into one pipe)


def _trine(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in (SHARE_ENV, "LOCAL_WORLD_SIZE")}
    proc = subprocess.run(
        [sys.executable, "-m", "trine.cli", *args], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def test_auto_says_its_choice_records_it_and_a_resume_with_another_count_says_so(arithmetic_config):
    config = arithmetic_config(
        {"num_threads": "auto", "tasks": {"batch_size": 2, "total_steps": 2, "train": {"repeat": 2}}}
    )
    run_dir = config.with_suffix("")
    first = _trine("run", str(config), "stop_after_steps=1")
    found = AUTO.findall(first.stdout)
    assert len(found) == 1 and found[0][1] == "", first.stdout  # one process: nothing shared
    count = int(found[0][0])
    assert json.loads((run_dir / "status.json").read_text())["threads"] == count
    state = torch.load(run_dir / "checkpoints" / "step_1" / "loop_state.pt", weights_only=False)
    assert state["threads"] == count

    other = count + 1
    second = _trine("run", str(config), f"num_threads={other}")
    assert f"threads: {other} (num_threads: {other};" in second.stdout
    assert (
        f"threads: step_1 was written with {count} threads, this run uses {other}: CPU results can differ "
        f"from an uninterrupted run; set num_threads={count} to match"
    ) in second.stdout
    assert json.loads((run_dir / "status.json").read_text())["threads"] == other


def test_launch_processes_shares_the_free_cores_among_the_trainer_and_the_explorers(arithmetic_config):
    config = arithmetic_config(
        {
            "num_threads": "auto",
            "mode": "async",
            "launch": "processes",
            "tasks": {"batch_size": 2, "total_steps": 2, "train": {"repeat": 2}},
            "buffer": {"storage": "sql"},
            "explorer": {"instances": 1},
            "sync": {"wait_timeout": 120},
        }
    )
    proc = _trine("run", str(config))
    found = AUTO.findall(proc.stdout)
    assert [shared for _, _, shared in found] == ["2", "2"], proc.stdout  # the trainer and one explorer
    explorer = json.loads((config.with_suffix("") / "explorers" / "0" / "status.json").read_text())
    assert explorer["threads"] in {int(n) for n, _, _ in found}


def test_ray_actors_on_one_node_share_its_free_cores(arithmetic_config):
    pytest.importorskip("ray", reason="needs ray (the `ray` extra)")
    config = arithmetic_config(
        {
            "num_threads": "auto",
            "mode": "async",
            "cluster": {"backend": "ray", "num_cpus": 2},
            "buffer": {"storage": "sql"},
            "sync": {"wait_timeout": 180},
            "tasks": {"batch_size": 2, "total_steps": 2, "train": {"repeat": 2}},
        }
    )
    out = _trine("run", str(config)).stdout
    found = AUTO.findall(out)
    assert [shared for _, _, shared in found] == ["2", "2"], out  # "(TrainerActor pid=...) threads: ..."
