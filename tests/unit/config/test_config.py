"""Typed config: every error at once with key paths, dotted overrides, stages, relative paths, CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import write_config
from trine.cli import app
from trine.config import ConfigError, RunConfig, apply_overrides, load_config, load_yaml, merge, validate_dict


@pytest.fixture
def empty_project(tmp_path: Path) -> Path:
    """A directory holding a taskset file and an (empty) model directory (the shared ``project`` fixture
    holds the tiny model and another taskset)."""
    (tmp_path / "data.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    (tmp_path / "model").mkdir()
    return tmp_path


def _good(empty_project: Path) -> dict:
    return {
        "model": {"path": "model"},
        "tasks": {"train": {"path": "data.jsonl"}, "total_steps": 3},
        "trainer": {"lr": 0.01},
    }


def _broken(empty_project: Path) -> Path:
    data = {
        "model": {"path": "model"},
        "tasks": {
            "batch_size": "many",
            "total_steps": 2,
            "train": {"path": "missing.jsonl", "reward": "exact_matchh"},
        },
        "trainer": {"lrr": 0.1},
    }
    return write_config(empty_project / "broken.yaml", data)


def _error_for(errors: list[str], key: str) -> str:
    found = [e for e in errors if e.startswith(f"{key}:")]
    assert len(found) == 1, f"expected one error for {key!r} in {errors}"
    return found[0]


def test_every_mistake_is_reported_at_once_with_its_key_path(empty_project):
    with pytest.raises(ConfigError) as info:
        load_config(_broken(empty_project))
    errors = info.value.errors
    assert len(errors) == 4
    assert "did you mean 'lr'?" in _error_for(errors, "trainer.lrr")
    batch = _error_for(errors, "tasks.batch_size")
    assert "integer" in batch and "'many'" in batch
    missing = _error_for(errors, "tasks.train.path")
    assert str(empty_project / "missing.jsonl") in missing and "does not exist" in missing
    reward = _error_for(errors, "tasks.train.reward")
    assert "'exact_matchh'" in reward and "Did you mean 'exact_match'?" in reward
    for name in ("exact_match", "numeric_match", "math", "format"):
        assert name in reward
    # the exception text lists every error too
    assert "4 error(s)" in str(info.value) and all(e in str(info.value) for e in errors)


def test_a_good_config_loads_with_defaults_from_the_sections(empty_project):
    (stage,) = load_config(write_config(empty_project / "ok.yaml", _good(empty_project)))
    assert isinstance(stage, RunConfig)
    assert stage.trainer.lr == 0.01
    assert stage.trainer.grad_clip == 1.0  # default from TrainerConfig
    assert stage.tasks.train.reward == "exact_match"
    assert stage.stage == "main"


def test_derived_defaults_are_properties_of_the_config(empty_project):
    """The run directory and the async trainer's batch are derived in one place, read everywhere."""
    (stage,) = load_config(write_config(empty_project / "ok.yaml", {**_good(empty_project), "name": "demo"}))
    assert stage.run_path == Path("runs") / "demo"
    assert stage.model_copy(update={"run_dir": str(empty_project / "r")}).run_path == empty_project / "r"
    assert stage.trainer_batch_rows == stage.tasks.batch_size * stage.tasks.train.repeat == 64
    given = stage.model_copy(update={"trainer": stage.trainer.model_copy(update={"batch_size": 5})})
    assert given.trainer_batch_rows == 5


def test_dotted_overrides_are_parsed_as_yaml(empty_project):
    path = write_config(empty_project / "ok.yaml", _good(empty_project))
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


def test_stages_inherit_the_top_level_and_override_their_own_fields(empty_project):
    data = _good(empty_project)
    data["trainer"]["grad_clip"] = 0.5
    data["stages"] = [
        {"stage": "sft", "mode": "train", "algorithm": {"name": "sft"}, "trainer": {"lr": 0.001}},
        {"stage": "rl"},
    ]
    sft, rl = load_config(write_config(empty_project / "stages.yaml", data), ["stages.1.trainer.lr=0.2"])
    assert (sft.stage, sft.mode, sft.algorithm.name) == ("sft", "train", "sft")
    assert sft.trainer.lr == 0.001 and sft.trainer.grad_clip == 0.5
    assert (rl.stage, rl.mode, rl.algorithm.name) == ("rl", "sync", "grpo")
    assert rl.trainer.lr == 0.2 and rl.trainer.grad_clip == 0.5
    assert sft.tasks.train.path == rl.tasks.train.path == str(empty_project / "data.jsonl")


