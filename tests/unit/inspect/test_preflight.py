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


def test_a_model_without_tokenizer_json_is_refused_before_anything_is_written(project):
    """Issue 25 item 8: without tokenizer.json, transformers builds a 3-token tokenizer from
    tokenizer_config.json that encodes every prompt as nothing, and the run trained on empty prompts."""
    from trine.loop import run

    (project / "model" / "tokenizer.json").unlink()
    assert (project / "model" / "tokenizer_config.json").is_file()  # what lets it load at all
    stages = _stages({**_config(), "run_dir": str(project / "run")}, project)
    with pytest.raises(PreflightError) as info:
        run(stages)
    (error,) = info.value.errors
    model = str(project / "model")
    assert error.startswith(f"model.path: the tokenizer in {model} has no vocabulary")
    assert "it has tokenizer_config.json but no tokenizer.json" in error
    assert "encodes every prompt as nothing" in error
    assert "trine init-model" in error and "model.tokenizer_path" in error
    assert not (project / "run").exists()


def _edit_tokenizer(project: Path, change) -> None:
    import json

    path = project / "model" / "tokenizer.json"
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_a_tokenizer_json_that_loses_the_prompt_is_refused(project):
    _edit_tokenizer(project, lambda data: data.update(decoder=None))  # byte-level tokens decode as "Ġis"
    (project / "words.jsonl").write_text('{"question": "What is 1+1?", "answer": "2"}\n')
    with pytest.raises(PreflightError) as info:
        check(_stages(_config("words.jsonl"), project))
    (error,) = info.value.errors
    assert "cannot round-trip the first prompt of tasks.train (task 'train/0'), 'What is 1+1?'" in error
    assert "12 characters encode as" in error and "Ġis" in error
    assert "broken or belongs to another model" in error


def test_a_tokenizer_json_with_a_tiny_vocabulary_is_refused(project):
    def tiny(data):
        data["model"].update(vocab={"1": 0, "+": 1, "?": 2}, merges=[])
        data["added_tokens"] = []

    _edit_tokenizer(project, tiny)
    with pytest.raises(PreflightError) as info:
        check(_stages(_config(), project))
    (error,) = info.value.errors
    assert "its vocabulary has only 3 tokens" in error


def test_a_model_with_remote_tokenizer_code_is_not_judged_by_its_file_names(project):
    (project / "model" / "tokenizer.json").unlink()
    data = {**_config(), "model": {"path": "model", "trust_remote_code": True}}
    check(_stages(data, project))


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("not a url://x", "is not a database URL"),
        ("postgresql+psycopg://u@h:port/db", "is not a database URL"),
        ("foodb://host/db", "SQLAlchemy knows no database 'foodb'"),
        ("mysql+pymysql://u:secret@localhost/db", "the 'pymysql' driver of mysql is not installed"),
        ("sqlite:///:memory:", "is an in-memory SQLite database"),
        (
            "sqlite:///runs/a\x00b.db",
            "holds a NUL character",
        ),  # crashed preflight (ValueError): a 500 in the studio
        ("postgresql+psycopg://u:secret@127.0.0.1:1/db", "cannot connect (OperationalError"),
    ],
)
def test_a_bad_buffer_url_is_found_before_training(project, url, expected):
    """Issue 25 item 12: a bad buffer.url was found only once a stage had trained and put its first batch."""
    pytest.importorskip("psycopg")
    data = {**_config(), "buffer": {"storage": "sql", "url": url}}
    with pytest.raises(PreflightError) as info:
        check(_stages(data, project))
    (error,) = info.value.errors
    assert error.startswith("buffer.url: ") and expected in error, error
    assert "secret" not in error


def test_a_sqlite_buffer_whose_directory_cannot_be_made_is_refused(project):
    (project / "a_file").write_text("")
    data = {**_config(), "buffer": {"storage": "sql", "url": f"sqlite:///{project}/a_file/sub/buffer.db"}}
    with pytest.raises(PreflightError) as info:
        check(_stages(data, project))
    (error,) = info.value.errors
    assert "cannot be created" in error and "a_file is a file" in error
    good = {**_config(), "buffer": {"storage": "sql", "url": f"sqlite:///{project}/new/dir/buffer.db"}}
    check(_stages(good, project))
    assert not (project / "new").exists()  # checked, not created
