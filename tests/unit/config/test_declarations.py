"""Each value is declared once (DESIGN §2): where a config section and the object it configures share fields,
one side is derived from the other, or the object takes the section itself. These tests fail when a field
is added to one side only.

| config | object | how they stay one |
|---|---|---|
| ``AlgorithmRecord`` | ``AlgorithmConfig`` | the config section is generated from the record (one override per field) |
| ``BufferRules`` | ``SamplingRules`` | ``SamplingRules`` subclasses the rules (methods only); ``BufferConfig`` too |
| ``ServeConfig`` | ``ServeSettings`` | ``ServeSettings`` subclasses the section (two values resolved, two added) |
| ``TrainerConfig`` | ``Trainer`` | the Trainer takes the section; ``trine.build.ROUTED`` names the others' fields |
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import typing
from types import SimpleNamespace
from typing import Annotated

from trine.algorithms import Algorithm
from trine.buffer.sampling import SamplingRules
from trine.build import ROUTED
from trine.config import (
    AlgorithmConfig,
    AlgorithmRecord,
    BufferConfig,
    BufferRules,
    ServeConfig,
    TrainerConfig,
)
from trine.config.algorithm import NOT_OVERRIDABLE
from trine.serve.schemas import ServeSettings
from trine.trainer import Trainer


def _same(a, b) -> bool:
    """Two pydantic fields declare the same thing: type, range, default and docstring."""
    return (a.annotation, a.metadata, a.default, a.description) == (
        b.annotation,
        b.metadata,
        b.default,
        b.description,
    )


# ------------------------------------------------------------------ algorithm
def test_the_algorithm_section_has_one_override_per_record_field():
    record = AlgorithmRecord.model_fields
    assert set(NOT_OVERRIDABLE) <= set(record), f"stale NOT_OVERRIDABLE: {set(NOT_OVERRIDABLE) - set(record)}"
    overrides = [n for n in record if n not in NOT_OVERRIDABLE]
    assert list(AlgorithmConfig.model_fields) == ["name", *overrides], (
        "AlgorithmConfig declares a field of its own; declare it on AlgorithmRecord (trine/config/algorithm.py) "
        "and it becomes an override, or list it in NOT_OVERRIDABLE with the reason"
    )
    assert Algorithm.model_fields.keys() == record.keys(), (
        "trine.algorithms.Algorithm adds behaviour, not fields"
    )


def test_each_override_is_the_record_s_type_and_docstring_defaulting_to_none():
    for name, field in AlgorithmConfig.model_fields.items():
        if name == "name":
            continue
        source = AlgorithmRecord.model_fields[name]
        typed = Annotated[(source.annotation, *source.metadata)] if source.metadata else source.annotation
        assert field.default is None, f"algorithm.{name} must default to None (= keep the preset's value)"
        assert field.annotation == typed | None, (name, field.annotation, typed)
        assert field.description == source.description and field.description, name


# ------------------------------------------------------------------ buffer
STORAGE_KEYS = {"storage", "url", "storage_args", "operators", "get_timeout", "end_after_idle"}
"""``buffer`` keys that pick and open the storage (``trine.buffer.open_buffer``), or say how long the trainer
waits on it, not sampling rules."""


def test_sampling_rules_are_the_buffer_section_s_rules():
    rules, own = BufferRules.model_fields, SamplingRules.model_fields
    assert own.keys() == rules.keys(), "SamplingRules adds behaviour; declare a rule on BufferRules"
    assert all(_same(own[n], rules[n]) for n in rules), "SamplingRules re-declares a field of BufferRules"
    config = BufferConfig.model_fields
    assert all(_same(config[n], rules[n]) for n in rules)
    assert set(config) - set(rules) == STORAGE_KEYS, (
        f"buffer keys that are neither a sampling rule nor a storage key: {set(config) - set(rules) - STORAGE_KEYS}; "
        "a rule every storage applies goes on BufferRules (trine/config/learn.py)"
    )


def test_every_rule_is_read_from_the_section():
    section = BufferConfig(
        sampler="priority",
        reuse_limit=3,
        reuse_decay=0.5,
        cooldown=2,
        max_staleness=4,
        stale_retries=5,
        pending_timeout=9.0,
        pending_action="default",
        default_reward=-1.0,
        whole_groups=True,
    )
    assert all(n in section.model_fields_set for n in BufferRules.model_fields), "set every rule above"
    rules = SamplingRules.from_section(section)
    assert rules.model_dump() == section.model_dump(include=set(BufferRules.model_fields))


# ------------------------------------------------------------------ serve
RESOLVED = {"model_name", "max_prompt_tokens"}
"""``serve`` keys a running server resolves (None in the config: derived at start), narrowed in ServeSettings."""
SERVER_ONLY = {"api_key", "max_body_bytes"}
"""ServeSettings fields that are no config key: the token (the config names its environment variable) and
the body limit."""


def test_serve_settings_are_the_serve_section_resolved():
    config, settings = ServeConfig.model_fields, ServeSettings.model_fields
    assert set(settings) == set(config) | SERVER_ONLY, (
        f"ServeSettings fields {set(settings) - set(config) - SERVER_ONLY} are no serve key; declare limits on "
        "ServeConfig (trine/config/serve.py)"
    )
    redeclared = {n for n in config if not _same(settings[n], config[n])}
    assert redeclared == RESOLVED, (
        f"ServeSettings re-declares {redeclared - RESOLVED}; only {RESOLVED} are resolved"
    )
    for name in RESOLVED:  # the config's type and range, without None
        assert _constrained(config[name]) == _constrained(settings[name]), name


def _constrained(field) -> tuple[object, list[object]]:
    """A field's type without None, and its range: ``(int, [Ge(ge=1)])`` for ``Count`` and ``Count | None``."""
    options = [a for a in typing.get_args(field.annotation) if a is not type(None)] or [field.annotation]
    (annotation,) = options
    metadata = list(field.metadata)
    if typing.get_origin(annotation) is Annotated:
        annotation, *extra = typing.get_args(annotation)
        for item in extra:
            metadata += getattr(item, "metadata", [item])
    return annotation, metadata


