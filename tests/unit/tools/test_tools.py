"""The tool layer without MCP: parsing ``<tool_call>`` blocks, schemas from type hints, and a ToolBox
that runs a turn's calls concurrently and turns every fault (unknown tool, raise, hang, garbage) into
an observation, a status and a counter, never an exception or a stalled turn."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any, Literal

import pytest

from trine.blocking import BlockingPool, use_pool
from trine.tools import (
    ToolBox,
    ToolCall,
    ToolError,
    ToolSpec,
    format_tool_call,
    function_tool,
    parse_docstring,
    parse_tool_calls,
    strip_tool_calls,
    tool_messages,
)

# --------------------------------------------------------------------------- parsing


def test_parse_one_and_several_calls_with_prose_around():
    text = (
        "Let me add first.\n"
        '<tool_call>\n{"name": "add", "arguments": {"a": 12, "b": 30}}\n</tool_call>\n'
        "and multiply\n"
        '<tool_call>{"name": "multiply", "arguments": "{\\"a\\": 2, \\"b\\": 3}"}</tool_call>'
        '<tool_call>{"name": "now", "parameters": {}}</tool_call>'
    )
    calls, errors = parse_tool_calls(text)
    assert errors == []
    assert calls == [
        ToolCall("call_0", "add", {"a": 12, "b": 30}),
        ToolCall("call_1", "multiply", {"a": 2, "b": 3}),  # arguments given as a JSON string
        ToolCall("call_2", "now", {}),  # "parameters" accepted for "arguments"
    ]
    assert strip_tool_calls(text) == "Let me add first.\n\nand multiply"
    assert parse_tool_calls("no tools here") == ([], [])
    block = format_tool_call("add", {"a": 1, "b": 2})
    assert parse_tool_calls(block)[0] == [ToolCall("call_0", "add", {"a": 1, "b": 2})]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('{"name": "add", "arguments": {"a": 1,}}', "not valid JSON"),
        ('["add", 1]', "JSON list, not an object"),
        ('{"arguments": {"a": 1}}', 'no "name" string'),
        ('{"name": "", "arguments": {}}', 'no "name" string'),
        ('{"name": "add", "arguments": [1, 2]}', "arguments of 'add' are a JSON list"),
        ('{"name": "add", "arguments": "{bad"}', "arguments of 'add' are a string that is not valid JSON"),
    ],
)
def test_each_malformed_block_gives_one_error_and_keeps_the_good_calls(body, expected):
    good = '<tool_call>{"name": "ok", "arguments": {}}</tool_call>'
    calls, errors = parse_tool_calls(f"{good}<tool_call>{body}</tool_call>{good}")
    assert [c.id for c in calls] == ["call_0", "call_2"]  # ids count the bad block too
    assert len(errors) == 1 and expected in errors[0]


def test_unclosed_tags_are_errors():
    calls, errors = parse_tool_calls('<tool_call>{"name": "add", "arguments": {}}')
    assert calls == [] and len(errors) == 1 and "never closed" in errors[0]
    # opened again before the first closes: the first is unclosed, the second parses
    text = '<tool_call>{"name": "a"<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    calls, errors = parse_tool_calls(text)
    assert [c.name for c in calls] == ["b"] and "never closed" in errors[0]
    assert strip_tool_calls("answer <tool_call>{") == "answer"


# --------------------------------------------------------------------------- schemas from hints


def lookup(
    city: str,
    days: int,
    units: Literal["metric", "imperial"] = "metric",
    scale: float | None = None,
    tags: list[str] | None = None,
    extra: dict[str, int] | None = None,
    verbose: bool = False,
) -> dict[str, Any]:
    """Look up the weather.

    A second paragraph of the summary.

    Args:
        city: the city's name,
            in English.
        days (int): how many days ahead.
        units: the unit system.

    Returns:
        The forecast.
    """
    return {"city": city, "days": days, "units": units, "scale": scale, "tags": tags, "verbose": verbose}


def test_schema_comes_from_hints_and_docstring():
    spec = function_tool(lookup).spec
    assert spec.name == "lookup"
    assert spec.description == "Look up the weather.\nA second paragraph of the summary."
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "the city's name, in English."},
            "days": {"type": "integer", "description": "how many days ahead."},
            "units": {"type": "string", "enum": ["metric", "imperial"], "description": "the unit system."},
            "scale": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "extra": {"type": "object", "additionalProperties": {"type": "integer"}},
            "verbose": {"type": "boolean"},
        },
        "required": ["city", "days"],
    }
    renamed = function_tool(lookup, name="weather", description="Forecast.").spec
    assert (renamed.name, renamed.description) == ("weather", "Forecast.")
    assert parse_docstring("") == ("", {})


def test_unsupported_types_are_type_errors_naming_the_parameter():
    def bad_type(when: complex) -> str:
        return ""

    def no_hint(x) -> str:
        return ""

    def star(*values: int) -> str:
        return ""

    def int_keys(table: dict[int, str]) -> str:
        return ""

    with pytest.raises(TypeError, match="parameter 'when' of .*bad_type.* cannot express"):
        function_tool(bad_type)
    with pytest.raises(TypeError, match="parameter 'x' .* has no type hint"):
        function_tool(no_hint)
    with pytest.raises(TypeError, match=r"parameter 'values' .* \*args"):
        function_tool(star)
    with pytest.raises(TypeError, match="dict\\[str, ...\\]"):
        function_tool(int_keys)


def test_tool_spec_and_toolbox_reject_bad_input():
    with pytest.raises(ValueError, match="name='my tool'.*Rename"):
        ToolSpec(name="my tool", description="")
    with pytest.raises(ValueError, match="type 'object'"):
        ToolSpec(name="t", description="", parameters={"type": "string"})
    with pytest.raises(ValueError, match="timeout=0"):
        ToolBox([], timeout=0)
    with pytest.raises(ValueError, match="two tools are named 'lookup'"):
        ToolBox([function_tool(lookup), function_tool(lookup)], timeout=1)
    with pytest.raises(TypeError, match="function_tool"):
        ToolBox([lookup], timeout=1)  # type: ignore[list-item]


# --------------------------------------------------------------------------- running calls


async def slow_async(seconds: float) -> str:
    """Sleep on the event loop."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


