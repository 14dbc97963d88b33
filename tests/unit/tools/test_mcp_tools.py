"""MCP tools over real transports: the example calculator server (``examples/mcp_calculator``) and a
server with misbehaving tools (``mcp_fault_server.py``), each a real subprocess, over stdio and
streamable HTTP. A hanging tool times out, a server that died answers with errors at once, and
closing leaves no child process behind."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="MCP tools need the `mcp` package: pip install 'trine[agents]'")

from trine.tools import MCPServer, MCPStartError, MCPTools, ToolBox, ToolCall  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
CALCULATOR = ROOT / "examples" / "mcp_calculator" / "server.py"
FAULTY = Path(__file__).with_name("mcp_fault_server.py")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _children() -> dict[int, str]:
    """Live (not zombie) child processes of this process: pid -> command line."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            found[int(stat.parent.name)] = cmdline
    return found


def _servers() -> dict[int, str]:
    return {pid: cmd for pid, cmd in _children().items() if "server.py" in cmd}


@pytest.fixture(scope="module")
def loop():
    """One event loop for the module: an MCP session is bound to the loop that opened it."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def calculator(loop):
    """The example calculator over stdio, shared by the module's tests."""
    tools = MCPTools(MCPServer(command=[sys.executable, str(CALCULATOR)], name="calculator"))
    loop.run_until_complete(tools.open())
    yield tools
    loop.run_until_complete(tools.aclose())


def test_calculator_over_stdio_lists_schemas_and_computes_exactly(loop, calculator):
    specs = {tool.spec.name: tool.spec for tool in calculator.tools}
    assert sorted(specs) == ["add", "calculate", "check", "multiply"]
    assert specs["add"].parameters["required"] == ["a", "b"]
    assert specs["calculate"].parameters["properties"]["expression"] == {"type": "string"}
    box = ToolBox(calculator.tools, timeout=5)
    calls = [
        ToolCall("0", "multiply", {"a": 48213, "b": 90277}),
        ToolCall("1", "add", {"a": 123456789012, "b": 987654321098}),
        ToolCall("2", "calculate", {"expression": "(12 + 7) * 3 / 2 - 2 ** 10 // 5 % 7"}),
        ToolCall("3", "calculate", {"expression": "__import__('os').getpid()"}),
        ToolCall("4", "calculate", {"expression": "1 / (3 - 3)"}),
        ToolCall("5", "calculate", {"expression": "9 ** 9 ** 9"}),
        ToolCall("6", "multiply", {"a": "many", "b": 2}),
    ]
    results = loop.run_until_complete(box.run(calls))
    assert [r.content for r in results[:3]] == [
        str(48213 * 90277),
        "1111111110110",
        "27.5",
    ]  # 28.5 - (1024 // 5) % 7
    assert [r.status for r in results] == ["ok"] * 3 + ["error"] * 4
    assert "is not allowed: use numbers" in results[3].content
    assert "division by zero" in results[4].content
    assert "too large" in results[5].content
    assert "validation error" in results[6].content


