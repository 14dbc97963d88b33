"""The tools of an MCP server, through the official ``mcp`` SDK (``pip install -e ".[agents]"``).

>>> server = MCPServer(command=[sys.executable, "examples/mcp_calculator/server.py"])   # stdio
>>> async with MCPTools(server) as mcp:
...     box = ToolBox(mcp.tools, timeout=10.0)
...     results = await box.run_text(reply)

An :class:`MCPServer` says how to reach a server: a ``command`` Trine starts and talks to over
stdio; a ``command`` that serves streamable HTTP plus the ``url`` to reach it (Trine starts it and
waits until it listens); or only a ``url`` of a server someone else runs. :class:`MCPTools` opens the
client session, lists the server's tools as :class:`~trine.tools.Tool` s (schemas from the server) and
calls them with a timeout. A server that died answers every call with an error at once; one that
hangs is bounded by the timeout; :meth:`MCPTools.aclose` always stops what Trine started.

**One event loop.** The SDK's session is bound to the asyncio loop that opened it: open and use an
:class:`MCPTools` on one loop (the explorer's) and close it there. :meth:`MCPTools.open` is idempotent
and safe to call concurrently, so workflows may open it lazily on first use; a call on another loop
is a ``RuntimeError``. The session lives in a background task of that loop, so it may be opened in
one task, used by many and closed by another.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from trine.tools.base import ToolError, ToolSpec

CLOSE_TIMEOUT = 10.0
"""Seconds :meth:`MCPTools.aclose` waits for the session to end before cancelling it (the SDK itself
closes a stdio server's stdin, waits 2 s, then terminates and kills its process group)."""
KILL_GRACE = 3.0
"""Seconds a streamable-HTTP server Trine started gets after SIGTERM before SIGKILL."""

_BAD_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.-]")


class MCPStartError(RuntimeError):
    """An MCP server could not be started, reached, or listed within its ``start_timeout``."""


