"""A real OpenEnv server, offline: examples/openenv/server.py (an environment written for openenv-core,
served by openenv-core's own FastAPI app) runs in its own virtualenv (scripts/side_venv.sh: openenv-core's
pins clash with Trine's), and Trine plays it over the session protocol with ``OpenEnvEnv``: scripted
episodes through the step-wise workflow, then a few steps of a real run (multi_turn to train, step_wise
to evaluate). Skipped, with pip's reason, where openenv-core cannot be installed."""

from __future__ import annotations

import asyncio
import functools
import json
import random
import re
import subprocess
import sys
import time

import pytest

from tests.helpers import ROOT, ScriptedModel, env_task, step_metrics, write_config
from trine.config import load_config
from trine.loop import run

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ENV = "openenv"  # the registered name of trine.workflows.envs.openenv:OpenEnvEnv


@pytest.fixture(scope="module")
def openenv_server(tmp_path_factory):
    """``examples/openenv/server.py`` on a free port, from the ``.venv-openenv`` virtualenv (its output goes to
    a file: a pipe nobody reads would fill up and stall the server)."""
    made = subprocess.run(
        ["bash", str(ROOT / "scripts" / "side_venv.sh"), "openenv", "openenv-core==0.3.0"],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if made.returncode != 0:
        pytest.skip(f"openenv-core could not be installed in its own venv: {made.stderr.strip()[-600:]}")
    python = made.stdout.strip().splitlines()[-1]
    log = tmp_path_factory.mktemp("openenv") / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [python, str(ROOT / "examples" / "openenv" / "server.py"), "--port", "0", "--sessions", "32"],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while (found := re.search(r"listening on (http://\S+)", log.read_text())) is None:
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise AssertionError(f"the OpenEnv server did not start: {log.read_text()}")
        time.sleep(0.1)
    yield found.group(1)
    server.terminate()
    server.wait(timeout=10)
    assert "Traceback" not in log.read_text(), log.read_text()  # sessions ended cleanly


def secret(seed: int) -> int:
    """The number examples/openenv/server.py draws for ``seed`` (1..8)."""
    return random.Random(seed).randint(1, 8)


def bisect(observation: str, memory: dict) -> str:
    lo, hi = memory.get("range", (1, 8))
    if observation == "higher":
        lo = memory["last"] + 1
    elif observation == "lower":
        hi = memory["last"] - 1
    else:
        lo, hi = 1, 8
    memory["range"], memory["last"] = (lo, hi), (lo + hi) // 2
    return str(memory["last"])


def test_scripted_episodes_get_the_servers_rewards(openenv_server):
    from trine.workflows import StepWiseWorkflow

    workflow = StepWiseWorkflow(
        env=ENV, env_args={"base_url": openenv_server, "observation_key": "text"}, max_steps=4, pool_size=2
    )

    async def play():
        runs = []
        for seed in range(4):
            policy = functools.partial(bisect, memory={})  # one game at a time: its own memory
            runs.append(await workflow.run(env_task(f"g/{seed}", 1, seed=seed), ScriptedModel(policy)))
        await workflow.aclose()
        return runs

    for seed, exps in enumerate(asyncio.run(play())):
        assert {e.status for e in exps} == {"ok"}
        assert exps[-1].reward == 1.0 and exps[-1].info["response"] == str(secret(seed))  # binary search wins
        assert all(e.reward == 0.0 for e in exps[:-1])
    assert workflow.envs.reused > 0  # the sessions lived on across episodes


def test_a_run_trains_on_openenv_episodes(openenv_server, tmp_path, tiny_model_dir):
    rows = tmp_path / "games.jsonl"
    rows.write_text("".join(json.dumps({"question": "guess", "seed": s}) + "\n" for s in range(8)))
    env_args = {"base_url": openenv_server, "observation_key": "text"}
    common = {"path": str(rows), "answer_key": None, "repeat": 2, "sampling": {"max_tokens": 3}}
    cfg = {
        "name": "openenv",
        "run_dir": str(tmp_path / "run"),
        "seed": 0,
        "num_threads": 1,
        "model": {"path": str(tiny_model_dir)},
        "tasks": {
            "batch_size": 2,
            "total_steps": 2,
            "train": {
                **common,
                "workflow": "multi_turn",
                "workflow_args": {"env": ENV, "env_args": env_args, "max_steps": 3},
            },
            "eval": [
                {
                    **common,
                    "name": "guess",
                    "limit": 2,
                    "workflow": "step_wise",
                    "workflow_args": {"env": ENV, "env_args": env_args, "max_steps": 3},
                }
            ],
        },
        "trainer": {"lr": 1e-3},
        "eval": {"at_start": True, "every": 2},
        "explorer": {"dump_rollouts": True, "max_skip_ratio": 0.0},
        "monitor": {"sinks": ["jsonl"], "plot": False},
    }
    run(load_config(write_config(tmp_path / "openenv.yaml", cfg)))
    metrics = step_metrics(tmp_path / "run")
    assert len(metrics) == 2 and all(m["explorer/tasks"] == 2 for m in metrics), metrics
    dumped = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    train = [r for r in dumped if r["task_id"].startswith("train/")]
    assert len(train) == 4 and not any(r["skipped"] for r in train)
    assert all(
        len(r["responses"]) == 2 and {x["reward"] for x in r["responses"]} <= {0.0, 1.0} for r in train
    )
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum("eval/guess/accuracy" in m for m in lines) == 2  # at the start and after step 2
    assert sys.modules.get("openenv") is None  # Trine spoke the protocol itself
