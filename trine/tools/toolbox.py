"""The tools of a workflow, run under a timeout each, faults turned into observations and counters.

>>> box = ToolBox([function_tool(add)], timeout=5.0)
>>> tokenizer.apply_chat_template(messages, tools=box.specs(), ...)   # show the tools to the model
>>> results = await box.run_text(reply)                                 # run what the reply asked for
>>> messages += tool_messages(results)                                  # show the model what came back

The calls of one turn run concurrently (``asyncio.gather``), each bounded by ``timeout``. A call
never raises: an unknown tool, a malformed block, a tool that raises, hangs (async, or blocking in a
worker thread) or returns something that is not text becomes a :class:`~trine.tools.ToolResult`
with an error observation for the model and a status, counted in :meth:`ToolBox.metrics`. Only a
cancellation of the caller (e.g. the explorer's task timeout) propagates, after cancelling the calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Sequence
from typing import Any

from trine.blocking import CallTimeout
from trine.tools.base import Tool, ToolCall, ToolError, ToolResult, ToolSpec, ToolStatus, to_text
from trine.tools.parsing import parse_tool_calls

DEFAULT_MAX_CHARS = 4000
"""Longest tool output shown to the model; longer output is cut with a note."""

_COUNTERS = ("calls", "errors", "timeouts", "unknown", "malformed", "truncated")


class ToolBox:
    """A set of tools with one timeout per call; runs a turn's calls concurrently and counts outcomes.

    Args:
        tools: the tools (names must be unique).
        timeout: seconds one call may take before it is abandoned (status ``timeout``).
        max_chars: longest output shown to the model; the rest is cut and a note says how much.

    Counters (:meth:`metrics`): ``tools/calls`` (every result, malformed blocks included),
    ``tools/errors`` (every result that is not ``ok``), of which ``tools/timeouts``, ``tools/unknown``
    and ``tools/malformed``; ``tools/truncated`` (outputs cut); ``tools/seconds`` (summed call time).
    A toolbox is used on one event loop; share it between the workflows of one explorer freely.
    """

    def __init__(
        self, tools: Iterable[Tool] = (), *, timeout: float, max_chars: int = DEFAULT_MAX_CHARS
    ) -> None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise ValueError(f"ToolBox: timeout={timeout!r}; expected seconds > 0 (e.g. timeout=10.0).")
        if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 100:
            raise ValueError(f"ToolBox: max_chars={max_chars!r}; expected an integer >= 100.")
        self.timeout = float(timeout)
        self.max_chars = max_chars
        self._tools: dict[str, Tool] = {}
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._seconds = 0.0
        self._abandoned: set[asyncio.Task[str]] = set()
        self.extend(tools)

    # ------------------------------------------------------------------ the tools
    def extend(self, tools: Iterable[Tool]) -> None:
        """Add tools (e.g. those of an MCP server once it is open); a name already present is a ``ValueError``."""
        for tool in tools:
            if not isinstance(tool, Tool):
                raise TypeError(
                    f"ToolBox: {tool!r} is not a tool; expected an object with `spec` and `async call(arguments)` "
                    "(wrap a function with trine.tools.function_tool)."
                )
            name = tool.spec.name
            if name in self._tools:
                raise ValueError(
                    f"ToolBox: two tools are named {name!r}; rename one (function_tool(fn, name=...) or "
                    "MCPServer(prefix=...))."
                )
            self._tools[name] = tool

    def remove(self, name: str) -> Tool:
        """Take the tool called ``name`` out (e.g. a verifier the model must not call); ``KeyError`` naming
        the tools there are if there is none."""
        if name not in self._tools:
            raise KeyError(f"ToolBox: no tool {name!r}; the tools are {self.names}")
        return self._tools.pop(name)

    @property
    def names(self) -> list[str]:
        """The tools' names, in the order they were added."""
        return list(self._tools)

    def get(self, name: str) -> Tool | None:
        """The tool called ``name``, or ``None``."""
        return self._tools.get(name)

    def specs(self) -> list[dict[str, Any]]:
        """The ``tools=`` argument of ``tokenizer.apply_chat_template``: OpenAI-style function entries."""
        return [tool.spec.to_openai() for tool in self._tools.values()]

    def tool_specs(self) -> list[ToolSpec]:
        """The tools' :class:`~trine.tools.ToolSpec` s."""
        return [tool.spec for tool in self._tools.values()]

    # ------------------------------------------------------------------ running calls
    async def run(self, calls: Sequence[ToolCall], malformed: Sequence[str] = ()) -> list[ToolResult]:
        """Run ``calls`` concurrently, each under :attr:`timeout`; one result per call, in order.

        ``malformed`` (the error messages of :func:`~trine.tools.parse_tool_calls`) are answered after
        the calls, each with a ``malformed`` result whose content tells the model what was wrong.
        """
        results = list(await asyncio.gather(*(self._run_one(call) for call in calls)))
        for i, error in enumerate(malformed):
            call = ToolCall(id=f"malformed_{i}", name="", arguments={})
            results.append(self._count(ToolResult(call, f"Error: {error}", "malformed", 0.0)))
        return results

    async def run_text(self, text: str, *, id_prefix: str = "call_") -> list[ToolResult]:
        """Parse the ``<tool_call>`` blocks of a model reply and run them (empty list: no tool asked for)."""
        calls, errors = parse_tool_calls(text, id_prefix=id_prefix)
        return await self.run(calls, errors)

    async def _run_one(self, call: ToolCall) -> ToolResult:
        start = time.monotonic()
        tool = self._tools.get(call.name)
        if tool is None:
            known = ", ".join(self._tools) or "none"
            text = f"Error: there is no tool named {call.name!r}; the tools are: {known}."
            return self._count(ToolResult(call, text, "unknown_tool", 0.0))
        content, status = await self._call(tool, call)
        content, cut = _truncate(content, self.max_chars)
        self._counts["truncated"] += cut
        return self._count(ToolResult(call, content, status, time.monotonic() - start))

    async def _call(self, tool: Tool, call: ToolCall) -> tuple[str, ToolStatus]:
        """``(content, status)`` of one call; never raises except when the caller is cancelled."""
        try:
            task = asyncio.ensure_future(tool.call(dict(call.arguments)))
        except Exception as err:  # `call` raised at once, or is not async: the tool breaks the protocol
            return f"Error: tool {call.name!r} could not be called: {type(err).__name__}: {err}", "error"
        try:
            done, _ = await asyncio.wait({task}, timeout=self.timeout)
        except asyncio.CancelledError:
            self._abandon(task)
            raise
        if not done:  # cancel and move on: a tool that ignores cancellation cannot hold the turn
            self._abandon(task)
            return f"Error: tool {call.name!r} did not answer within {self.timeout:g} seconds.", "timeout"
        if task.cancelled():
            return f"Error: tool {call.name!r} was cancelled before it answered.", "error"
        error = task.exception()
        if error is None:
            try:
                return to_text(task.result()), "ok"
            except TypeError as err:
                return f"Error: tool {call.name!r} returned no text: {err}", "error"
        if isinstance(error, ToolError):
            text = str(error)
            return (text if text.lower().startswith("error") else f"Error: {text}"), "error"
        timeouts = (asyncio.TimeoutError, TimeoutError, CallTimeout)  # the tool's own timeout ran out first
        if isinstance(error, timeouts):
            return f"Error: tool {call.name!r} timed out: {error}", "timeout"
        return f"Error: tool {call.name!r} failed: {type(error).__name__}: {error}", "error"

    def _abandon(self, task: asyncio.Task[str]) -> None:
        task.cancel()
        self._abandoned.add(task)  # keep a reference until it ends; retrieve its outcome quietly
        task.add_done_callback(_forget(self._abandoned))

    def _count(self, result: ToolResult) -> ToolResult:
        self._counts["calls"] += 1
        self._seconds += result.seconds
        if result.status != "ok":
            self._counts["errors"] += 1
        key = {"timeout": "timeouts", "unknown_tool": "unknown", "malformed": "malformed"}.get(result.status)
        if key:
            self._counts[key] += 1
        return result

    # ------------------------------------------------------------------ counters
    def metrics(self, reset: bool = False) -> dict[str, float]:
        """The counters since the last reset, namespaced ``tools/...``; ``reset=True`` also zeroes them."""
        out = {f"tools/{key}": float(value) for key, value in self._counts.items()}
        out["tools/seconds"] = self._seconds
        if reset:
            self.reset_metrics()
        return out

    def reset_metrics(self) -> None:
        """Zero the counters (e.g. at the start of each explored batch)."""
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._seconds = 0.0


def _truncate(text: str, max_chars: int) -> tuple[str, bool]:
    if len(text) <= max_chars:
        return text, False
    note = f"\n[output truncated: showing {max_chars} of {len(text)} characters]"
    return text[:max_chars] + note, True


def _forget(tasks: set[asyncio.Task[str]]):
    def done(task: asyncio.Task[str]) -> None:
        tasks.discard(task)
        if not task.cancelled():
            task.exception()  # mark retrieved: an abandoned call's late error is not worth a warning

    return done


__all__ = ["DEFAULT_MAX_CHARS", "ToolBox"]