def slow_blocking(seconds: float) -> float:
    """Sleep in a worker thread."""
    time.sleep(seconds)
    return seconds


def test_calls_of_a_turn_run_concurrently_async_and_blocking():
    box = ToolBox([function_tool(slow_async), function_tool(slow_blocking)], timeout=5)
    calls = [
        ToolCall(f"c{i}", name, {"seconds": 0.3})
        for i, name in enumerate(["slow_async", "slow_blocking"] * 2)
    ]
    start = time.monotonic()
    results = asyncio.run(box.run(calls))
    took = time.monotonic() - start
    assert [r.status for r in results] == ["ok"] * 4
    assert [r.content for r in results] == ["slept 0.3", "0.3"] * 2
    assert took < 0.9, f"4 calls of 0.3 s took {took:.2f}s: they did not run concurrently"
    assert all(0.25 < r.seconds < 0.9 for r in results)


def test_hanging_async_blocking_and_uncancellable_tools_time_out():
    release = threading.Event()

    def stuck() -> str:
        """Block a thread until released."""
        release.wait(30)
        return "late"

    async def stubborn() -> str:
        """Ignore the first cancellation."""
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(30)
        return "late"

    pool = BlockingPool(4, name="test-tools")

    async def main():
        use_pool(pool)
        box = ToolBox([function_tool(stuck), function_tool(stubborn), function_tool(slow_async)], timeout=0.3)
        calls = [
            ToolCall("a", "stuck", {}),
            ToolCall("b", "stubborn", {}),
            ToolCall("c", "slow_async", {"seconds": 30}),
        ]
        start = time.monotonic()
        results = await box.run(calls)
        return results, time.monotonic() - start, box.metrics()

    try:
        results, took, metrics = asyncio.run(main())
    finally:
        release.set()
    assert [r.status for r in results] == ["timeout"] * 3
    assert "did not answer within 0.3 seconds" in results[0].content
    assert took < 1.0
    assert pool.abandoned == 1  # the stuck thread was left behind, not waited for
    assert metrics["tools/timeouts"] == 3 and metrics["tools/errors"] == 3


