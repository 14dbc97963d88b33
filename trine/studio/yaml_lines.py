"""Where a config error is in the YAML text: key paths to line numbers, for the studio's editor.

A config error is one line ``<key path>: <message>`` (:mod:`trine.config.format`); :func:`split_error`
splits it, and :func:`locate` finds the line of that key path in the YAML node tree
(:func:`compose`): ``stages.0.trainer.lr`` walks into sequences by index, an unknown key points at
the key's own line, and a path the text does not hold points at its nearest existing parent. A stage
inherits what it does not set from the top level, so ``stages.1.trainer.lr`` that stage 1 does not
write points at the top-level ``trainer.lr`` when that one is written. Errors about a whole config or
stage (``<root>: ...``, ``stages.1: ...``) point at the first key path their message names.
Lines are 1-based.

:func:`compose` is also the studio's bound on YAML from the browser: at most :data:`MAX_NODES` nodes,
aliases counted at their expanded size (a "billion laughs" text of a few hundred bytes that expands to
10⁹ nodes is refused as soon as its count passes the bound, before anything expands it), nested at most
:data:`MAX_DEPTH` deep (the composer recurses per level), and no alias inside its own anchor (an endless,
self-containing value), each refusal a :class:`YamlTooBig` at its line.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

_PATH = re.compile(r"^([A-Za-z0-9_<>\-\[\]'.]+?)(?=: | \(|:$)")
_NAMED = re.compile(r"(?<![\w./])([a-z_][a-z0-9_]*(?:\.[a-z0-9_]+)+)")
_STAGE = re.compile(r"^stages\.(\d+)$")


MAX_NODES = 20_000
"""Nodes a config text may hold, aliases counted at their expanded size (a run config has a few hundred)."""
MAX_DEPTH = 64
"""Levels of nesting a config text may have (a run config has about five)."""


class YamlTooBig(yaml.MarkedYAMLError):
    """A YAML text over :data:`MAX_NODES` or :data:`MAX_DEPTH`, at the node where it went over."""


class _BoundedLoader(yaml.SafeLoader):
    """A safe loader whose composer counts nodes (an alias as the nodes it stands for) and depth."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0
        self._sizes: dict[int, int] = {}  # id(node) -> its expanded size, for aliases to it

    def compose_node(self, parent: Any, index: Any) -> Any:
        mark = self.peek_event().start_mark
        if self.check_event(yaml.AliasEvent):
            node = super().compose_node(parent, index)
            if id(node) not in self._sizes:  # its anchor is still being composed: the alias is inside it
                raise YamlTooBig(
                    None,
                    None,
                    "an alias (*name) inside the node its anchor names makes an endless value",
                    mark,
                )
            self._count(self._sizes[id(node)], mark)
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise YamlTooBig(
                None,
                None,
                f"the YAML is nested more than {MAX_DEPTH} levels deep (a run config has about five); "
                "flatten it",
                mark,
            )
        before = self._nodes
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._count(1, mark)
        self._sizes[id(node)] = self._nodes - before
        return node

    def _count(self, n: int, mark: Any) -> None:
        self._nodes += n
        if self._nodes > MAX_NODES:
            raise YamlTooBig(
                None,
                None,
                f"the YAML holds more than {MAX_NODES} nodes, aliases (*name) counted as the nodes they "
                "repeat (a run config has a few hundred); remove the repetition",
                mark,
            )


def compose(text: str) -> yaml.Node | None:
    """The YAML node tree of ``text`` (None when empty); raises ``yaml.YAMLError`` on bad syntax and
    :class:`YamlTooBig` past :data:`MAX_NODES` or :data:`MAX_DEPTH`."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_node()
    finally:
        loader.dispose()


def syntax_error(err: yaml.YAMLError) -> dict[str, Any]:
    """A YAML syntax error as one editor error: ``{"path": None, "line", "message"}`` (a
    :class:`YamlTooBig` says its own words)."""
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    if isinstance(err, YamlTooBig):
        return {"path": None, "line": mark.line + 1 if mark is not None else None, "message": err.problem}
    problem = getattr(err, "problem", None) or str(err)
    context = getattr(err, "context", None)
    text = f"{context}, {problem}" if context else problem
    column = f" (column {mark.column + 1})" if mark is not None else ""
    return {
        "path": None,
        "line": mark.line + 1 if mark is not None else None,
        "message": f"not valid YAML{column}: {text}; fix the syntax (indentation, ':' after keys, quotes)",
    }


def split_error(line: str) -> tuple[str | None, str]:
    """``("trainer.lr", "-1 is out of range; ...")`` from ``"trainer.lr: -1 is out of range; ..."``.

    A preflight line ``tasks.train (data/x.jsonl): ...`` keeps its parenthesis in the message;
    ``<root>`` (the whole config) and a line with no key path give path None.
    """
    found = _PATH.match(line)
    if found is None:
        return None, line
    path = found.group(1)
    message = line[len(path) :].removeprefix(":").strip()
    return (None if path == "<root>" else path), message


def _walk(node: yaml.Node | None, parts: list[str]) -> tuple[int | None, int]:
    """(line of the deepest node of ``parts`` found under ``node``, how many parts were found)."""
    line = node.start_mark.line + 1 if node is not None else None
    for depth, part in enumerate(parts):
        if isinstance(node, yaml.MappingNode):
            pairs = [(k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == part]
            if not pairs:
                return line, depth
            key, node = pairs[-1]  # a repeated key: the last one wins, as when loading
            line = key.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode) and part.isdigit() and int(part) < len(node.value):
            node = node.value[int(part)]
            line = node.start_mark.line + 1
        else:
            return line, depth
    return line, len(parts)


def _stage_split(parts: list[str]) -> tuple[list[str], list[str]] | None:
    """``(["stages", "1"], rest)`` for a path inside stage 1, else None."""
    if len(parts) >= 2 and parts[0] == "stages" and parts[1].isdigit():
        return parts[:2], parts[2:]
    return None


def line_of(root: yaml.Node | None, path: str) -> int | None:
    """The line of key path ``path`` in the tree, or of its nearest existing parent (None: not even that).

    Inside a stage, a path the stage does not write but the top level does points at the top level's.
    """
    if root is None:
        return None
    parts = path.split(".")
    line, found = _walk(root, parts)
    staged = _stage_split(parts)
    if staged is not None and found < len(parts):
        top_line, top_found = _walk(root, staged[1])
        if top_found == len(staged[1]) and top_found > 0:
            return top_line
    return line if found > 0 else None


def _named_line(root: yaml.Node, message: str, prefix: str) -> int | None:
    """The line of the first key path named in ``message`` that the text holds (under ``prefix``, a
    stage, first), at least its top-level section; None if it names none."""
    bases = [prefix.split("."), []] if prefix else [[]]
    for named in _NAMED.findall(message):
        for base in bases:
            line, found = _walk(root, base + named.split("."))
            if found > len(base):  # at least the named path's first key is written there
                return line
    return None


def locate(root: yaml.Node | None, path: str | None, message: str) -> int | None:
    """The editor line of an error (see the module docstring); None when nothing places it."""
    if root is None:
        return None
    if path is None or _STAGE.match(path):
        named = _named_line(root, message, path or "")
        if named is not None:
            return named
        return line_of(root, path) if path else None
    return line_of(root, path)
