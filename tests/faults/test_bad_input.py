"""Bad configs and bad data through the real CLI: every error in one run, exit code 2, nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from tests.helpers import GOOD_ROWS, write_config
from trine.cli import app


def _config(project: Path, **changes) -> dict:
    data = {
        "run_dir": str(project / "run"),
        "num_threads": 1,
        "model": {"path": "model"},
        "tasks": {"train": {"path": "good.jsonl", "repeat": 2}, "batch_size": 2, "total_steps": 1},
        "monitor": {"sinks": ["jsonl"], "plot": False},
    }
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            data.setdefault(section, {})[field] = value
        else:
            data[key] = value
    return data


def _run(project: Path, data: dict) -> tuple[int, str]:
    """``trine run`` on ``data`` in-process (typer's runner); returns (exit code, stderr)."""
    path = write_config(project / "config.yaml", data)
    result = CliRunner().invoke(app, ["run", str(path)])
    assert "Traceback" not in result.output
    return result.exit_code, result.stderr


def test_eight_numeric_mistakes_in_one_subprocess_run(project):
    data = _config(project, explorer__timeout=-5)
    data["tasks"].update(batch_size=-4)
    data["tasks"]["train"].update(repeat=0, sampling={"max_tokens": -1, "temperature": -2})
    data["trainer"] = {"lr": -1, "micro_batch_tokens": 0}
    data["eval"] = {"k": -3}
    path = write_config(project / "config.yaml", data)
    result = subprocess.run(
        [sys.executable, "-m", "trine.cli", "run", str(path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "8 error(s) in the config" in result.stderr
    for key, value in [
        ("tasks.batch_size", -4),
        ("tasks.train.repeat", 0),
        ("tasks.train.sampling.max_tokens", -1),
        ("tasks.train.sampling.temperature", -2),
        ("explorer.timeout", -5),
        ("trainer.lr", -1),
        ("trainer.micro_batch_tokens", 0),
        ("eval.k", -3),
    ]:
        assert f"{key}: {value} is out of range; expected" in result.stderr
    assert not (project / "run").exists()


def test_bad_data_and_a_truncated_model_in_one_run(project):
    (project / "bad_line.jsonl").write_text(GOOD_ROWS + '{"question": "3+3", "answer": \n')
    (project / "empty.jsonl").write_text("")
    (project / "no_answer.jsonl").write_text('{"question": "1+1", "result": "2"}\n')
    weights = project / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    data = _config(project)
    data["tasks"]["train"]["path"] = "bad_line.jsonl"
    data["tasks"]["eval"] = [
        {"name": "empty", "path": "empty.jsonl"},
        {"name": "x", "path": "no_answer.jsonl"},
    ]
    code, err = _run(project, data)
    assert code == 2
    assert "4 error(s) in the run's data and model files (nothing was written)" in err
    assert "bad_line.jsonl line 3: not valid JSON" in err
    assert "empty.jsonl' is empty" in err
    assert "key 'answer' (answer_key) is missing; the row has keys ['question', 'result']" in err
    assert f"{weights}: its header lists tensors up to byte" in err
    assert not (project / "run").exists()


def test_bogus_reward_args_and_an_unknown_reward_in_one_run(project):
    data = _config(project)
    data["stages"] = [
        {"stage": "a", "tasks": {"train": {"reward_args": {"bogus": 1}}}},
        {"stage": "b", "tasks": {"train": {"reward": "my_reward"}}},
    ]
    code, err = _run(project, data)
    assert code == 2 and "2 error(s) in the config" in err
    assert "stages.0.tasks: train.reward_args['bogus'] is not an argument of reward 'exact_match'" in err
    assert "stages.1.tasks.train.reward: unknown reward 'my_reward'" in err and "--plugin" in err
    assert not (project / "run").exists()


def test_a_shadowed_override_is_refused_before_the_run(project):
    data = _config(project)
    data["stages"] = [{"stage": "a", "trainer": {"lr": 0.01}}]
    path = write_config(project / "config.yaml", data)
    result = CliRunner().invoke(app, ["run", str(path), "trainer.lr=3e-4"])
    assert result.exit_code == 2 and "stages.0.trainer.lr=3e-4" in result.stderr
    assert not (project / "run").exists()
