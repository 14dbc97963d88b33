"""``trine check``'s "eval rows in training" row: a WARN (not a failure) when eval prompts are training
prompts, bounded to exact matches over the first rows of each taskset."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.helpers import EXAMPLE, write_arithmetic_config, write_config
from trine.cli import app
from trine.config import load_config
from trine.inspect import contamination
from trine.inspect.contamination import config_tasksets, contamination_row, exact_index, exact_matches

TRAIN = str(EXAMPLE / "data" / "train.jsonl")
EVAL = str(EXAMPLE / "data" / "eval.jsonl")  # the same 100 sums as TRAIN, in another order


def _config(tmp_path, evals: list[dict], **tasks) -> object:
    path = write_config(
        tmp_path / "run.yaml",
        model={"path": "model", "init_preset": "tiny-0.5m"},
        tasks={"total_steps": 1, "train": {"path": TRAIN}, "eval": evals, **tasks},
    )
    return load_config(path)


@pytest.fixture
def fresh(tmp_path):
    """Two sums the training set (single digits) does not hold."""
    path = tmp_path / "fresh.jsonl"
    path.write_text('{"question": "10+10=", "answer": "20"}\n{"question": "12+3=", "answer": "15"}\n')
    return str(path)


def test_warns_with_counts_and_one_example(tmp_path, fresh):
    (cfg,) = _config(tmp_path, [{"name": "addition", "path": EVAL}, {"name": "fresh", "path": fresh}])
    row = contamination_row(cfg, "run.yaml")
    assert (row.check, row.result, row.value) == ("eval rows in training", "WARN", "100 of 102")
    assert row.detail.startswith("tasks.eval.0 'addition': 100 of 100 eval rows have a training row's prompt")
    assert "e.g. eval task addition/0 '5+3=' is row 97 (task train/97)" in row.detail
    assert "fresh" not in row.detail and "`trine tasks overlap --config run.yaml`" in row.detail
    assert "memory, not skill" in row.note


def test_ok_without_overlap_and_info_without_eval(tmp_path, fresh):
    (cfg,) = _config(tmp_path, [{"name": "fresh", "path": fresh}])
    row = contamination_row(cfg)
    assert (row.result, row.value) == ("OK", "0 of 2")
    assert "compared" not in row.detail  # nothing was cut
    (no_eval,) = _config(tmp_path, [])
    assert contamination_row(no_eval).result == "INFO"


def test_templates_are_applied_and_mix_counts_as_training(tmp_path, fresh):
    (cfg,) = _config(
        tmp_path,
        [{"name": "fresh", "path": fresh, "prompt_template": "Q: {question}"}],
        mix=[{"name": "more", "path": fresh, "prompt_template": "Q: {question}"}],
    )
    train, evals = config_tasksets([cfg])
    assert [k for k, _ in train] == ["tasks.train 'train'", "tasks.mix.0 'more'"]
    row = contamination_row(cfg)
    assert row.result == "WARN" and "is tasks.mix.0 'more' row 0 (task more/0)" in row.detail
    mix = [{"name": "more", "path": fresh, "prompt_template": "Q: {question}"}]
    (plain,) = _config(tmp_path, [{"name": "fresh", "path": fresh}], mix=mix)
    assert contamination_row(plain).result == "OK"  # the prompts differ by the template


def test_bounded_to_the_first_rows(tmp_path, monkeypatch):
    monkeypatch.setattr(contamination, "CHECK_LIMITS", {"train": 50, "eval": 10})
    (cfg,) = _config(tmp_path, [{"name": "addition", "path": EVAL}])
    row = contamination_row(cfg)
    assert row.result == "WARN" and row.value.endswith(" of 10")
    assert "(compared: first 50 rows of tasks.train 'train', first 10 rows of tasks.eval.0 'addition')" in (
        row.detail
    )


def test_exact_matches_normalize_and_skip_empty_rows():
    index = exact_index(["What is 3+4?", "", "x", "WHAT IS 3+4"])
    assert index == {"what is 3 + 4": 0, "x": 2}
    assert exact_matches(index, ["what is 3 + 4", "", "?", "y"]) == {0: 0}


def test_trine_check_warns_but_passes(tmp_path, tiny_model_dir):
    evals = {"tasks": {"eval": [{"name": "addition", "path": EVAL}]}}
    config = write_arithmetic_config(tmp_path, tiny_model_dir, "contaminated", evals)
    result = CliRunner().invoke(app, ["check", str(config), "--turns", "1", "--episodes", "0", "--json"])
    assert result.exit_code == 0, result.output  # a warning, not a failure
    rows = {r["check"]: r for r in json.loads(result.stdout)["rows"]}
    row = rows["eval rows in training"]
    assert (row["result"], row["value"]) == ("WARN", "100 of 100")
    assert f"trine tasks overlap --config {config}" in row["detail"]
