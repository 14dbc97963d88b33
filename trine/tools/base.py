"""The nouns of tool use: what a tool is, what the model asked for, and what came back.

A :class:`Tool` is anything with a :class:`ToolSpec` (name, description, JSON-schema parameters)
and an ``async call(arguments) -> str``. Python functions become tools with
:func:`trine.tools.function_tool`, the tools of an MCP server with :class:`trine.tools.MCPTools`.
The model asks for tools with :class:`ToolCall` s (parsed from its text by
:func:`trine.tools.parse_tool_calls`); a :class:`trine.tools.ToolBox` runs them and answers each
with a :class:`ToolResult`, whose ``content`` is what the model reads next (the tool's output, or
an error observation) and whose ``status`` is what the workflow counts.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

ToolStatus = Literal["ok", "error", "timeout", "unknown_tool", "malformed"]
"""How a call ended: ``ok``; ``error`` (the tool raised or reported an error, or its server is gone);
``timeout`` (no answer within the toolbox's timeout); ``unknown_tool`` (no tool of that name);
``malformed`` (the model's ``<tool_call>`` block could not be parsed)."""

TOOL_STATUSES: tuple[ToolStatus, ...] = ("ok", "error", "timeout", "unknown_tool", "malformed")

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class ToolError(Exception):
    """Raised by a tool to tell the model what went wrong: the message is shown as is, no traceback.

    Any other exception a tool raises is shown as ``<ExceptionType>: <message>``.
    """


@dataclass(frozen=True)
class ToolSpec:
    """What the model is told about a tool (the OpenAI / Hermes function-calling schema)."""

    name: str
    """The name the model writes in ``{"name": ...}``: 1-64 letters, digits, ``_``, ``-`` or ``.``."""
    description: str
    """One or a few sentences: what the tool does and when to use it."""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})
    """JSON schema of the arguments: an ``object`` with ``properties`` (and ``required``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(
                f"ToolSpec: name={self.name!r}; expected 1-64 characters from letters, digits, '_', '-' "
                "and '.', the names function-calling chat templates accept. Rename the tool."
            )
        if not isinstance(self.parameters, dict) or self.parameters.get("type") != "object":
            raise ValueError(
                f"ToolSpec {self.name!r}: parameters={self.parameters!r}; expected a JSON schema of type "
                "'object', e.g. {'type': 'object', 'properties': {'x': {'type': 'number'}}}."
            )

    def to_openai(self) -> dict[str, Any]:
        """``{"type": "function", "function": {name, description, parameters}}``: one entry of ``tools=``."""
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": function}


@runtime_checkable
class Tool(Protocol):
    """A tool: its spec, and an async call that returns the text the model reads.

    ``call`` raises to report a failure (:class:`ToolError` for a message meant for the model); the
    :class:`~trine.tools.ToolBox` turns any exception, a hang past its timeout, or a non-text
    return into an observation and a status, so a tool need not guard against its own faults.
    A tool that blocks must not block the event loop: run blocking work with
    :func:`trine.blocking.run_blocking` (what :func:`~trine.tools.function_tool` does).
    """

    @property
    def spec(self) -> ToolSpec:
        """Name, description and parameter schema shown to the model."""
        ...

    async def call(self, arguments: dict[str, Any]) -> str:
        """Run the tool with the model's arguments; return its output as text."""
        ...


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for."""

    id: str
    """Identifies the call within its turn (``call_0``, ``call_1``, ... in the order written)."""
    name: str
    """The tool's name as the model wrote it (it may name no tool)."""
    arguments: dict[str, Any] = field(default_factory=dict)
    """The arguments as the model wrote them (a JSON object), not yet checked against the schema."""


@dataclass(frozen=True)
class ToolResult:
    """What one call produced: the text shown to the model and how the call ended."""

    call: ToolCall
    """The call answered (for a malformed block: name ``""`` and no arguments)."""
    content: str
    """The tool's output, or the error observation the model reads instead."""
    status: ToolStatus
    """How the call ended (see :data:`ToolStatus`)."""
    seconds: float = 0.0
    """Wall-clock seconds the call took."""

    @property
    def ok(self) -> bool:
        """Whether the tool answered normally."""
        return self.status == "ok"

    def message(self) -> dict[str, str]:
        """The ``{"role": "tool", ...}`` chat message that shows this result to the model."""
        return {"role": "tool", "name": self.call.name, "tool_call_id": self.call.id, "content": self.content}


def tool_messages(results: list[ToolResult]) -> list[dict[str, str]]:
    """The ``tool`` messages for a turn's results, in order, as a chat template renders them."""
    return [result.message() for result in results]


def to_text(value: Any) -> str:
    """A tool's return value as text: strings as they are, numbers and JSON-able values as JSON, else ``str``.

    Integral floats are written without ``.0`` (``3.0`` -> ``3``), so arithmetic results read as plain
    numbers. Raises ``TypeError`` when the value cannot be written at all (its ``__str__`` raises).
    """
    if isinstance(value, str):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=True)
    except (TypeError, ValueError):
        pass
    try:
        return str(value)
    except Exception as err:  # noqa: BLE001 - enriched and re-raised
        raise TypeError(
            f"a tool returned a {type(value).__name__} that cannot be written as text: {err}"
        ) from err


__all__ = [
    "TOOL_STATUSES",
    "Tool",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "ToolSpec",
    "ToolStatus",
    "to_text",
    "tool_messages",
]