def test_errors_inside_a_stage_carry_the_stage_prefix(empty_project):
    data = _good(empty_project)
    data["stages"] = [
        {"stage": "a"},
        {"stage": "b", "trainer": {"lrr": 1}, "algorithm": {"name": "grpoo"}},
        {"stage": "a"},
        {"trainer": {"lr": 1}},
    ]
    stages, errors = validate_dict(data, base_dir=empty_project)
    assert [s.stage for s in stages] == ["a", "a"]
    assert "did you mean 'lr'?" in _error_for(errors, "stages.1.trainer.lrr")
    assert "Did you mean 'grpo'?" in _error_for(errors, "stages.1.algorithm.name")
    assert "'stage' name" in _error_for(errors, "stages.3")
    assert any("'a' is used twice" in e for e in errors)


def test_missing_model_path_suggests_init_model(empty_project):
    data = _good(empty_project)
    data["model"] = {"path": "no_such_model"}
    _, errors = validate_dict(data, base_dir=empty_project)
    (error,) = errors
    assert error.startswith("model:")
    assert (
        str(empty_project / "no_such_model") in error
        and "trine init-model" in error
        and "init_preset" in error
    )
    data["model"]["init_preset"] = "tiny-0.5m"  # with a preset the directory may be built later
    stages, errors = validate_dict(data, base_dir=empty_project)
    assert errors == [] and stages[0].model.init_preset == "tiny-0.5m"


def test_relative_paths_resolve_against_the_config_directory(empty_project, tmp_path_factory, monkeypatch):
    path = write_config(empty_project / "ok.yaml", _good(empty_project))
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    (stage,) = load_config(path)
    assert stage.model.path == str(empty_project / "model")
    assert stage.tasks.train.path == str(empty_project / "data.jsonl")
    # a config given by a relative path still yields absolute paths (the resolved config is reusable)
    monkeypatch.chdir(empty_project.parent)
    (stage,) = load_config(Path(empty_project.name) / "ok.yaml")
    assert stage.model.path == str(empty_project / "model")
    assert stage.tasks.train.path == str(empty_project / "data.jsonl")