def test_settings_of_carries_every_serve_key(monkeypatch):
    from trine.launch.serve import settings_of

    serve = ServeConfig(
        host="0.0.0.0",
        port=0,
        api_key_env="TRINE_TEST_DECLARED_KEY",
        model_name="m",
        max_concurrent=3,
        max_queue=5,
        max_prompt_tokens=77,
        max_chars_per_token=9,
        max_tokens=40,
        default_max_tokens=9,
        max_n=2,
        session_timeout=8.0,
        weights_poll_seconds=0.5,
        request_timeout=7.0,
        keep_alive_timeout=11.0,
        idempotency_keys=12,
    )
    assert set(serve.model_fields_set) == set(ServeConfig.model_fields), "set every serve key above"
    monkeypatch.setenv("TRINE_TEST_DECLARED_KEY", "token")
    settings = settings_of(SimpleNamespace(serve=serve, name="run"), 512)  # it reads these two
    assert settings.model_dump(include=set(ServeConfig.model_fields)) == serve.model_dump()
    assert settings.api_key == "token"


# ------------------------------------------------------------------ trainer
def _settings_read_by_the_trainer() -> set[str]:
    """The ``settings.<field>`` attributes :meth:`Trainer.__init__` reads."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(Trainer.__init__)))
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "settings"
    }


def test_every_trainer_field_is_read_by_the_trainer_or_routed():
    fields, read, routed = (
        set(TrainerConfig.model_fields),
        _settings_read_by_the_trainer(),
        set(ROUTED[TrainerConfig]),
    )
    assert read <= fields, (
        f"Trainer reads settings.{sorted(read - fields)}, which TrainerConfig does not declare"
    )
    assert not read & routed, (
        f"{sorted(read & routed)} are read by the Trainer; remove them from trine.build.ROUTED"
    )
    assert fields == read | routed, (
        f"trainer.{sorted(fields - read - routed)} reach nothing: read them in Trainer.__init__ (settings.<name>) "
        "or name their reader in trine.build.ROUTED"
    )


def test_the_trainer_takes_no_parameter_named_like_a_trainer_field():
    params = set(inspect.signature(Trainer).parameters)
    assert not params & set(TrainerConfig.model_fields), (
        f"Trainer parameters {sorted(params & set(TrainerConfig.model_fields))} re-declare trainer config "
        "fields; read them from the settings (TrainerConfig) instead"
    )
