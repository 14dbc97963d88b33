"""The raw config dict before validation: YAML reading, dotted overrides, stage merging, shadowing.

Nothing here knows the sections (:mod:`trine.config` does); these are plain dict operations, so
they can be used by :mod:`trine.config` without importing it.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import yaml


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading ``3e-4`` as a float as YAML 1.2 does (PyYAML makes it a string), and
    refusing a key given twice in one mapping (PyYAML keeps the last silently: a setting would be ignored)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base`: merged keys may be overridden
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"key {key!r} is given twice in one mapping (first on line {seen[key].line + 1}); "
                    "keep one of them",
                    key_node.start_mark,
                )
            if isinstance(key, (str, int, float, bool)):
                seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_yaml(text: str) -> Any:
    """Parse YAML text (safe: plain data only; ``3e-4`` is a float)."""
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - _Loader is a SafeLoader


class ConfigError(ValueError):
    """Every problem found in a config, one per line, each with its key path."""

    def __init__(self, errors: list[str], where: str = "the config"):
        self.errors = errors
        super().__init__(f"{len(errors)} error(s) in {where}:\n" + "\n".join(f"  - {e}" for e in errors))


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    node = data
    parts = key.split(".")
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth]) or "the top level"
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(
                    [
                        f"override {key!r}: {where} is a list of {len(node)}; "
                        f"use an index 0..{len(node) - 1} instead of {part!r}"
                    ]
                )
            index: Any = int(part)
        elif isinstance(node, dict):
            index = part
        else:
            raise ConfigError(
                [f"override {key!r}: {where} is a value, not a mapping; it has no key {part!r}"]
            )
        if depth == len(parts) - 1:
            node[index] = value
        else:
            if isinstance(node, dict) and node.get(part) is None:
                node[part] = {}
            node = node[index]


def _override_value(key: str, raw: str) -> Any:
    """The YAML value of one ``key=raw`` override (``None`` when empty); a :class:`ConfigError` naming the
    key when ``raw`` is not YAML."""
    if not raw.strip():
        return None
    try:
        return load_yaml(raw)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(
            [
                f"override {key}={raw!r}: the value is not YAML ({problem}); quote a string value "
                f"({key}='\"...\"'), or write a list as [a, b] and a mapping as {{k: v}}"
            ]
        ) from None


def parse_overrides(overrides: list[str]) -> list[tuple[str, Any]]:
    """``key.sub=value`` overrides as (key, YAML value) pairs; every malformed one in one :class:`ConfigError`."""
    pairs, errors = [], []
    for item in overrides:
        key, eq, raw = item.partition("=")
        if not eq or not key.strip():
            errors.append(f"override {item!r} is not of the form key.sub=value")
            continue
        try:
            pairs.append((key.strip(), _override_value(key.strip(), raw)))
        except ConfigError as err:
            errors.extend(err.errors)
    if errors:
        raise ConfigError(errors)
    return pairs


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides (values parsed as YAML: numbers, bools, lists)."""
    data = copy.deepcopy(data)
    for key, value in parse_overrides(overrides):
        _set_dotted(data, key, value)
    return data


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``override`` into a copy of ``base`` (dicts merge, everything else replaces)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _leaves(prefix: list[str], value: Any) -> list[list[str]]:
    """Key paths of the non-mapping values inside ``value`` (``value`` itself if it is not a mapping)."""
    if isinstance(value, dict) and value:
        return [leaf for key, sub in value.items() for leaf in _leaves([*prefix, str(key)], sub)]
    return [prefix]


def _get(node: Any, parts: list[str]) -> Any:
    for part in parts:
        node = node[part]
    return node


def _same(stage: dict[str, Any], hit: str, value: Any) -> bool:
    """True when the stage already sets ``hit`` to ``value`` (the override changes nothing there)."""
    return _get(stage, hit.split(".")) == value


def _set_by(stage: Any, parts: list[str]) -> str | None:
    """The key path in ``stage`` whose value replaces the top-level ``parts`` for it, if any."""
    node = stage
    for depth, part in enumerate(parts):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
        if not isinstance(node, dict) or depth == len(parts) - 1:
            return ".".join(parts[: depth + 1])
    return None


def shadowed_paths(base: dict[str, Any], stage: dict[str, Any]) -> list[tuple[str, ...]]:
    """Top-level key paths of ``base`` that ``stage`` replaces (its own value wins when merged)."""
    found = []
    for leaf in _leaves([], base):
        key = _set_by(stage, leaf)
        if key is not None and tuple(key.split(".")) not in found:
            found.append(tuple(key.split(".")))
    return found


def shadowed_overrides(data: dict[str, Any], overrides: list[str]) -> list[str]:
    """An error for each top-level override (``trainer.lr=...``) that a stage's own value would hide.

    Stages are merged over the top level, so a key a stage sets wins there; overriding the
    top-level value on the command line would silently change nothing for that stage. A stage
    that already sets the same value hides nothing.
    """
    stages = data.get("stages")
    if not isinstance(stages, list) or not stages:
        return []
    errors = []
    for item, (key, value) in zip(overrides, parse_overrides(overrides)):
        raw = item.partition("=")[2]
        if key.split(".")[0] == "stages":
            continue
        hiding = sorted(
            {
                f"stages.{i}.{hit}"
                for leaf in _leaves(key.split("."), value)
                for i, stage in enumerate(stages)
                if (hit := _set_by(stage, leaf)) is not None
                and not _same(stage, hit, _get(value, leaf[len(key.split(".")) :]))
            }
        )
        if hiding:
            each = " ".join(f"stages.{i}.{key}={raw.strip()}" for i in range(len(stages)))
            errors.append(
                f"override {item!r} would not reach every stage: {', '.join(hiding)} set(s) their own "
                f"value, which wins over the top level. Override the stages instead: {each}"
            )
    return errors
