"""Typed config: every error at once with key paths, dotted overrides, stages, relative paths, CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trine.config import ConfigError, RunConfig, apply_overrides, load_config, merge, validate_dict


def _write(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A directory holding a taskset file and an (empty) model directory."""
    (tmp_path / "data.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    (tmp_path / "model").mkdir()
    return tmp_path


def _good(project: Path) -> dict:
    return {
        "model": {"path": "model"},
        "tasks": {"train": {"path": "data.jsonl"}, "total_steps": 3},
        "trainer": {"lr": 0.01},
    }


def _broken(project: Path) -> Path:
    data = {
        "model": {"path": "model"},
        "tasks": {
            "batch_size": "many",
            "total_steps": 2,
            "train": {"path": "missing.jsonl", "reward": "exact_matchh"},
        },
        "trainer": {"lrr": 0.1},
    }
    return _write(project / "broken.yaml", data)


def _error_for(errors: list[str], key: str) -> str:
    found = [e for e in errors if e.startswith(f"{key}:")]
    assert len(found) == 1, f"expected one error for {key!r} in {errors}"
    return found[0]


def test_every_mistake_is_reported_at_once_with_its_key_path(project):
    with pytest.raises(ConfigError) as info:
        load_config(_broken(project))
    errors = info.value.errors
    assert len(errors) == 4
    assert "did you mean 'lr'?" in _error_for(errors, "trainer.lrr")
    batch = _error_for(errors, "tasks.batch_size")
    assert "integer" in batch and "'many'" in batch
    missing = _error_for(errors, "tasks.train.path")
    assert str(project / "missing.jsonl") in missing and "does not exist" in missing
    reward = _error_for(errors, "tasks.train.reward")
    assert "'exact_matchh'" in reward and "Did you mean 'exact_match'?" in reward
    for name in ("exact_match", "numeric_match", "math", "format"):
        assert name in reward
    # the exception text lists every error too
    assert "4 error(s)" in str(info.value) and all(e in str(info.value) for e in errors)


def test_a_good_config_loads_with_defaults_from_the_sections(project):
    (stage,) = load_config(_write(project / "ok.yaml", _good(project)))
    assert isinstance(stage, RunConfig)
    assert stage.trainer.lr == 0.01
    assert stage.trainer.grad_clip == 1.0  # default from TrainerConfig
    assert stage.tasks.train.reward == "exact_match"
    assert stage.stage == "main"


def test_dotted_overrides_are_parsed_as_yaml(project):
    path = _write(project / "ok.yaml", _good(project))
    (stage,) = load_config(path, ["trainer.lr=0.1", "tasks.train.sampling.stop=[a, b]", "run_dir=x"])
    assert stage.trainer.lr == 0.1
    assert stage.tasks.train.sampling.stop == ["a", "b"]
    assert stage.run_dir == "x"


def test_override_into_a_stage_by_list_index_and_input_is_not_mutated():
    data = {"stages": [{"stage": "a"}, {"stage": "b", "trainer": {"lr": 1.0}}]}
    out = apply_overrides(data, ["stages.1.trainer.lr=0.5", "stages.0.tasks.batch_size=4"])
    assert out["stages"][1]["trainer"]["lr"] == 0.5
    assert out["stages"][0]["tasks"]["batch_size"] == 4
    assert data["stages"][1]["trainer"]["lr"] == 1.0 and "tasks" not in data["stages"][0]


def test_override_without_equals_is_an_error():
    with pytest.raises(ConfigError) as info:
        apply_overrides({}, ["trainer.lr"])
    assert "trainer.lr" in info.value.errors[0] and "key.sub=value" in info.value.errors[0]


def test_merge_is_deep_and_replaces_non_dicts():
    base = {"trainer": {"lr": 1.0, "grad_clip": 2.0}, "monitor": {"sinks": ["console", "jsonl"]}}
    out = merge(base, {"trainer": {"lr": 0.5}, "monitor": {"sinks": ["jsonl"]}})
    assert out == {"trainer": {"lr": 0.5, "grad_clip": 2.0}, "monitor": {"sinks": ["jsonl"]}}
    assert base["trainer"]["lr"] == 1.0


def test_stages_inherit_the_top_level_and_override_their_own_fields(project):
    data = _good(project)
    data["trainer"]["grad_clip"] = 0.5
    data["stages"] = [
        {"stage": "sft", "mode": "train", "algorithm": {"name": "sft"}, "trainer": {"lr": 0.001}},
        {"stage": "rl"},
    ]
    sft, rl = load_config(_write(project / "stages.yaml", data), ["stages.1.trainer.lr=0.2"])
    assert (sft.stage, sft.mode, sft.algorithm.name) == ("sft", "train", "sft")
    assert sft.trainer.lr == 0.001 and sft.trainer.grad_clip == 0.5
    assert (rl.stage, rl.mode, rl.algorithm.name) == ("rl", "sync", "grpo")
    assert rl.trainer.lr == 0.2 and rl.trainer.grad_clip == 0.5
    assert sft.tasks.train.path == rl.tasks.train.path == str(project / "data.jsonl")


def test_errors_inside_a_stage_carry_the_stage_prefix(project):
    data = _good(project)
    data["stages"] = [
        {"stage": "a"},
        {"stage": "b", "trainer": {"lrr": 1}, "algorithm": {"name": "grpoo"}},
        {"stage": "a"},
        {"trainer": {"lr": 1}},
    ]
    stages, errors = validate_dict(data, base_dir=project)
    assert [s.stage for s in stages] == ["a", "a"]
    assert "did you mean 'lr'?" in _error_for(errors, "stages.1.trainer.lrr")
    assert "Did you mean 'grpo'?" in _error_for(errors, "stages.1.algorithm.name")
    assert "'stage' name" in _error_for(errors, "stages.3")
    assert any("'a' is used twice" in e for e in errors)


def test_missing_model_path_suggests_init_model(project):
    data = _good(project)
    data["model"] = {"path": "no_such_model"}
    _, errors = validate_dict(data, base_dir=project)
    (error,) = errors
    assert error.startswith("model:")
    assert str(project / "no_such_model") in error and "trine init-model" in error and "init_preset" in error
    data["model"]["init_preset"] = "tiny-0.5m"  # with a preset the directory may be built later
    stages, errors = validate_dict(data, base_dir=project)
    assert errors == [] and stages[0].model.init_preset == "tiny-0.5m"


def test_relative_paths_resolve_against_the_config_directory(project, tmp_path_factory, monkeypatch):
    path = _write(project / "ok.yaml", _good(project))
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    (stage,) = load_config(path)
    assert stage.model.path == str(project / "model")
    assert stage.tasks.train.path == str(project / "data.jsonl")
    # a config given by a relative path still yields absolute paths (the resolved config is reusable)
    monkeypatch.chdir(project.parent)
    (stage,) = load_config(Path(project.name) / "ok.yaml")
    assert stage.model.path == str(project / "model")
    assert stage.tasks.train.path == str(project / "data.jsonl")


def test_unreadable_files_give_one_clear_error(project):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(project / "nope.yaml")
    (project / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_config(project / "list.yaml")


def test_cli_validate_exits_2_and_prints_every_error(project):
    result = subprocess.run(
        [sys.executable, "-m", "trine.cli", "validate", str(_broken(project))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    for key in ("trainer.lrr", "tasks.batch_size", "tasks.train.path", "tasks.train.reward"):
        assert key in result.stderr
    assert "did you mean 'lr'?" in result.stderr


def test_cli_validate_ok(project):
    from typer.testing import CliRunner

    from trine.cli import app

    path = _write(project / "ok.yaml", _good(project))
    result = CliRunner().invoke(app, ["validate", str(path), "trainer.lr=0.5"])
    assert result.exit_code == 0, result.output
    assert "OK (1 stage(s): main)" in result.output


def test_conflicting_settings_get_one_clear_message(project):
    data = {**_good(project), "mode": "train", "sync": {"sync_offset": 1}}
    stages, errors = validate_dict(data, base_dir=project)
    assert stages == [] and len(errors) == 1
    assert "sync settings only apply to mode 'sync'" in errors[0]
    assert "mode 'train' needs a supervised algorithm such as sft" in errors[0]

    data = {**_good(project), "algorithm": {"name": "sft"}}
    _, errors = validate_dict(data, base_dir=project)
    assert len(errors) == 1 and "algorithm 'sft' trains from data, not rollouts; set mode: train" in errors[0]


def test_bad_override_paths_are_config_errors():
    data = {"stages": [{"stage": "a"}, {"stage": "b"}], "trainer": {"lr": 1.0}}
    with pytest.raises(ConfigError, match="stages is a list of 2; use an index 0..1"):
        apply_overrides(data, ["stages.5.trainer.lr=1"])
    with pytest.raises(ConfigError, match="trainer.lr is a value, not a mapping"):
        apply_overrides(data, ["trainer.lr.x=1"])
    with pytest.raises(ConfigError, match="not of the form key.sub=value"):
        apply_overrides(data, ["trainer.lr"])
