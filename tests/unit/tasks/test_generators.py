"""Tasksets made by a task generator (``tasks.*.generator``): the built-in ``arithmetic`` and
``reasoning_gym`` generators, seeds hashed from the taskset name, the config keys, and the errors."""

from __future__ import annotations

import json

import pytest

from tests.helpers import write_config
from trine.config import ConfigError, load_config
from trine.tasks import TaskSet
from trine.tasks.generators import default_seed, generate_rows


def reasoning_gym():
    return pytest.importorskip(
        "reasoning_gym", reason='reasoning-gym is not installed (pip install -e ".[envs]")'
    )


def test_arithmetic_generator_rows_become_tasks():
    ts = TaskSet(generator="arithmetic", generator_args={"size": 5, "seed": 3}, reward="numeric_match")
    assert len(ts) == 5 and ts.path is None
    task = ts[0]
    assert (
        task.question.endswith("=") and task.answer == task.raw["answer"] and task.reward == "numeric_match"
    )
    assert [t.task_id for t in ts] == [f"train/{i}" for i in range(5)]


def test_missing_seed_is_hashed_from_the_taskset_name():
    train = TaskSet(generator="arithmetic", generator_args={"size": 20}, name="train")
    again = TaskSet(generator="arithmetic", generator_args={"size": 20}, name="train")
    held_out = TaskSet(generator="arithmetic", generator_args={"size": 20}, name="eval")
    assert [t.question for t in train] == [t.question for t in again]  # every process builds the same rows
    assert [t.question for t in train] != [t.question for t in held_out]
    assert default_seed("train") == default_seed("train") != default_seed("eval")
    seeded = TaskSet(generator="arithmetic", generator_args={"size": 20, "seed": 1}, name="eval")
    assert [t.question for t in seeded] == [
        t.question for t in TaskSet(generator="arithmetic", generator_args={"size": 20, "seed": 1})
    ]


def test_path_and_generator_are_exclusive(tmp_path):
    with pytest.raises(ValueError, match="neither path nor generator"):
        TaskSet()
    with pytest.raises(ValueError, match="both path="):
        TaskSet(tmp_path / "x.jsonl", generator="arithmetic")
    with pytest.raises(ValueError, match="generator_args=.* without a generator"):
        TaskSet([{"question": "q", "answer": "a"}], generator_args={"size": 2})


def test_unknown_generator_and_bad_arguments_are_named():
    with pytest.raises(ValueError, match="unknown generator 'arithmetik'.*Did you mean 'arithmetic'"):
        generate_rows("arithmetik", {}, "train")
    with pytest.raises(ValueError, match=r"does not take generator_args \['colour'\].*parameters are"):
        generate_rows("arithmetic", {"colour": "red"}, "train")


def test_an_import_path_generator(tmp_path, monkeypatch):
    (tmp_path / "my_rows.py").write_text(
        "def rows(n=2):\n    return ({'question': f'q{i}', 'answer': str(i)} for i in range(n))\n"
        "def broken():\n    return {'question': 'q'}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    ts = TaskSet(generator="my_rows:rows", generator_args={"n": 3})
    assert [t.answer for t in ts] == ["0", "1", "2"]
    with pytest.raises(ValueError, match="returned dict; expected a list"):
        TaskSet(generator="my_rows:broken")


def test_config_takes_a_generator_instead_of_a_path(tmp_path, tiny_model_dir):
    base = {
        "name": "g",
        "run_dir": str(tmp_path / "run"),
        "model": {"path": str(tiny_model_dir)},
        "tasks": {"total_steps": 1, "train": {"generator": "arithmetic", "generator_args": {"size": 4}}},
    }
    (stage,) = load_config(write_config(tmp_path / "ok.yaml", base))
    assert stage.tasks.train.path is None and stage.tasks.train.generator_args == {"size": 4}
    for train, expected in [
        ({}, "neither path nor generator is set"),
        ({"path": str(tmp_path / "ok.yaml"), "generator": "arithmetic"}, "both path and generator are set"),
        ({"generator": "arithmetik"}, "unknown generator 'arithmetik'"),
        ({"path": str(tmp_path / "ok.yaml"), "generator_args": {"size": 2}}, "generator_args is set without"),
    ]:
        data = {**base, "tasks": {"total_steps": 1, "train": train}}
        with pytest.raises(ConfigError, match=expected):
            load_config(write_config(tmp_path / "bad.yaml", data))


def test_reasoning_gym_rows_are_its_entries_made_plain():
    rg = reasoning_gym()
    ts = TaskSet(generator="reasoning_gym", generator_args={"dataset": "leg_counting", "size": 4, "seed": 7})
    entries = list(rg.create_dataset("leg_counting", size=4, seed=7))
    assert [t.question for t in ts] == [e["question"] for e in entries]
    assert [t.answer for t in ts] == [e["answer"] for e in entries]
    raw = ts[0].raw
    assert raw["metadata"]["source_dataset"] == "leg_counting"
    assert json.loads(json.dumps(raw)) == raw  # tuples in reasoning-gym's metadata became lists
    assert isinstance(raw["metadata"]["difficulty"]["num_animals"], list)


def test_reasoning_gym_generator_settings_pass_through():
    reasoning_gym()
    ts = TaskSet(
        generator="reasoning_gym",
        generator_args={
            "dataset": "basic_arithmetic",
            "size": 6,
            "min_terms": 2,
            "max_terms": 2,
            "max_digits": 1,
        },
    )
    assert all(t.raw["metadata"]["num_terms"] == 2 for t in ts)


def test_reasoning_gym_errors_name_the_dataset_and_its_settings():
    reasoning_gym()
    with pytest.raises(
        ValueError, match="'leg_countin' is not a reasoning-gym dataset. Did you mean.*leg_counting"
    ):
        generate_rows("reasoning_gym", {"dataset": "leg_countin"}, "train")
    with pytest.raises(ValueError, match="refused generator_args.*settings are .*max_animals"):
        generate_rows("reasoning_gym", {"dataset": "leg_counting", "legs": 3}, "train")


def test_validate_names_the_envs_extra_when_reasoning_gym_is_missing(tmp_path, tiny_model_dir, monkeypatch):
    from typer.testing import CliRunner

    from trine.cli import app
    from trine.config import extras

    real = extras.installed
    monkeypatch.setattr(extras, "installed", lambda module: module != "reasoning_gym" and real(module))
    train = {
        "generator": "reasoning_gym",
        "generator_args": {"dataset": "leg_counting"},
        "reward": "reasoning_gym",
    }
    data = {
        "name": "g",
        "run_dir": str(tmp_path / "run"),
        "model": {"path": str(tiny_model_dir)},
        "tasks": {"total_steps": 1, "train": train},
    }
    result = CliRunner().invoke(app, ["validate", str(write_config(tmp_path / "rg.yaml", data))])
    flat = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "tasks.train.reward: reasoning_gym needs reasoning_gym" in flat, flat
    assert "tasks.train.generator: reasoning_gym needs reasoning_gym" in flat and '".[envs]"' in flat, flat