def test_unreadable_files_give_one_clear_error(empty_project):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(empty_project / "nope.yaml")
    (empty_project / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_config(empty_project / "list.yaml")


def test_cli_validate_exits_2_and_prints_every_error(empty_project):
    result = subprocess.run(
        [sys.executable, "-m", "trine.cli", "validate", str(_broken(empty_project))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    for key in ("trainer.lrr", "tasks.batch_size", "tasks.train.path", "tasks.train.reward"):
        assert key in result.stderr
    assert "did you mean 'lr'?" in result.stderr


def test_cli_validate_ok(empty_project, tiny_model_dir):
    from typer.testing import CliRunner

    from trine.cli import app

    path = write_config(
        empty_project / "ok.yaml", {**_good(empty_project), "model": {"path": str(tiny_model_dir)}}
    )
    result = CliRunner().invoke(app, ["validate", str(path), "trainer.lr=0.5"])
    assert result.exit_code == 0, result.output
    assert "OK (1 stage(s): main)" in result.output


def test_conflicting_settings_get_one_clear_message(empty_project):
    data = {**_good(empty_project), "mode": "train", "sync": {"sync_offset": 1}}
    stages, errors = validate_dict(data, base_dir=empty_project)
    assert stages == [] and len(errors) == 1
    assert "sync settings only apply to mode 'sync'" in errors[0]
    assert "mode 'train' needs a supervised algorithm such as sft" in errors[0]

    data = {**_good(empty_project), "algorithm": {"name": "sft"}}
    _, errors = validate_dict(data, base_dir=empty_project)
    assert len(errors) == 1 and "algorithm 'sft' trains from data, not rollouts; set mode: train" in errors[0]


def test_bad_override_paths_are_config_errors():
    data = {"stages": [{"stage": "a"}, {"stage": "b"}], "trainer": {"lr": 1.0}}
    with pytest.raises(ConfigError, match="stages is a list of 2; use an index 0..1"):
        apply_overrides(data, ["stages.5.trainer.lr=1"])
    with pytest.raises(ConfigError, match="trainer.lr is a value, not a mapping"):
        apply_overrides(data, ["trainer.lr.x=1"])
    with pytest.raises(ConfigError, match="not of the form key.sub=value"):
        apply_overrides(data, ["trainer.lr"])


def test_override_values_that_are_not_yaml_are_config_errors_naming_the_key(tmp_path):
    """``trainer.lr=[1,`` used to escape as PyYAML's raw parser error (exit 1); now every bad override is
    named in one ConfigError, which the CLI turns into exit 2 (issue 25 item 12)."""
    with pytest.raises(ConfigError) as err:
        apply_overrides({"trainer": {"lr": 1.0}}, ["trainer.lr=[1,", "tasks.batch_size={", "seed"])
    assert len(err.value.errors) == 3, err.value.errors
    assert err.value.errors[0].startswith("override trainer.lr='[1,': the value is not YAML")
    assert "tasks.batch_size=" in err.value.errors[1] and "not of the form" in err.value.errors[2]

    config = tmp_path / "c.yaml"
    config.write_text("name: x\n")
    result = CliRunner().invoke(app, ["validate", str(config), "trainer.lr=[1,"])
    assert result.exit_code == 2, result.output
    assert "override trainer.lr='[1,': the value is not YAML" in result.output


# -- stages and command-line overrides ---------------------------------------------------------------


def _two_stages(empty_project: Path) -> dict:
    data = _good(empty_project)
    data["stages"] = [
        {"stage": "sft", "mode": "train", "algorithm": {"name": "sft"}, "trainer": {"lr": 0.003}},
        {"stage": "rl", "algorithm": {"name": "grpo"}, "trainer": {"lr": 0.001}},
    ]
    return data


def test_an_override_that_a_stage_shadows_is_an_error_naming_each_stage(empty_project):
    path = write_config(empty_project / "stages.yaml", _two_stages(empty_project))
    with pytest.raises(ConfigError) as info:  # the README's own example used to change nothing
        load_config(path, ["trainer.lr=3e-4", "algorithm.name=nonsense_algo", "trainer.grad_clip=0.5"])
    lr, algo, unknown = info.value.errors
    assert "stages.0.trainer.lr, stages.1.trainer.lr" in lr
    assert "stages.0.trainer.lr=3e-4 stages.1.trainer.lr=3e-4" in lr
    assert "stages.0.algorithm.name" in algo
    assert unknown.startswith("algorithm.name: unknown algorithm 'nonsense_algo'")
    sft, rl = load_config(path, ["stages.1.trainer.lr=3e-4", "trainer.grad_clip=0.5"])
    assert (sft.trainer.lr, rl.trainer.lr, sft.trainer.grad_clip, rl.trainer.grad_clip) == (
        0.003,
        3e-4,
        0.5,
        0.5,
    )
    # a stage that already has the overridden value hides nothing; only the others are named
    with pytest.raises(ConfigError) as info:
        load_config(path, ["trainer.lr=0.003"])
    assert "would not reach every stage: stages.1.trainer.lr set(s)" in info.value.errors[0]
    data = _two_stages(empty_project)
    data["stages"][0]["trainer"]["grad_clip"] = 0.5
    sft, rl = load_config(write_config(empty_project / "same.yaml", data), ["trainer.grad_clip=0.5"])
    assert (sft.trainer.grad_clip, rl.trainer.grad_clip) == (0.5, 0.5)


def test_a_top_level_value_every_stage_replaces_is_still_validated(empty_project):
    data = _two_stages(empty_project)
    data["algorithm"] = {"name": "grpoo"}
    data["trainer"] = {"lr": -1}
    _, errors = validate_dict(data, base_dir=empty_project)
    assert "Did you mean 'grpo'?" in _error_for(errors, "algorithm.name")
    assert "-1 is out of range; expected a number > 0" in _error_for(errors, "trainer.lr")
    assert len(errors) == 2, errors  # once each, though both stages replace them


# -- ranges and strict types -------------------------------------------------------------------------


def test_every_numeric_mistake_names_its_key_value_and_range(empty_project):
    data = _good(empty_project)
    data["tasks"].update(batch_size=-4)
    data["tasks"]["train"].update(repeat=0, sampling={"max_tokens": -1, "temperature": -2, "top_p": 1.5})
    data["explorer"] = {"timeout": -5}
    data["trainer"].update(lr=-1, micro_batch_tokens=0, keep_checkpoints=-1)
    data["eval"] = {"k": -1}
    data["buffer"] = {"get_timeout": 0}
    _, errors = validate_dict(data, base_dir=empty_project)
    expected = {
        "tasks.batch_size": "-4 is out of range; expected an integer >= 1",
        "tasks.train.repeat": "0 is out of range; expected an integer >= 1",
        "tasks.train.sampling.max_tokens": "-1 is out of range; expected an integer >= 1",
        "tasks.train.sampling.temperature": "-2 is out of range; expected a number >= 0",
        "tasks.train.sampling.top_p": "1.5 is out of range; expected a number > 0 and <= 1",
        "explorer.timeout": "-5 is out of range; expected a number > 0",
        "trainer.lr": "-1 is out of range; expected a number > 0",
        "trainer.micro_batch_tokens": "0 is out of range; expected an integer >= 1",
        "trainer.keep_checkpoints": "-1 is out of range; expected an integer >= 0",
        "eval.k": "-1 is out of range; expected an integer >= 0",
        "buffer.get_timeout": "0 is out of range; expected a number > 0",
    }
    assert len(errors) == len(expected), errors
    for key, message in expected.items():
        assert _error_for(errors, key) == f"{key}: {message}"


def test_strings_are_not_coerced_but_yaml_numbers_and_lists_are_read_as_meant(empty_project):
    data = _good(empty_project)
    data["tasks"]["shuffle"] = "yes"
    data["tasks"]["batch_size"] = "4"
    data["trainer"]["lr"] = float("nan")
    _, errors = validate_dict(data, base_dir=empty_project)
    assert "got the string 'yes'; expected true or false" in _error_for(errors, "tasks.shuffle")
    assert "got the string '4'; expected an integer" in _error_for(errors, "tasks.batch_size")
    assert "nan is out of range" in _error_for(errors, "trainer.lr")
    assert len(errors) == 3
    path = write_config(empty_project / "ok.yaml", _good(empty_project))
    (stage,) = load_config(path, ["trainer.lr=3e-4", "trainer.betas=[0.9, 0.95]", "explorer.timeout=5"])
    assert stage.trainer.lr == 3e-4 and stage.trainer.betas == (0.9, 0.95) and stage.explorer.timeout == 5.0


# -- conflicting settings ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "settings", "message"),
    [
        ("tasks", {"epochs": 3}, "tasks.total_steps=3 and tasks.epochs=3 are both set"),
        ("tasks", {"difficulty_key": "level"}, "only apply to selector: easy_to_hard"),
        ("tasks", {"selector": "easy_to_hard"}, "easy_to_hard needs tasks.difficulty_key"),
        ("buffer", {"reuse_limit": 3}, "only apply to sampler: priority"),
        ("buffer", {"pending_action": "default"}, "only apply once buffer.pending_timeout is set"),
        ("buffer", {"url": "sqlite:///x.db"}, "buffer.url only applies to storage: sql"),
        ("trainer", {"min_lr_ratio": 0.1}, "only applies to lr_schedule: cosine"),
    ],
)
def test_settings_that_would_be_ignored_are_errors(empty_project, section, settings, message):
    data = _good(empty_project)
    data.setdefault(section, {}).update(settings)
    _, errors = validate_dict(data, base_dir=empty_project)
    assert len(errors) == 1 and message in errors[0], errors


# -- workflow and reward arguments -------------------------------------------------------------------


def test_reward_and_workflow_args_are_checked_against_the_signatures(empty_project):
    data = _good(empty_project)
    data["tasks"]["train"].update(reward_args={"bogus": 1}, workflow_args={"greedy": True})
    data["tasks"]["eval"] = [
        {"path": "data.jsonl", "name": "e", "reward": "numeric_match", "reward_args": {"tol": 0.1}}
    ]
    _, errors = validate_dict(data, base_dir=empty_project)
    (error,) = errors
    assert error.startswith("tasks: ")
    assert "train.reward_args['bogus'] is not an argument of reward 'exact_match'" in error
    assert "'case_sensitive'" in error
    assert "train.workflow_args['greedy'] is not an argument of workflow 'single_turn'" in error
    assert "'greedy_baseline'" in error


def test_workflow_args_pass_through_kwargs_and_are_not_checked_in_train_mode(empty_project):
    data = _good(empty_project)
    data["tasks"]["train"].update(workflow="grid_world", workflow_args={"env_args": {"view": "local"}})
    assert validate_dict(data, base_dir=empty_project)[1] == []  # grid_world takes **kwargs
    data["tasks"]["train"].update(workflow="single_turn")
    assert "env_args" in validate_dict(data, base_dir=empty_project)[1][0]
    data.update(mode="train", algorithm={"name": "sft"})  # no workflow runs on tasks.train
    assert validate_dict(data, base_dir=empty_project)[1] == []


def test_an_algorithm_s_rollout_args_must_fit_the_workflow(empty_project):
    data = _good(empty_project)
    data["algorithm"] = {"name": "remax"}
    data["tasks"]["train"]["workflow"] = "step_wise"
    (error,) = validate_dict(data, base_dir=empty_project)[1]
    assert "'greedy_baseline'" in error and "algorithm 'remax'" in error and "step_wise" in error


def test_unknown_plugin_names_point_to_plugin_files_and_import_paths(empty_project):
    data = _good(empty_project)
    data["tasks"]["train"]["reward"] = "my_reward"
    data["tasks"]["eval"] = [{"path": "data.jsonl", "name": "e", "reward": "no_such_module_xyz:score"}]
    _, errors = validate_dict(data, base_dir=empty_project)
    unknown = _error_for(errors, "tasks.train.reward")
    assert "--plugin" in unknown and "PYTHONPATH" in unknown and "'package.module:attr'" in unknown
    failed = _error_for(errors, "tasks.eval.0.reward")
    assert "could not be imported" in failed and "PYTHONPATH" in failed and "--plugin" in failed


def test_engine_and_weight_sync_method_are_checked(empty_project):
    data = _good(empty_project)
    data["model"]["engine"] = "vlm"
    data["sync"] = {"method": "shared", "sync_offset": 1}
    _, errors = validate_dict(data, base_dir=empty_project)
    assert "unknown engine 'vlm'" in _error_for(errors, "model.engine")
    assert "set sync.method: copy (or leave it unset)" in _error_for(errors, "sync")
    data = _good(empty_project)
    data["sync"] = {"method": "copy"}
    (cfg,), errors = validate_dict(data, base_dir=empty_project)
    assert not errors and cfg.sync_method == "copy" and cfg.model.engine == "hf"
    data["sync"] = {"sync_offset": 2}
    (cfg,), _ = validate_dict(data, base_dir=empty_project)
    assert cfg.sync_method == "copy"  # running ahead needs a snapshot
    data = _good(empty_project)
    data.update(mode="train", algorithm={"name": "sft"}, sync={"method": "copy"})
    _, errors = validate_dict(data, base_dir=empty_project)
    assert any("sync settings only apply to mode 'sync'" in e for e in errors), errors


def test_a_key_given_twice_is_an_error_with_its_line(tmp_path):
    """PyYAML keeps the last of two equal keys silently; a config must not ignore a setting."""
    path = tmp_path / "dup.yaml"
    path.write_text("name: dup\ntrainer:\n  lr: 0.001\n  grad_clip: 1.0\n  lr: 0.1\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "key 'lr' is given twice" in str(err.value) and "line 5" in str(err.value)
    assert "first on line 3" in str(err.value)
    # YAML merge keys may still be overridden
    assert load_yaml("base: &b {lr: 1}\ntrainer:\n  <<: *b\n  lr: 3\n")["trainer"] == {"lr": 3}
