"""``reward_args`` / ``workflow_args`` against the function's signature at validate time: unknown names and
values of the wrong type are config errors naming the key, the value and the expected type, all at once."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import GOOD_ROWS
from trine.config import validate_dict
from trine.registry import register


@register("reward", "test_typed_reward")
def typed_reward(response: str, task, scale: int = 1, label: str = "x", weights: list[float] | None = None):
    return float(scale)


@register("reward", "test_untyped_reward")
def untyped_reward(response, task, anything=None, **more):
    return 0.0


def _errors(tmp_path: Path, train: dict, evals: list[dict] | None = None) -> list[str]:
    (tmp_path / "good.jsonl").write_text(GOOD_ROWS)
    (tmp_path / "model").mkdir(exist_ok=True)
    data = {
        "model": {"path": "model"},
        "run_dir": "run",
        "tasks": {
            "total_steps": 1,
            "train": {"path": "good.jsonl", **train},
            "eval": [{"path": "good.jsonl", **e} for e in evals or []],
        },
    }
    _, errors = validate_dict(data, base_dir=tmp_path)
    return errors


def test_wrong_types_and_unknown_names_are_all_reported_at_once(tmp_path):
    errors = _errors(
        tmp_path,
        {"reward": "test_typed_reward", "reward_args": {"scale": "3", "label": 7, "weigths": [1.0]}},
        [{"reward": "numeric_match", "reward_args": {"tol": "0.1"}}],
    )
    text = "\n".join(errors)
    assert "train.reward_args['weigths'] is not an argument of reward 'test_typed_reward'" in text
    assert "train.reward_args['scale']='3' (str)" in text and "expected int" in text
    assert "train.reward_args['label']=7 (int)" in text and "expected str" in text
    assert "eval.0.reward_args['tol']='0.1' (str)" in text and "expected float" in text
    assert "without quotes" in text  # how to fix a number written as a string


def test_values_that_fit_their_annotations_pass(tmp_path):
    good = {"scale": 2, "label": "y", "weights": [1, 0.5]}  # an int where a float is expected is fine
    assert _errors(tmp_path, {"reward": "test_typed_reward", "reward_args": good}) == []
    assert _errors(tmp_path, {"reward": "numeric_match", "reward_args": {"tol": 1}}) == []
    assert (
        _errors(tmp_path, {"reward": "test_untyped_reward", "reward_args": {"anything": [1], "x": 2}}) == []
    )


def test_a_bool_is_not_taken_for_a_number(tmp_path):
    errors = _errors(tmp_path, {"reward": "test_typed_reward", "reward_args": {"scale": True}})
    assert any("reward_args['scale']=True (bool)" in e and "expected int" in e for e in errors), errors
