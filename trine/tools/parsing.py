"""Tool calls in model output, in the Hermes / Qwen2.5 format the chat templates render.

A reply asks for tools with one or more blocks::

    <tool_call>
    {"name": "add", "arguments": {"a": 1, "b": 2}}
    </tool_call>

:func:`parse_tool_calls` returns the well-formed calls and one error message per malformed block
(invalid JSON, no ``name``, ``arguments`` not an object, a tag never closed), so the workflow can
answer each with an observation instead of failing. ``arguments`` may also be a JSON string holding
an object (as some models and the OpenAI API write it); ``parameters`` is accepted for ``arguments``.
"""

from __future__ import annotations

import json
from typing import Any

from trine.tools.base import ToolCall

OPEN = "<tool_call>"
CLOSE = "</tool_call>"
_SNIPPET = 120


def parse_tool_calls(text: str, *, id_prefix: str = "call_") -> tuple[list[ToolCall], list[str]]:
    """``(calls, errors)``: the well-formed ``<tool_call>`` blocks of ``text`` and a message per bad one.

    Calls get ids ``f"{id_prefix}{i}"``, ``i`` counting every block (good or bad) in order, so ids stay
    stable when one block in the middle is malformed. Text outside the blocks is ignored.
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    for index, (body, closed) in enumerate(_blocks(text)):
        if not closed:
            errors.append(f"a {OPEN} tag is never closed with {CLOSE}: {_snippet(body)}")
            continue
        call_or_error = _parse_block(body, f"{id_prefix}{index}")
        if isinstance(call_or_error, ToolCall):
            calls.append(call_or_error)
        else:
            errors.append(call_or_error)
    return calls, errors


def strip_tool_calls(text: str) -> str:
    """``text`` without its ``<tool_call>`` blocks (closed or not), trimmed: the reply's prose."""
    out: list[str] = []
    pos = 0
    while (start := text.find(OPEN, pos)) != -1:
        out.append(text[pos:start])
        end = text.find(CLOSE, start + len(OPEN))
        if end == -1:
            pos = len(text)
            break
        pos = end + len(CLOSE)
    out.append(text[pos:])
    return "".join(out).strip()


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The block a model writes to call ``name`` (used to build demonstrations and tests)."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{OPEN}\n{body}\n{CLOSE}"


def _blocks(text: str) -> list[tuple[str, bool]]:
    """``(body, closed)`` per ``<tool_call>`` opening; a block opened again before its close is unclosed."""
    found: list[tuple[str, bool]] = []
    pos = 0
    while (start := text.find(OPEN, pos)) != -1:
        body_start = start + len(OPEN)
        end = text.find(CLOSE, body_start)
        reopen = text.find(OPEN, body_start)
        if end == -1 or (reopen != -1 and reopen < end):
            stop = len(text) if reopen == -1 else reopen
            found.append((text[body_start:stop], False))
            pos = stop
            continue
        found.append((text[body_start:end], True))
        pos = end + len(CLOSE)
    return found


def _parse_block(body: str, call_id: str) -> ToolCall | str:
    """A :class:`ToolCall`, or the error message that tells the model how to fix the block."""
    example = 'write {"name": "<tool>", "arguments": {...}}'
    try:
        data = json.loads(body)
    except json.JSONDecodeError as err:
        return (
            f"the tool call is not valid JSON ({err.msg} at character {err.pos}): {_snippet(body)}; {example}"
        )
    if not isinstance(data, dict):
        return f"the tool call is a JSON {type(data).__name__}, not an object: {_snippet(body)}; {example}"
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        return f'the tool call has no "name" string: {_snippet(body)}; {example}'
    arguments: Any = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as err:
            return f"the arguments of {name!r} are a string that is not valid JSON ({err.msg}); {example}"
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return (
            f"the arguments of {name!r} are a JSON {type(arguments).__name__}, not an object of named "
            f"arguments: {_snippet(body)}; {example}"
        )
    return ToolCall(id=call_id, name=name.strip(), arguments=arguments)


def _snippet(body: str) -> str:
    body = body.strip()
    return repr(body if len(body) <= _SNIPPET else body[:_SNIPPET] + "...")


__all__ = ["CLOSE", "OPEN", "format_tool_call", "parse_tool_calls", "strip_tool_calls"]
