"""Python functions as tools: the JSON schema comes from the type hints, the text from the docstring.

>>> def add(a: int, b: int = 0) -> int:
...     '''Add two integers.
...
...     Args:
...         a: the first addend.
...         b: the second addend.
...     '''
...     return a + b
>>> function_tool(add).spec.parameters["required"]
['a']

Supported parameter types: ``str``, ``int``, ``float``, ``bool``, ``list[X]``, ``dict`` /
``dict[str, X]``, ``Literal[...]``, unions of these (``X | Y``), and ``Optional[X]`` / ``X | None``.
A parameter is required unless it has a default or may be ``None``. Any other type (or a missing
hint, ``*args``, ``**kwargs``) is a ``TypeError`` naming the parameter.

Blocking functions run in the current :class:`~trine.blocking.BlockingPool` (worker threads that a
timeout abandons, so a stuck function never blocks the event loop); ``async def`` functions are
awaited on the caller's loop.
"""

from __future__ import annotations

import functools
import inspect
import re
import types
import typing
from collections.abc import Callable
from typing import Any, Literal, Union

from trine.blocking import run_blocking
from trine.tools.base import ToolError, ToolSpec, to_text

_PRIMITIVES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Returns?|Yields?|Raises|Examples?|Notes?|Attributes):\s*$"
)
_ARG = re.compile(r"^(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


class FunctionTool:
    """A :class:`~trine.tools.Tool` that calls a Python function (built by :func:`function_tool`)."""

    def __init__(
        self, fn: Callable[..., Any], spec: ToolSpec, nullable: frozenset[str], optional_none: frozenset[str]
    ) -> None:
        self.fn = fn
        self.spec = spec
        self.is_async = _is_async(fn)
        self._nullable = nullable  # parameters that may be None
        self._optional_none = optional_none  # ... and have no default: passed None when absent

    async def call(self, arguments: dict[str, Any]) -> str:
        """Check the arguments against the schema, call the function, return its result as text."""
        kwargs = self._bind(arguments)
        if self.is_async:
            result = await self.fn(**kwargs)
        else:
            result = await run_blocking(functools.partial(self.fn, **kwargs))
        if inspect.isawaitable(result):
            result = await result
        return to_text(result)

    def _bind(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The keyword arguments for the function; a :class:`ToolError` the model can act on if they don't fit."""
        props: dict[str, Any] = self.spec.parameters["properties"]
        unknown = sorted(set(arguments) - set(props))
        if unknown:
            raise ToolError(
                f"{self.spec.name}: unexpected argument(s) {', '.join(map(repr, unknown))}; "
                f"its arguments are {', '.join(map(repr, props)) or 'none'}."
            )
        missing = [n for n in self.spec.parameters.get("required", []) if n not in arguments]
        if missing:
            raise ToolError(
                f"{self.spec.name}: missing required argument(s) {', '.join(map(repr, missing))}."
            )
        for key, value in arguments.items():
            if not (value is None and key in self._nullable) and not _matches(value, props[key]):
                raise ToolError(
                    f"{self.spec.name}: argument {key!r}={value!r} does not match its schema {props[key]}."
                )
        return {**{name: None for name in self._optional_none}, **arguments}


def function_tool(
    fn: Callable[..., Any], *, name: str | None = None, description: str | None = None
) -> FunctionTool:
    """Make a :class:`~trine.tools.Tool` of ``fn``: schema from its type hints, text from its docstring.

    Args:
        fn: a function (plain or ``async def``) whose parameters all have supported type hints.
        name: the tool's name; defaults to ``fn.__name__``.
        description: what the tool does; defaults to the docstring's summary (text before ``Args:``).

    Raises:
        TypeError: a parameter has no hint or a type JSON schema cannot express here, or is ``*args`` /
            ``**kwargs``; the message names the parameter.
    """
    if not callable(fn):
        raise TypeError(f"function_tool: {fn!r} is not callable; pass a function.")
    label = getattr(fn, "__qualname__", None) or type(fn).__name__
    summary, arg_docs = parse_docstring(inspect.getdoc(fn) or "")
    hints = _hints(fn, label)
    properties: dict[str, Any] = {}
    required: list[str] = []
    nullable: set[str] = set()
    optional_none: set[str] = set()
    for param in inspect.signature(fn).parameters.values():
        where = f"parameter {param.name!r} of {label}"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"function_tool: {where} is *args/**kwargs; a tool takes named parameters only.")
        if param.name not in hints:
            raise TypeError(
                f"function_tool: {where} has no type hint; annotate it (e.g. `{param.name}: str`)."
            )
        schema, may_be_none = _schema(hints[param.name], where)
        if param.name in arg_docs:
            schema = {**schema, "description": arg_docs[param.name]}
        properties[param.name] = schema
        if may_be_none or param.default is None:
            nullable.add(param.name)
        if param.default is param.empty and not may_be_none:
            required.append(param.name)
        elif param.default is param.empty:
            optional_none.add(param.name)
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    desc = summary if description is None else description
    spec = ToolSpec(name=name or getattr(fn, "__name__", label), description=desc, parameters=parameters)
    return FunctionTool(fn, spec, frozenset(nullable), frozenset(optional_none))


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """``(summary, {parameter: description})`` from a Google-style docstring.

    The summary is the text before the first section header (``Args:``, ``Returns:``, ...), joined into
    one line per paragraph. Each ``name: text`` or ``name (type): text`` entry of ``Args:`` gives a
    description; more-indented lines continue it.
    """
    summary: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for raw in doc.splitlines():
        line = raw.strip()
        header = _SECTION.match(raw)
        if header:
            section, current = header.group(1), None
            continue
        if section is None:
            summary.append(line)
        elif section in ("Args", "Arguments", "Parameters") and line:
            entry = _ARG.match(line)
            if entry and not raw.startswith(" " * 8) and not raw.startswith("\t\t"):
                current = entry.group(1).lstrip("*")
                args[current] = entry.group(3).strip()
            elif current is not None:
                args[current] = f"{args[current]} {line}".strip()
    text = "\n".join(" ".join(p.split()) for p in "\n".join(summary).split("\n\n") if p.strip())
    return text, args


def _hints(fn: Callable[..., Any], label: str) -> dict[str, Any]:
    inner = fn.func if isinstance(fn, functools.partial) else fn
    target = inner if inspect.isfunction(inner) or inspect.ismethod(inner) else type(inner).__call__
    try:
        return typing.get_type_hints(target)
    except Exception as err:  # noqa: BLE001 - enriched and re-raised
        raise TypeError(f"function_tool: the type hints of {label} cannot be resolved: {err}") from err


def _schema(tp: Any, where: str, top: bool = True) -> tuple[dict[str, Any], bool]:
    """``(JSON schema, may be None)`` of a type hint; ``TypeError`` naming ``where`` if unsupported.

    A top-level ``Optional`` only makes the parameter optional; a nested one adds ``{"type": "null"}``.
    """
    origin = typing.get_origin(tp)
    if origin is Union or origin is types.UnionType:
        members = [m for m in typing.get_args(tp) if m is not type(None)]
        nullable = len(members) < len(typing.get_args(tp))
        schemas = [_schema(m, where, top=False)[0] for m in members]
        if nullable and not top:
            schemas.append({"type": "null"})
        return (schemas[0] if len(schemas) == 1 else {"anyOf": schemas}), nullable
    if tp in _PRIMITIVES:
        return {"type": _PRIMITIVES[tp]}, False
    args = typing.get_args(tp)
    if tp is list or origin is list:
        return (
            {"type": "array", "items": _schema(args[0], where, False)[0]} if args else {"type": "array"}
        ), False
    if tp is dict or origin is dict:
        if args and args[0] is not str:
            raise TypeError(
                f"function_tool: {where} is {tp!r}; JSON object keys are strings: use dict[str, ...]."
            )
        inner = {"additionalProperties": _schema(args[1], where, False)[0]} if args else {}
        return {"type": "object", **inner}, False
    if origin is Literal:
        kinds = {_PRIMITIVES.get(type(v)) for v in args}
        if None in kinds or len(kinds) != 1:
            raise TypeError(
                f"function_tool: {where} is {tp!r}; Literal values must be all str, all int, all float or all bool."
            )
        return {"type": kinds.pop(), "enum": list(args)}, False
    raise TypeError(
        f"function_tool: {where} has type {tp!r}, which a tool schema cannot express; use str, int, float, "
        "bool, list[...], dict[str, ...], Literal[...] or an Optional of these."
    )


def _matches(value: Any, schema: dict[str, Any]) -> bool:
    """Whether a JSON value fits a schema made by :func:`_schema` (types and enums, recursively)."""
    if "anyOf" in schema:
        return any(_matches(value, s) for s in schema["anyOf"])
    if "enum" in schema and value not in schema["enum"]:
        return False
    kind = schema.get("type")
    checks: dict[str, Callable[[Any], bool]] = {
        "null": lambda v: v is None,
        "string": lambda v: isinstance(v, str),
        "boolean": lambda v: isinstance(v, bool),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "array": lambda v: isinstance(v, list) and all(_matches(x, schema.get("items", {})) for x in v),
        "object": lambda v: (
            isinstance(v, dict)
            and all(_matches(x, schema.get("additionalProperties", {})) for x in v.values())
        ),
    }
    return checks[kind](value) if kind in checks else True


def _is_async(fn: Callable[..., Any]) -> bool:
    inner = fn.func if isinstance(fn, functools.partial) else fn
    return inspect.iscoroutinefunction(inner) or inspect.iscoroutinefunction(type(inner).__call__)


__all__ = ["FunctionTool", "function_tool", "parse_docstring"]