def test_raising_unknown_and_bad_arguments_become_observations():
    def divide(a: float, b: float) -> float:
        """Divide a by b."""
        return a / b

    def refuse(reason: str) -> str:
        """Refuse with a reason."""
        raise ToolError(f"refused: {reason}")

    box = ToolBox([function_tool(divide), function_tool(refuse)], timeout=5)
    calls = [
        ToolCall("0", "divide", {"a": 1, "b": 0}),
        ToolCall("1", "refuse", {"reason": "no"}),
        ToolCall("2", "search", {"q": "x"}),
        ToolCall("3", "divide", {"a": 1}),
        ToolCall("4", "divide", {"a": 1, "b": 2, "c": 3}),
        ToolCall("5", "divide", {"a": "one", "b": 2}),
        ToolCall("6", "divide", {"a": 7, "b": 2}),
    ]
    results = asyncio.run(box.run(calls, ["the tool call is not valid JSON"]))
    by_id = {r.call.id: r for r in results}
    assert (
        by_id["0"].status == "error" and "failed: ZeroDivisionError: division by zero" in by_id["0"].content
    )
    assert by_id["1"].content == "Error: refused: no"  # a ToolError's message is shown as is
    assert by_id["2"].status == "unknown_tool"
    assert "no tool named 'search'; the tools are: divide, refuse" in by_id["2"].content
    assert "missing required argument(s) 'b'" in by_id["3"].content
    assert "unexpected argument(s) 'c'" in by_id["4"].content
    assert "argument 'a'='one' does not match" in by_id["5"].content
    assert (by_id["6"].status, by_id["6"].content) == ("ok", "3.5")
    malformed = results[-1]
    assert (malformed.status, malformed.call.name) == ("malformed", "")
    assert malformed.content == "Error: the tool call is not valid JSON"
    metrics = box.metrics(reset=True)
    assert metrics == {
        "tools/calls": 8.0,
        "tools/errors": 7.0,
        "tools/timeouts": 0.0,
        "tools/unknown": 1.0,
        "tools/malformed": 1.0,
        "tools/truncated": 0.0,
        "tools/seconds": pytest.approx(metrics["tools/seconds"]),
    }
    assert box.metrics()["tools/calls"] == 0.0  # taken and reset


class Garbage:
    """A hand-written tool that breaks its contract in the ways the toolbox must absorb."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.spec = ToolSpec(name="garbage", description="Returns whatever it was given.")

    async def call(self, arguments: dict[str, Any]) -> str:
        return self.value


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no text")


@pytest.mark.parametrize(
    ("value", "status", "content"),
    [
        ({"sum": 3, "items": [1, 2]}, "ok", '{"sum": 3, "items": [1, 2]}'),
        (42.0, "ok", "42"),
        (None, "ok", "null"),
        (Unprintable(), "error", "Error: tool 'garbage' returned no text"),
    ],
)
def test_non_text_returns_are_written_as_json_or_reported(value, status, content):
    [result] = asyncio.run(ToolBox([Garbage(value)], timeout=1).run([ToolCall("0", "garbage", {})]))
    assert result.status == status and result.content.startswith(content)


def test_long_output_is_truncated_with_a_note_and_counted():
    box = ToolBox([Garbage("x" * 5000)], timeout=1, max_chars=1000)
    result = asyncio.run(box.run_text(format_tool_call("garbage", {})))[0]
    assert result.status == "ok"
    assert result.content == "x" * 1000 + "\n[output truncated: showing 1000 of 5000 characters]"
    assert box.metrics()["tools/truncated"] == 1.0


def test_specs_and_messages_render_with_a_chat_template():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    template = (
        "{%- if tools %}<tools>{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n{%- endif %}"
        "{%- for m in messages %}<{{ m.role }}{% if m.name %} name={{ m.name }}{% endif %}>"
        "{{ m.content }}</{{ m.role }}>\n{%- endfor %}"
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")), chat_template=template
    )
    box = ToolBox([function_tool(slow_async)], timeout=5)
    results = asyncio.run(box.run_text(format_tool_call("slow_async", {"seconds": 0})))
    messages = [{"role": "user", "content": "wait"}, *tool_messages(results)]
    assert messages[1] == {
        "role": "tool",
        "name": "slow_async",
        "tool_call_id": "call_0",
        "content": "slept 0",
    }
    text = tok.apply_chat_template(messages, tools=box.specs(), tokenize=False)
    [spec] = box.specs()
    assert spec["type"] == "function" and spec["function"]["name"] == "slow_async"
    assert json.loads(text.split("<tools>")[1].split("\n")[0]) == spec
    assert "<user>wait</user><tool name=slow_async>slept 0</tool>" in text


def test_cancelling_the_turn_cancels_its_calls():
    """The explorer's task timeout cancels the workflow: the calls in flight are cancelled with it."""
    cancelled: list[str] = []

    async def main():
        started = asyncio.Event()

        async def wait_forever() -> str:
            """Wait until cancelled."""
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append("wait_forever")
                raise
            return "never"

        box = ToolBox([function_tool(wait_forever)], timeout=30)
        turn = asyncio.create_task(box.run([ToolCall("0", "wait_forever", {})]))
        await started.wait()
        turn.cancel()
        with pytest.raises(asyncio.CancelledError):
            await turn
        await asyncio.sleep(0)

    asyncio.run(main())
    assert cancelled == ["wait_forever"]


def test_a_tool_whose_call_is_not_async_is_an_error_result():
    class Sync:
        spec = ToolSpec(name="sync", description="Answers without awaiting.")

        def call(self, arguments: dict[str, Any]) -> str:
            return "not awaitable"

    [result] = asyncio.run(ToolBox([Sync()], timeout=1).run([ToolCall("0", "sync", {})]))
    assert result.status == "error" and "could not be called: TypeError" in result.content
