"""Preflight: tasksets and model files are checked before anything is written, every problem at once."""

from __future__ import annotations

from pathlib import Path

import pytest

from trine.config import validate_dict
from trine.inspect.preflight import PreflightError, check


def _stages(data: dict, base: Path) -> list:
    stages, errors = validate_dict(data, base_dir=base)
    assert errors == []
    return stages


def _config(train: str = "good.jsonl", **tasks) -> dict:
    return {
        "model": {"path": "model"},
        "run_dir": "run",
        "tasks": {"train": {"path": train}, "total_steps": 1, **tasks},
    }


def test_good_files_pass(project):
    check(_stages(_config(), project))


def test_every_data_and_model_problem_is_reported_at_once(project):
    (project / "bad_line.jsonl").write_text('{"question": "1+1", "answer": "2"}\n{"question": "2+2", \n')
    (project / "empty.jsonl").write_text("")
    (project / "no_answer.jsonl").write_text('{"question": "1+1", "solution": "2"}\n')
    weights = project / "model" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # a truncated download
    (project / "model" / "config.json").unlink()
    data = _config("bad_line.jsonl", eval=[{"name": "e", "path": "empty.jsonl"}, {"path": "no_answer.jsonl"}])
    with pytest.raises(PreflightError) as info:
        check(_stages(data, project))
    errors = info.value.errors
    assert len(errors) == 5, errors
    bad_line, empty, no_answer, config, truncated = errors
    assert (
        bad_line.startswith("tasks.train")
        and "bad_line.jsonl line 2" in bad_line
        and "not valid JSON" in bad_line
    )
    assert empty.startswith("tasks.eval.0") and "empty" in empty and "no rows" in empty
    assert no_answer.startswith("tasks.eval.1") and "'answer' (answer_key) is missing" in no_answer
    assert "['question', 'solution']" in no_answer
    assert config.startswith("model.path") and "config.json is missing" in config
    assert truncated.startswith("model.path") and str(weights) in truncated and "truncated" in truncated
    assert "nothing was written" in str(info.value)


def test_missing_tokenizer_and_weights_are_named(project):
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "model.safetensors"):
        (project / "model" / name).unlink(missing_ok=True)
    with pytest.raises(PreflightError) as info:
        check(_stages(_config(), project))
    text = str(info.value)
    assert "has no tokenizer files" in text and "model.tokenizer_path" in text
    assert "has no weights" in text


def test_a_model_built_from_a_preset_later_is_not_checked(project):
    data = {**_config(), "model": {"path": "not_built_yet", "init_preset": "tiny-0.5m"}}
    check(_stages(data, project))
    assert not (project / "not_built_yet").exists()


def test_a_supervised_stage_needs_its_target_field_in_every_row(project):
    data = {**_config(), "mode": "train", "algorithm": {"name": "sft"}}
    data["tasks"]["train"]["response_key"] = "solution"
    with pytest.raises(PreflightError) as info:
        check(_stages(data, project))
    (error,) = info.value.errors
    assert error.startswith("tasks.train.response_key") and "2 of 2 rows have no field 'solution'" in error


def test_a_shared_bad_taskset_is_reported_once_with_the_first_stage(project):
    (project / "empty.jsonl").write_text("")
    data = {**_config("empty.jsonl"), "stages": [{"stage": "a"}, {"stage": "b"}]}
    with pytest.raises(PreflightError) as info:
        check(_stages(data, project))
    (error,) = info.value.errors
    assert error.startswith("stages.0.tasks.train")


def test_run_checks_before_writing_the_run_directory(project):
    from trine.loop import run

    (project / "empty.jsonl").write_text("")
    stages = _stages({**_config("empty.jsonl"), "run_dir": str(project / "run")}, project)
    with pytest.raises(PreflightError, match="is empty"):
        run(stages)
    assert not (project / "run").exists()