@dataclass(frozen=True)
class MCPServer:
    """How to reach one MCP server (a config record; :class:`MCPTools` does the work).

    Exactly as in the three cases: ``command`` alone (stdio), ``command`` + ``url`` (Trine starts a
    streamable-HTTP server and connects to ``url``), ``url`` alone (a server run by someone else).
    """

    command: Sequence[str] = ()
    """Program and arguments that start the server, e.g. ``["python", "server.py"]``."""
    url: str | None = None
    """Streamable-HTTP endpoint, e.g. ``http://127.0.0.1:8765/mcp``; ``None`` for stdio."""
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment variables for a started server. A stdio server gets only these over the SDK's
    safe default set (``HOME``, ``PATH``, ...); an HTTP server started by Trine inherits Trine's
    environment plus these."""
    cwd: str | None = None
    """Working directory of a started server (default: Trine's)."""
    name: str = ""
    """Label used in messages and logs (default: the command or the URL)."""
    prefix: str = ""
    """Prepended to every tool name, to keep the tools of several servers apart (e.g. ``"calc_"``)."""
    start_timeout: float = 30.0
    """Seconds to start, connect and list the tools before :class:`MCPStartError`."""
    call_timeout: float = 60.0
    """Upper bound of one call made outside a :class:`~trine.tools.ToolBox` (which applies its own)."""

    def __post_init__(self) -> None:
        command = (self.command,) if isinstance(self.command, str) else tuple(self.command)
        object.__setattr__(self, "command", command)
        if not command and not self.url:
            raise ValueError(
                "MCPServer: neither command nor url given; pass command=[...] to start a stdio server, "
                "command=[...] plus url=... for a streamable-HTTP server Trine starts, or url=... alone."
            )
        if not all(isinstance(part, str) and part for part in command):
            raise ValueError(
                f"MCPServer: command={list(command)!r}; expected non-empty strings, e.g. ['python', 'server.py']."
            )
        if self.url is not None and urlsplit(self.url).scheme not in ("http", "https"):
            raise ValueError(
                f"MCPServer: url={self.url!r}; expected an http:// or https:// URL, e.g. http://127.0.0.1:8765/mcp."
            )
        for key in ("start_timeout", "call_timeout"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"MCPServer: {key}={value!r}; expected seconds > 0.")

    @property
    def transport(self) -> str:
        """``"stdio"`` or ``"http"``."""
        return "http" if self.url else "stdio"

    @property
    def label(self) -> str:
        """The name used in messages."""
        return self.name or (" ".join(self.command) if not self.url else self.url)


@dataclass(frozen=True)
class MCPTool:
    """One tool of an MCP server, as a :class:`~trine.tools.Tool`."""

    spec: ToolSpec
    remote_name: str
    """The tool's name on the server (``spec.name`` may carry the server's prefix)."""
    owner: MCPTools = field(repr=False, compare=False)

    async def call(self, arguments: dict[str, Any]) -> str:
        """Call the tool on its server; :class:`~trine.tools.ToolError` with the server's message on error."""
        return await self.owner.call_tool(self.remote_name, arguments)


class MCPTools:
    """A client session with one MCP server, opened and closed by Trine; its tools as Trine tools.

    Use as ``async with MCPTools(server) as mcp: ...`` or ``await mcp.open()`` ... ``await mcp.aclose()``,
    all on one event loop (see the module docstring).
    """

    def __init__(self, server: MCPServer) -> None:
        if not isinstance(server, MCPServer):
            raise TypeError(f"MCPTools: server={server!r}; expected a trine.tools.MCPServer.")
        self.server = server
        self._reset()

    def _reset(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._owner: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None
        self._stop: asyncio.Event | None = None
        self._client: Any = None  # mcp.Client once listed, None before and after
        self._process: asyncio.subprocess.Process | None = None
        self._tools: list[MCPTool] = []
        self._ended: str | None = None  # why the session ended, once it has

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> list[MCPTool]:
        """Start/connect and list the tools (idempotent; concurrent callers share one start)."""
        loop = self._check_loop()
        if self._owner is None:
            _require_mcp()
            self._loop, self._stop, self._ready = loop, asyncio.Event(), loop.create_future()
            self._owner = loop.create_task(self._serve(), name=f"mcp-session {self.server.label}")
        assert self._ready is not None
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), self.server.start_timeout)
        except asyncio.TimeoutError:  # noqa: UP041 - not the builtin before Python 3.11
            await self.aclose()
            raise MCPStartError(
                f"MCP server {self.server.label!r} did not start and list its tools within "
                f"{self.server.start_timeout:g}s; check that the command runs on its own, or raise start_timeout."
            ) from None
        except MCPStartError:
            await self.aclose()
            raise
        return list(self._tools)

    async def aclose(self) -> None:
        """End the session and stop the server Trine started (idempotent; bounded in time)."""
        owner = self._owner
        if owner is None:
            return
        self._check_loop()
        if self._stop is not None:
            self._stop.set()
        if not owner.done() and self._client is None:
            owner.cancel()  # still starting (or waiting for a port): nothing to end gracefully
        if not owner.done():
            await asyncio.wait({owner}, timeout=CLOSE_TIMEOUT)
        if not owner.done():
            owner.cancel()
            await asyncio.wait({owner}, timeout=CLOSE_TIMEOUT)
        await self._stop_process()
        if self._ready is not None and self._ready.done() and not self._ready.cancelled():
            self._ready.exception()  # retrieved: open() reported it already (or nobody was waiting)
        self._reset()

    async def __aenter__(self) -> MCPTools:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def tools(self) -> list[MCPTool]:
        """The server's tools (after :meth:`open`)."""
        if self._owner is None:
            raise RuntimeError(f"MCPTools({self.server.label!r}) is not open; `await tools.open()` first.")
        return list(self._tools)

    @property
    def alive(self) -> bool:
        """Whether the session is open and has not ended."""
        return self._client is not None and self._ended is None and not self._process_exited()

    # ------------------------------------------------------------------ calls
    async def call_tool(self, name: str, arguments: dict[str, Any], timeout: float | None = None) -> str:
        """Call ``name`` on the server and return its text; :class:`~trine.tools.ToolError` on any failure.

        Bounded by ``timeout`` (default ``server.call_timeout``): past it, ``TimeoutError``. Opens the
        session first if needed.
        """
        await self.open()
        client = self._client
        label = self.server.label
        if client is None or self._ended is not None or self._process_exited():
            raise ToolError(f"MCP server {label!r} is not running ({self._ended or 'its process exited'}).")
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED

        try:
            result = await asyncio.wait_for(
                client.call_tool(name, arguments), timeout or self.server.call_timeout
            )
        except asyncio.TimeoutError:  # noqa: UP041
            raise
        except MCPError as err:
            if err.code == CONNECTION_CLOSED:  # the session is over: later calls fail at once
                self._ended = "the server closed the connection; did its process exit?"
                raise ToolError(f"MCP server {label!r} is not running ({self._ended}).") from None
            raise ToolError(f"MCP server {label!r}: {err}") from None
        except Exception as err:  # transport failures (a dead HTTP server, a closed pipe)
            raise ToolError(
                f"MCP server {label!r} could not be reached: {type(err).__name__}: {err}"
            ) from None
        text = _content_text(result)
        if result.is_error:
            raise ToolError(text or f"tool {name!r} of MCP server {label!r} reported an error")
        return text

    # ------------------------------------------------------------------ internals
    async def _serve(self) -> None:
        """The session's task: connect, list, then wait for :meth:`aclose`; records why it ended."""
        from mcp import Client

        me, ready, stop = asyncio.current_task(), self._ready, self._stop
        assert ready is not None and stop is not None
        try:
            async with contextlib.AsyncExitStack() as stack:
                target = await self._target(stack)
                client = await stack.enter_async_context(Client(target))
                self._tools = await self._list(client)
                self._client = client
                ready.set_result(None)
                await stop.wait()
        except BaseException as err:  # recorded for open() and later calls; cancellation re-raised
            if not ready.done():
                message = f"MCP server {self.server.label!r} could not be started or listed: {_describe(err)}"
                ready.set_exception(MCPStartError(message))
            if self._owner is me:
                self._ended = _describe(err)
            if isinstance(err, asyncio.CancelledError):
                raise
        finally:
            if self._owner is me:  # not if aclose() gave up on this task and a new session started
                self._client = None
                self._ended = self._ended or "closed"

    async def _target(self, stack: contextlib.AsyncExitStack) -> Any:
        """What ``mcp.Client`` connects to: stdio parameters, or the URL (after starting its server)."""
        server = self.server
        if server.transport == "stdio":
            from mcp import StdioServerParameters

            return StdioServerParameters(
                command=server.command[0],
                args=list(server.command[1:]),
                env=dict(server.env) or None,
                cwd=server.cwd,
            )
        assert server.url is not None
        if server.command:
            self._process = await asyncio.create_subprocess_exec(
                *server.command,
                env={**os.environ, **server.env},
                cwd=server.cwd,
                stdin=asyncio.subprocess.DEVNULL,
                start_new_session=True,  # its own process group: stopped as a whole
            )
            stack.push_async_callback(self._stop_process)
        await _wait_until_listening(server.url, self._process, server.label)
        return server.url

    async def _list(self, client: Any) -> list[MCPTool]:
        tools, cursor = [], None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                break
        out = []
        for tool in tools:
            name = _BAD_NAME_CHARS.sub("_", f"{self.server.prefix}{tool.name}")[:64]
            description = tool.description or getattr(tool, "title", None) or ""
            spec = ToolSpec(
                name=name, description=description, parameters=_clean_schema(dict(tool.input_schema))
            )
            out.append(MCPTool(spec=spec, remote_name=tool.name, owner=self))
        return out

    async def _stop_process(self) -> None:
        """SIGTERM the started HTTP server's process group, SIGKILL after :data:`KILL_GRACE`; reap it."""
        process = self._process
        if process is None or process.returncode is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(process.wait(), KILL_GRACE)
                return

    def _process_exited(self) -> bool:
        return self._process is not None and self._process.returncode is not None

    def _check_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not loop:
            if not self._loop.is_closed():
                raise RuntimeError(
                    f"MCPTools({self.server.label!r}) was opened on another event loop; the MCP session is "
                    "bound to that loop: open, use and close it on one loop (the explorer's)."
                )
            self._reset()  # its loop is gone (and the session with it): start afresh on this one
        return loop


