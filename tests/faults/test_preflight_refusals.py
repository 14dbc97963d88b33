"""Runs that used to start and train on something broken are refused by ``trine validate`` and ``trine run``
before anything is written (issue 25 items 8 and 12): a model directory without ``tokenizer.json`` (it
loaded as a 3-token tokenizer and the run trained on empty prompts, exit 0), and a bad ``buffer.url`` in
a later stage (found only once the stage before had trained)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import GOOD_ROWS, write_config
from trine.cli import app

pytestmark = pytest.mark.slow


def _config(tmp_path: Path, model: Path, **changes) -> Path:
    (tmp_path / "good.jsonl").write_text(GOOD_ROWS)
    data = {
        "run_dir": str(tmp_path / "run"),
        "num_threads": 1,
        "model": {"path": str(model)},
        "tasks": {"train": {"path": "good.jsonl", "repeat": 2}, "batch_size": 2, "total_steps": 1},
        "monitor": {"sinks": ["jsonl"], "plot": False},
        **changes,
    }
    return write_config(tmp_path / "config.yaml", data)


def _refused(config: Path) -> list[str]:
    """``trine validate`` and ``trine run`` on ``config`` both exit 2; the lines of run's error."""
    outputs = []
    for command in ("validate", "run"):
        result = CliRunner().invoke(app, [command, str(config)])
        assert result.exit_code == 2, (command, result.output)
        assert "Traceback" not in result.output
        outputs.append(result.stderr)
    assert outputs[0] == outputs[1]  # the same checks, the same words
    return outputs[1].splitlines()


def test_a_model_directory_without_tokenizer_json_is_refused(tmp_path, tiny_model_dir):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model, ignore=shutil.ignore_patterns("tokenizer.json"))
    assert (model / "tokenizer_config.json").is_file() and not (model / "tokenizer.json").exists()
    lines = _refused(_config(tmp_path, model))
    assert "1 error(s) in the run's data and model files (nothing was written)" in lines[0]
    (line,) = [x for x in lines if x.lstrip().startswith("- ")]
    assert f"model.path: the tokenizer in {model} has no vocabulary" in line
    assert "but no tokenizer.json" in line and "trine init-model" in line
    assert not (tmp_path / "run").exists()


def test_a_bad_buffer_url_in_a_later_stage_is_refused_before_the_first_stage_trains(tmp_path, tiny_model_dir):
    (tmp_path / "a_file").write_text("")
    later = {"storage": "sql", "url": f"sqlite:///{tmp_path}/a_file/buffer.db"}
    stages = [{"stage": "first"}, {"stage": "second", "buffer": later}]
    lines = _refused(_config(tmp_path, tiny_model_dir, stages=stages))
    (line,) = [x for x in lines if x.lstrip().startswith("- ")]
    assert line.lstrip("- ").startswith("stages.1.buffer.url: ")
    assert "cannot be created" in line and "a_file is a file" in line
    assert not (tmp_path / "run").exists()
