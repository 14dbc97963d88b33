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

AUTO = re.compile(
    r"threads: (\d+) \(\d+ cores?, load \d+\.\d(, shared by (\d+) processes of this run)?; "
    r"set num_threads=N to override\)"
)  # fmt: skip  (no $: processes print into one pipe)


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


def test_launch_processes_gives_the_trainer_and_the_explorers_cores_of_their_own(arithmetic_config):
    """Each role is pinned to its own cores (:func:`trine.threads.role_cores`: on 2 cores the trainer on
    core 0, the explorers on core 1) and takes its threads from them; each process records them."""
    import os

    from trine.threads import cores_text, role_cores

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
    roles = {k: cores_text(v) for k, v in role_cores(sorted(os.sched_getaffinity(0)), 1).items()}
    proc = _trine("run", str(config))
    pinned = re.findall(r"threads: (\d+) \([^)]*\) \[pinned to cores ([\d,-]+)\]", proc.stdout)
    assert sorted(c for _, c in pinned) == sorted([roles["trainer"], roles["explorer"]]), proc.stdout
    run_dir = config.with_suffix("")
    explorer = json.loads((run_dir / "explorers" / "0" / "status.json").read_text())
    trainer = json.loads((run_dir / "status.json").read_text())
    assert explorer["cores"] == roles["explorer"] and trainer["cores"] == roles["trainer"]
    assert {explorer["threads"], trainer["threads"]} <= {int(n) for n, _ in pinned}


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
