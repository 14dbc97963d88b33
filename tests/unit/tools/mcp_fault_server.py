"""A small MCP server with tools that misbehave, for tests/unit/tools/test_mcp_tools.py (run as a subprocess).

``echo`` answers, ``pid`` names the server's process, ``sleep`` hangs for as long as asked, ``fail``
reports an error, and ``crash`` ends the process mid-call (a server that died). ``--http PORT`` serves
streamable HTTP on 127.0.0.1 instead of stdio.
"""

from __future__ import annotations

import os
import sys

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("faulty", log_level="ERROR")


@server.tool()
def echo(text: str) -> str:
    """Return the text."""
    return text


@server.tool()
def pid() -> str:
    """The server's process id."""
    return str(os.getpid())


@server.tool()
async def sleep(seconds: float) -> str:
    """Sleep, then answer."""
    await anyio.sleep(seconds)
    return "slept"


@server.tool()
def fail(reason: str) -> str:
    """Report an error."""
    raise ToolError(reason)


@server.tool()
def crash() -> str:
    """End the server process at once."""
    os._exit(3)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