def _require_mcp() -> None:
    try:
        import mcp  # noqa: F401
    except ImportError as err:
        raise ImportError(
            'MCP tools need the `mcp` package (>= 2.3): pip install -e ".[agents]" (or pip install "mcp>=2.3").'
        ) from err


async def _wait_until_listening(url: str, process: asyncio.subprocess.Process | None, label: str) -> None:
    """Return once ``url``'s host:port accepts connections; ``MCPStartError`` if the process exits first.

    The caller bounds the wait (``start_timeout``), so a server that is started by someone else a
    moment later is still found.
    """
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    while True:
        if process is not None and process.returncode is not None:
            raise MCPStartError(
                f"MCP server {label!r} exited with code {process.returncode} before listening on {host}:{port}; "
                "run its command by hand to see why."
            )
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 1.0)
        except (OSError, asyncio.TimeoutError):
            await asyncio.sleep(0.05)
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return


def _content_text(result: Any) -> str:
    """The text of a ``CallToolResult``: its text blocks joined; other blocks named; else structured JSON."""
    parts = []
    for block in result.content or ():
        text = getattr(block, "text", None)
        resource = getattr(block, "resource", None)
        if text is None and resource is not None:
            text = getattr(resource, "text", None)
        parts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', 'unknown')} content]")
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)


def _clean_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """The server's input schema without pydantic's ``title`` noise (shorter prompts); ``type: object`` ensured."""

    def clean(node: Any) -> Any:
        if not isinstance(node, dict):
            return node
        out = {k: v for k, v in node.items() if k != "title"}
        if isinstance(out.get("properties"), dict):
            out["properties"] = {k: clean(v) for k, v in out["properties"].items()}
        for key in ("items", "additionalProperties"):
            if isinstance(out.get(key), dict):
                out[key] = clean(out[key])
        for key in ("anyOf", "oneOf", "allOf"):
            if isinstance(out.get(key), list):
                out[key] = [clean(v) for v in out[key]]
        for key in ("$defs", "definitions"):
            if isinstance(out.get(key), dict):
                out[key] = {k: clean(v) for k, v in out[key].items()}
        return out

    cleaned = clean(schema)
    cleaned.setdefault("type", "object")
    cleaned.setdefault("properties", {})
    return cleaned


def _describe(err: BaseException) -> str:
    """``Type: message`` of an error, the leaves of an exception group (anyio task groups) joined."""
    inner = getattr(err, "exceptions", None)  # BaseExceptionGroup (Python >= 3.11, or the backport)
    if isinstance(inner, (list, tuple)) and inner:
        return "; ".join(_describe(e) for e in inner)
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


__all__ = ["CLOSE_TIMEOUT", "MCPServer", "MCPStartError", "MCPTool", "MCPTools"]
