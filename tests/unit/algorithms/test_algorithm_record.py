"""The algorithm record: every field declared once, with a docstring, by :class:`trine.config.AlgorithmRecord`
(trine/config/algorithm.py); :class:`trine.algorithms.Algorithm` adds what needs the algorithms library, and
the ``algorithm`` config section is derived from the record (tests/unit/config/test_declarations.py checks the
derivation). These tests check the record's values: the presets, the tables its choices name, a plugin's
record validated like a config."""

from __future__ import annotations

import typing

import pytest

from trine.algorithms import AGG_MODES, KL_ESTIMATORS, PRESETS, Algorithm
from trine.config import AlgorithmConfig, AlgorithmRecord

RECORD = AlgorithmRecord.model_fields


def test_literal_choices_are_the_algorithms_own_tables():
    assert RECORD["loss_agg"].annotation == typing.Literal[AGG_MODES]
    assert RECORD["kl_estimator"].annotation == typing.Literal[KL_ESTIMATORS]


def test_every_record_field_has_a_docstring():
    missing = sorted(name for name, field in RECORD.items() if not (field.description or "").strip())
    assert not missing, f"AlgorithmRecord fields without a docstring: {missing}"


def test_the_algorithm_class_adds_behaviour_not_fields():
    assert Algorithm.model_fields.keys() == RECORD.keys()


def test_a_plugin_record_is_validated_like_a_config():
    assert Algorithm(name="mine", advantage="grpo", loss="pg").kl_coef == 0.0
    with pytest.raises(ValueError, match="kl_coef"):
        Algorithm(name="mine", loss="pg", kl_coef=-1.0)
    with pytest.raises(ValueError, match="loss_agg"):
        Algorithm(name="mine", loss="pg", loss_agg="token-sum")
    with pytest.raises(ValueError, match="kl_coeff"):
        Algorithm(name="mine", loss="pg", kl_coeff=0.1)  # a misspelt field


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_every_preset_s_values_are_valid_overrides_and_round_trip(preset):
    algo = PRESETS[preset]
    values = {n: getattr(algo, n) for n in AlgorithmConfig.model_fields if n != "name"}
    config = AlgorithmConfig(name=preset, **values)  # strict validation: types and ranges
    assert algo.with_overrides(**config.model_dump(exclude={"name"})) == algo
    assert algo.with_overrides(**AlgorithmConfig(name=preset).model_dump(exclude={"name"})) == algo
