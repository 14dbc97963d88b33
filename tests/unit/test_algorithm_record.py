"""The algorithm record and its config section: each algorithm field is written once.

``Algorithm`` (trine/algorithms/presets.py) is the record; ``AlgorithmConfig`` (trine/config/run.py) holds
the fields a config may override, each defaulting to None (= keep the preset's value). The config
cannot be generated from the record: ``trine.config`` is a base module that must not import the
algorithms library (and torch with it; ``trine --help`` reads the config). So these tests fail
when the two drift: a field on one side only, a type or value set that does not match, a missing
docstring, a preset whose values the config section would reject.
"""

from __future__ import annotations

import ast
import inspect
import types
import typing
from dataclasses import fields

import pytest

from trine.algorithms import AGG_MODES, KL_ESTIMATORS, PRESETS, Algorithm, presets
from trine.config import AlgorithmConfig

NOT_OVERRIDABLE = {
    "paper": "documentation of the record, not a setting",
    "needs_critic": "PPO's critic goes with its GAE advantage; pick the ppo preset",
    "pairwise": "the loss reads preference pairs; the data format follows the algorithm",
    "rollout_args": "what the algorithm's advantage needs from the workflow (ReMax's greedy baseline)",
    "from_rollouts": "decides the mode the algorithm runs in (sync or train)",
}
"""Record fields a config cannot override, and why. A new record field goes either into
``AlgorithmConfig`` (with a docstring) or here (with a reason)."""

CONFIG = AlgorithmConfig.model_fields
RECORD = typing.get_type_hints(Algorithm)


def _plain(annotation: object) -> tuple[object, ...]:
    """The alternatives of a type without ``None`` and without ``Annotated`` range metadata."""
    options = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    out = []
    for option in options:
        if option is type(None):
            continue
        out.append(typing.get_args(option)[0] if typing.get_origin(option) is typing.Annotated else option)
    return tuple(out)


def _is_union(annotation: object) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _record_docstrings() -> dict[str, str]:
    """``{field: docstring}`` of the record, read from the string under each field."""
    body = next(
        n for n in ast.parse(inspect.getsource(presets)).body if getattr(n, "name", None) == "Algorithm"
    ).body
    docs = {}
    for stmt, after in zip(body, body[1:]):
        if isinstance(stmt, ast.AnnAssign) and isinstance(after, ast.Expr):
            if isinstance(after.value, ast.Constant) and isinstance(after.value.value, str):
                docs[stmt.target.id] = after.value.value
    return docs


def test_the_config_section_overrides_exactly_the_record_s_settable_fields():
    record = {f.name for f in fields(Algorithm)}
    assert set(NOT_OVERRIDABLE) <= record, f"stale NOT_OVERRIDABLE entries: {set(NOT_OVERRIDABLE) - record}"
    assert set(CONFIG) == record - set(NOT_OVERRIDABLE), (
        f"only in AlgorithmConfig: {sorted(set(CONFIG) - record)}; only on the Algorithm record: "
        f"{sorted(record - set(NOT_OVERRIDABLE) - set(CONFIG))}. Add the field to both, or list it in "
        "NOT_OVERRIDABLE with the reason."
    )


@pytest.mark.parametrize("name", sorted(set(CONFIG) - {"name"}))
def test_each_override_defaults_to_none_and_has_the_record_s_type(name):
    field = CONFIG[name]
    assert field.default is None, f"algorithm.{name} must default to None (= keep the preset's value)"
    assert field.description, f"algorithm.{name} has no docstring in AlgorithmConfig"
    config_types, record_types = _plain(field.annotation), _plain(RECORD[name])
    assert len(config_types) == len(record_types) == 1, (name, config_types, record_types)
    config_type, record_type = config_types[0], record_types[0]
    if typing.get_origin(config_type) is typing.Literal:
        assert all(isinstance(v, record_type) for v in typing.get_args(config_type)), (name, config_type)
    else:
        assert config_type == record_type, f"algorithm.{name}: config {config_type}, record {record_type}"


def test_literal_choices_are_the_algorithms_own_tables():
    assert _plain(CONFIG["loss_agg"].annotation)[0] == typing.Literal[AGG_MODES]
    assert _plain(CONFIG["kl_estimator"].annotation)[0] == typing.Literal[KL_ESTIMATORS]


def test_every_record_field_and_config_field_has_a_docstring():
    docs = _record_docstrings()
    missing = sorted(f.name for f in fields(Algorithm) if not docs.get(f.name, "").strip())
    assert not missing, f"Algorithm fields without a docstring: {missing}"
    assert all(CONFIG[n].description for n in CONFIG), "every AlgorithmConfig field needs a docstring"


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_s_values_are_valid_overrides_and_round_trip(preset):
    algo = PRESETS[preset]
    values = {n: getattr(algo, n) for n in CONFIG if n != "name"}
    config = AlgorithmConfig(name=preset, **values)  # strict validation: types and ranges
    assert algo.with_overrides(**config.model_dump(exclude={"name"})) == algo
    assert algo.with_overrides(**AlgorithmConfig(name=preset).model_dump(exclude={"name"})) == algo
