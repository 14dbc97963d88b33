"""Tools for agents: typed tool specs, Python functions and MCP servers as tools, and a toolbox that
runs a turn's calls concurrently under a timeout, turning every fault into an observation and a counter.

- :mod:`trine.tools.base`: :class:`ToolSpec`, the :class:`Tool` protocol, :class:`ToolCall`,
  :class:`ToolResult` (content + status), :func:`tool_messages`.
- :mod:`trine.tools.functions`: :func:`function_tool` (schema from type hints and docstring).
- :mod:`trine.tools.parsing`: :func:`parse_tool_calls` for the Hermes / Qwen2.5 ``<tool_call>`` format.
- :mod:`trine.tools.toolbox`: :class:`ToolBox` (``specs()`` for the chat template, ``run``, ``metrics``).
- :mod:`trine.tools.mcp_tools`: :class:`MCPServer` (config) and :class:`MCPTools` (the session; the
  ``mcp`` SDK is imported only when one is opened).
"""

from __future__ import annotations

from trine.tools.base import (
    TOOL_STATUSES,
    Tool,
    ToolCall,
    ToolError,
    ToolResult,
    ToolSpec,
    ToolStatus,
    to_text,
    tool_messages,
)
from trine.tools.functions import FunctionTool, function_tool, parse_docstring
from trine.tools.mcp_tools import MCPServer, MCPStartError, MCPTool, MCPTools
from trine.tools.parsing import format_tool_call, parse_tool_calls, strip_tool_calls
from trine.tools.toolbox import DEFAULT_MAX_CHARS, ToolBox

TOOLS: dict[str, object] = {}
"""Built-in tools by name (registry kind ``tool``: none ship built in; register Python functions with
``@trine.register("tool", "name")`` in a ``--plugin`` file, or give ``"package.module:function"``)."""

__all__ = [
    "DEFAULT_MAX_CHARS",
    "TOOLS",
    "TOOL_STATUSES",
    "FunctionTool",
    "MCPServer",
    "MCPStartError",
    "MCPTool",
    "MCPTools",
    "Tool",
    "ToolBox",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "ToolSpec",
    "ToolStatus",
    "format_tool_call",
    "function_tool",
    "parse_docstring",
    "parse_tool_calls",
    "strip_tool_calls",
    "to_text",
    "tool_messages",
]