def test_calculator_evaluates_only_arithmetic():
    spec = importlib.util.spec_from_file_location("mcp_calculator_server", CALCULATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.evaluate("-(2 + 3) * 4 // 3") == -7
    assert module.format_number(module.evaluate("10 / 4")) == "2.5"
    assert module.format_number(module.evaluate("6 / 3")) == "2"
    for bad in ("x + 1", "open('f')", "(1).real", "'a' * 3", "[1, 2]", "1 if 1 else 2", "2 < 3", "True + 1"):
        with pytest.raises(module.ToolError, match="not allowed"):
            module.evaluate(bad)
    start = time.monotonic()
    with pytest.raises(module.ToolError, match="too large|more than"):
        module.evaluate("99999 ** 99999")
    with pytest.raises(module.ToolError, match="more than"):
        module.evaluate("(10 ** 999) * (10 ** 999)")
    assert time.monotonic() - start < 0.5


def test_calculator_over_streamable_http_started_and_stopped_by_trine(loop):
    port = _free_port()
    server = MCPServer(
        command=[sys.executable, str(CALCULATOR), "--http", str(port)], url=f"http://127.0.0.1:{port}/mcp"
    )
    before = set(_servers())

    async def session():
        async with MCPTools(server) as tools:
            started = {pid: cmd for pid, cmd in _servers().items() if pid not in before}
            box = ToolBox(tools.tools, timeout=5)
            [result] = await box.run_text(
                '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 40}}</tool_call>'
            )
            return started, result

    started, result = loop.run_until_complete(session())
    assert (result.status, result.content) == ("ok", "42")
    [(pid, cmd)] = started.items()
    assert f"--http {port}" in cmd
    assert pid not in _children() and not Path(f"/proc/{pid}").exists(), "the HTTP server outlived aclose()"


def test_lazy_open_hanging_tool_and_close_leaves_no_process(loop):
    tools = MCPTools(MCPServer(command=[sys.executable, str(FAULTY)]))

    async def session():
        text = await tools.call_tool("echo", {"text": "opened on first use"})  # opens lazily
        first, second = await asyncio.gather(tools.open(), tools.open())  # idempotent, one session
        assert [t.spec for t in first] == [t.spec for t in second]
        box = ToolBox(first, timeout=0.5)
        start = time.monotonic()
        results = await box.run([ToolCall("0", "sleep", {"seconds": 30}), ToolCall("1", "pid", {})])
        took = time.monotonic() - start
        after = await box.run(
            [ToolCall("2", "echo", {"text": "still here"}), ToolCall("3", "fail", {"reason": "no"})]
        )
        return text, results, took, after

    text, results, took, after = loop.run_until_complete(session())
    assert text == "opened on first use"
    assert [r.status for r in results] == ["timeout", "ok"] and took < 1.5
    assert [(r.status, r.content) for r in after] == [
        ("ok", "still here"),
        ("error", "Error executing tool fail: no"),
    ]
    with pytest.raises(RuntimeError, match="opened on another event loop"):
        asyncio.run(tools.open())
    pid = int(results[1].content)
    assert pid in _children()
    loop.run_until_complete(tools.aclose())
    assert pid not in _children() and not Path(f"/proc/{pid}").exists(), "the stdio server outlived aclose()"
    loop.run_until_complete(tools.aclose())  # idempotent


def test_server_that_dies_mid_session_answers_errors_at_once(loop):
    async def session():
        async with MCPTools(MCPServer(command=[sys.executable, str(FAULTY)])) as tools:
            box = ToolBox(tools.tools, timeout=5)
            start = time.monotonic()
            died = await box.run([ToolCall("0", "crash", {}), ToolCall("1", "sleep", {"seconds": 30})])
            later = await box.run([ToolCall("2", "echo", {"text": "hi"})])
            return died, later, time.monotonic() - start, tools.alive, box.metrics()

    died, later, took, alive, metrics = loop.run_until_complete(session())
    assert [r.status for r in died + later] == ["error"] * 3
    assert all("is not running" in r.content for r in died + later)
    assert took < 2.0 and not alive  # well within the 5 s timeout: no hang on the dead server
    assert metrics["tools/errors"] == 3


def test_external_http_server_killed_mid_session(loop):
    port = _free_port()
    external = subprocess.Popen([sys.executable, str(FAULTY), "--http", str(port)])
    try:
        tools = MCPTools(MCPServer(url=f"http://127.0.0.1:{port}/mcp", start_timeout=20))

        async def session():
            box = ToolBox(await tools.open(), timeout=3)  # waits until the server listens
            first = await box.run([ToolCall("0", "echo", {"text": "up"})])
            external.kill()
            external.wait()
            start = time.monotonic()
            after = await box.run([ToolCall("1", "echo", {"text": "down"})])
            return first, after, time.monotonic() - start

        first, after, took = loop.run_until_complete(session())
        assert first[0].content == "up"
        assert after[0].status == "error" and "is not running" in after[0].content
        assert took < 1.0  # at once, not after the 3 s timeout
        start = time.monotonic()
        loop.run_until_complete(tools.aclose())
        assert time.monotonic() - start < 3
    finally:
        external.kill()
        external.wait()


def test_start_failures_are_reported_and_cleaned_up(loop):
    exits = MCPTools(MCPServer(command=[sys.executable, "-c", "import sys; sys.exit(2)"], start_timeout=10))
    with pytest.raises(MCPStartError, match="could not be started or listed"):
        loop.run_until_complete(exits.open())
    port = _free_port()
    before = set(_children())
    silent = MCPTools(
        MCPServer(
            command=[sys.executable, "-c", "import time; time.sleep(60)"],
            url=f"http://127.0.0.1:{port}/mcp",
            start_timeout=1.0,
        )
    )
    start = time.monotonic()
    with pytest.raises(MCPStartError, match="did not start and list its tools within 1s"):
        loop.run_until_complete(silent.open())
    assert time.monotonic() - start < 5
    assert set(_children()) <= before, "a server that never listened was left running"


def test_server_config_rejects_bad_input():
    with pytest.raises(ValueError, match="neither command nor url"):
        MCPServer()
    with pytest.raises(ValueError, match="url='localhost:80'"):
        MCPServer(url="localhost:80")
    with pytest.raises(ValueError, match="start_timeout=0"):
        MCPServer(command=["x"], start_timeout=0)
    with pytest.raises(RuntimeError, match="not open"):
        _ = MCPTools(MCPServer(command=["x"])).tools
