"""How the learning-results jobs make their runs (``Job.runner`` in ``scripts/learning_results.py``).

A runner makes one run of its job for one seed, in the environment it is given (the kernels), in
``run_dir``, building the seed's model at ``model`` where the job builds one (shared by the seed's runs),
and returns its lines as ``metrics.jsonl`` holds them: dicts with ``step``, ``stage`` and metrics."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SFT_STEPS = 200  # the serve agent's start: the main job's first steps (examples/serve_agent/config.yaml)


def trine_run(job, seed: int, env: dict, run_dir: Path, model: Path) -> list[dict]:
    """``trine run`` of the job's config, as its doc's command runs it, plus the seed, the run directory,
    the model's path where the job builds its model, and the job's plugins and overrides."""
    args = [
        sys.executable,
        "-m",
        "trine.cli",
        "run",
        str(ROOT / job.config),
        f"seed={seed}",
        f"run_dir={run_dir}",
    ]
    if job.build_model:
        args.append(f"model.path={model}")
    for plugin in job.plugins:
        args += ["--plugin", str(ROOT / plugin)]
    _check(args + list(job.overrides), env)
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]


def serve_agent(job, seed: int, env: dict, run_dir: Path, model: Path) -> list[dict]:
    """The serve agent as its config's header runs it: an SFT start (``trine run
    examples/arithmetic/config.yaml stop_after_steps=200``, its model built from the seed), then ``trine
    serve`` and ``trine train`` of the job's config and ``examples/serve_agent/agent.py`` against the
    server, two rounds more than the trainer's steps so that no step waits for a round that never comes
    (as ``tests/e2e/test_serve_training.py``). One line per agent round: ``agent/reward`` (the mean grade
    of its 16 questions × 8 answers) and ``agent/policy_version`` (the newest weights that answered)."""
    run_dir.mkdir(parents=True)
    sft = run_dir / "sft"
    _check(
        [sys.executable, "-m", "trine.cli", "run", "examples/arithmetic/config.yaml", f"stop_after_steps={SFT_STEPS}",
         f"seed={seed}", f"run_dir={sft}", f"model.path={model}", "monitor.plot=false"],
        env,
    )  # fmt: skip
    source = ROOT / job.config
    config = yaml.safe_load(source.read_text())
    config.update(
        seed=seed,
        run_dir=str(run_dir / "serve"),
        model={"path": str(sft / "checkpoints" / f"step_{SFT_STEPS}")},
    )
    config["serve"]["port"] = 0  # a free port
    config["monitor"] = {"sinks": ["jsonl"], "plot": False}
    path = run_dir / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    rounds = config["tasks"]["total_steps"] + 2
    log = run_dir / "serve.log"
    with log.open("w") as serve_out, (run_dir / "train.log").open("w") as train_out:
        server = _trine(["serve", str(path)], env, serve_out)
        trainer = None
        try:
            url = _listening(server, log)
            trainer = _trine(["train", str(path)], env, train_out)
            agent = _check(
                [sys.executable, "examples/serve_agent/agent.py", "--base-url", url, "--rounds", str(rounds),
                 "--seed", str(seed)],
                env,
            )  # fmt: skip
            if trainer.wait(timeout=600) != 0:
                raise RuntimeError(
                    f"trine train failed ({trainer.returncode}):\n{_tail(run_dir / 'train.log')}"
                )
        finally:
            for proc in (server, trainer):
                if proc is not None and proc.poll() is None:
                    proc.terminate()
                    proc.wait(timeout=60)
    lines = [json.loads(x) for x in agent.splitlines() if x.startswith("{")]
    return [
        {
            "step": x["round"],
            "stage": "serve",
            "agent/reward": x["reward"],
            "agent/policy_version": max(x["versions"]),
        }
        for x in lines
    ]


def _trine(args: list[str], env: dict, out) -> subprocess.Popen:
    command = [sys.executable, "-m", "trine.cli", *args]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)


def _check(args: list[str], env: dict) -> str:
    """Run ``args`` to its end; its stdout, or an error with the tail of what it printed."""
    done = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return done.stdout


def _listening(server: subprocess.Popen, log: Path, limit: float = 300.0) -> str:
    """The URL ``trine serve`` says it listens on (it prints it once its model is loaded)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if found := re.search(r"listening on (http://\S+)", log.read_text()):
            return found.group(1)
        if server.poll() is not None:
            raise RuntimeError(f"trine serve exited {server.returncode}:\n{_tail(log)}")
        time.sleep(0.5)
    raise RuntimeError(f"trine serve did not say where it listens within {limit:.0f} s:\n{_tail(log)}")


def _tail(path: Path) -> str:
    return path.read_text()[-3000:]
