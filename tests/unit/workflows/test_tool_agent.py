"""The tool_agent workflow: tool calls, faults as observations and counters, budgets, MCP servers.

The rollout model here is a scripted :class:`~trine.models.protocol.RolloutModel` (the real tokenizer,
replies chosen from the conversation so far): it stands in for a model that has learnt to call tools,
which the tiny test model has not; the workflow, tools, template and MCP server under test are real.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from pathlib import Path

import pytest

from trine.types import Completion, SamplingParams, Task
from trine.workflows import WORKFLOWS, ToolAgentWorkflow

ROOT = Path(__file__).resolve().parents[3]
CALCULATOR = ROOT / "examples" / "mcp_calculator" / "server.py"


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: first factor
        b: second factor
    """
    return a * b


async def stall(seconds: float) -> str:
    """Wait, then answer.

    Args:
        seconds: how long
    """
    await asyncio.sleep(seconds)
    return "late"


class Scripted:
    """Replies by rule: a tool result in the last turn -> "The answer is <result>"; else ``first``."""

    def __init__(self, tokenizer, first: str, delay: float = 0.0) -> None:
        self.tokenizer, self.first, self.delay, self.policy_version = tokenizer, first, delay, 7

    async def generate(self, prompt_ids, params: SamplingParams) -> list[Completion]:
        await asyncio.sleep(self.delay)
        text = self.tokenizer.decode(prompt_ids)
        last = text.rsplit("<|im_start|>", 2)[-2]
        reply = (
            f"The answer is {last.split(chr(10), 1)[1].split('<|im_end|>')[0]}"
            if last.startswith("tool")
            else self.first
        )
        ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
        ids = (ids + [self.tokenizer.convert_tokens_to_ids("<|im_end|>")])[: params.max_tokens]
        return [
            Completion(
                list(prompt_ids),
                ids,
                [-0.1] * len(ids),
                self.tokenizer.decode(ids, skip_special_tokens=True),
                "stop",
            )
        ]


async def exact(answer: str, task: Task) -> tuple[float, dict[str, float]]:
    found = re.findall(r"-?\d+", answer)
    return float(bool(found) and found[-1] == str(task.answer)), {}


def _task(repeat: int = 2, max_tokens: int = 64) -> Task:
    return Task(
        "t0",
        "What is 12 times 34?",
        answer=408,
        repeat=repeat,
        sampling=SamplingParams(max_tokens=max_tokens),
    )


def _run(workflow: ToolAgentWorkflow, model, task: Task):
    async def go():
        try:
            return await workflow.run(task, model)
        finally:
            await workflow.aclose()

    return asyncio.run(go())


CALL = '<tool_call>{"name": "multiply", "arguments": {"a": 12, "b": 34}}</tool_call>'


def test_a_tool_call_then_an_answer_is_one_masked_trajectory(tokenizer):
    assert WORKFLOWS["tool_agent"] is ToolAgentWorkflow
    wf = ToolAgentWorkflow(exact, tools=["tests.unit.workflows.test_tool_agent:multiply"])
    exps = _run(wf, Scripted(tokenizer, CALL), _task())
    assert len(exps) == 2
    for e in exps:
        e.check()
        assert e.reward == 1.0 and e.status == "ok" and e.info["turns"] == 2
        assert e.info["response"] == "The answer is 408"
        observation = [t for t, m in zip(e.response_tokens, e.action_mask) if m == 0]
        assert "<|im_start|>tool\n408<|im_end|>" in tokenizer.decode(observation)
    assert exps[-1].info["counters"] == {"tools/calls": 1.0}


def test_faults_become_observations_and_counters_never_a_failed_task(tokenizer):
    calls = (
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>'
        "<tool_call>{not json}</tool_call>"
        '<tool_call>{"name": "stall", "arguments": {"seconds": 30}}</tool_call>'
    )
    wf = ToolAgentWorkflow(
        exact, tools=["tests.unit.workflows.test_tool_agent:stall"], tool_timeout=0.3, max_turns=2
    )
    start = time.perf_counter()
    (exp,) = _run(wf, Scripted(tokenizer, calls), _task(repeat=1, max_tokens=200))
    assert time.perf_counter() - start < 3  # the hanging tool was cut at its timeout
    counters = exp.info["counters"]
    assert counters["tools/calls"] == 3 and counters["tools/errors"] == 3
    assert (
        counters["tools/unknown"] == 1
        and counters["tools/malformed"] == 1
        and counters["tools/timeouts"] == 1
    )
    text = tokenizer.decode(exp.response_tokens)
    assert "nope" in text and "stall" in text  # the model reads what went wrong


def test_no_answer_within_max_turns_or_the_budget_is_truncated_with_reward_zero(tokenizer):
    wf = ToolAgentWorkflow(exact, tools=["tests.unit.workflows.test_tool_agent:multiply"], max_turns=1)
    (exp,) = _run(wf, Scripted(tokenizer, CALL), _task(repeat=1))
    assert exp.status == "truncated" and "max_turns=1" in exp.info["status_reason"] and exp.reward == 0.0
    wf = ToolAgentWorkflow(exact, tools=["tests.unit.workflows.test_tool_agent:multiply"], max_tokens=280)
    (exp,) = _run(wf, Scripted(tokenizer, CALL), _task(repeat=1))
    assert exp.status == "truncated" and "max_tokens=280" in exp.info["status_reason"]
    assert len(exp.tokens) <= 280 and exp.info["turns"] == 1
    wf = ToolAgentWorkflow(exact, tools=["tests.unit.workflows.test_tool_agent:multiply"], max_tokens=100)
    with pytest.raises(RuntimeError, match="before its first turn: truncated: the opening prompt"):
        _run(wf, Scripted(tokenizer, CALL), _task(repeat=1))  # nothing to train on: the explorer skips it


def test_a_turn_past_its_timeout_ends_the_episode_as_timeout(tokenizer):
    wf = ToolAgentWorkflow(exact, tools=["tests.unit.workflows.test_tool_agent:multiply"], turn_timeout=0.2)
    with pytest.raises(RuntimeError, match="before its first turn: timeout: turn 0 took longer"):
        _run(wf, Scripted(tokenizer, CALL, delay=5.0), _task(repeat=1))
    slow_answer = ToolAgentWorkflow(
        exact, tools=["tests.unit.workflows.test_tool_agent:stall"], turn_timeout=0.5
    )
    model = Scripted(tokenizer, '<tool_call>{"name": "stall", "arguments": {"seconds": 0}}</tool_call>')
    original = model.generate

    async def slow_second_turn(prompt_ids, params):
        if "<|im_start|>tool" in tokenizer.decode(prompt_ids):
            await asyncio.sleep(5)
        return await original(prompt_ids, params)

    model.generate = slow_second_turn
    (exp,) = _run(slow_answer, model, _task(repeat=1))
    assert exp.status == "timeout" and exp.info["turns"] == 1 and exp.reward == 0.0


def test_one_experience_per_turn_for_step_wise_advantages(tokenizer):
    wf = ToolAgentWorkflow(exact, tools=["tests.unit.workflows.test_tool_agent:multiply"], output="turns")
    exps = _run(wf, Scripted(tokenizer, CALL), _task(repeat=1))
    assert [e.step for e in exps] == [0, 1] and len({e.run_id for e in exps}) == 1
    assert all(e.reward == 1.0 and all(e.action_mask) for e in exps)
    assert [e.info["last_step"] for e in exps] == [False, True]


def test_bad_arguments_are_refused_with_the_fix(tokenizer):
    with pytest.raises(ValueError, match="needs tools"):
        ToolAgentWorkflow(exact)
    with pytest.raises(ValueError, match="max_turns=0"):
        ToolAgentWorkflow(exact, tools=["tests.unit.workflows.test_tool_agent:multiply"], max_turns=0)
    with pytest.raises(ValueError, match="output='all'"):
        ToolAgentWorkflow(exact, tools=["tests.unit.workflows.test_tool_agent:multiply"], output="all")


def test_tools_of_the_example_mcp_server_are_started_used_and_stopped(tokenizer):
    pytest.importorskip("mcp", reason="the mcp SDK (extra `agents`) is not installed")
    call = '<tool_call>{"name": "calculate", "arguments": {"expression": "12*34"}}</tool_call>'
    wf = ToolAgentWorkflow(exact, mcp_servers=[{"command": [sys.executable, str(CALCULATOR)]}])
    exps = _run(wf, Scripted(tokenizer, call), _task(repeat=2))
    assert [e.reward for e in exps] == [1.0, 1.0]
    assert "calculate" in tokenizer.decode(exps[0].tokens[: exps[0].prompt_length])  # listed to the model
    assert all(not server.alive for server in wf.servers)


def test_a_tool_verifies_the_final_answer_and_is_hidden_from_the_model(tokenizer):
    pytest.importorskip("mcp", reason="the mcp SDK (extra `agents`) is not installed")
    call = '<tool_call>{"name": "calculate", "arguments": {"expression": "12*34"}}</tool_call>'
    verify = {"tool": "check", "arguments": {"expression": "{row[expression]}", "answer": "{answer}"}}
    wf = ToolAgentWorkflow(exact, mcp_servers=[{"command": ["python", str(CALCULATOR)]}], verify=verify)
    task = _task(repeat=1)
    task.raw = {"expression": "12*34"}
    (right,) = _run(wf, Scripted(tokenizer, call), task)
    assert right.reward == 1.0 and right.info["reward_parts"] == {"verified": 1.0}
    assert "check" not in tokenizer.decode(right.tokens[: right.prompt_length])  # not offered to the model
    task.raw = {"expression": "12*35"}  # the verifier computes the truth itself: 408 is now wrong
    wf = ToolAgentWorkflow(exact, mcp_servers=[{"command": ["python", str(CALCULATOR)]}], verify=verify)
    (wrong,) = _run(wf, Scripted(tokenizer, call), task)
    assert wrong.reward == 0.0 and wrong.status == "ok"
    task.raw = {"expression": "12*"}  # the verifier fails: reward_error, kept out of the loss
    wf = ToolAgentWorkflow(exact, mcp_servers=[{"command": ["python", str(CALCULATOR)]}], verify=verify)
    (failed,) = _run(wf, Scripted(tokenizer, call), task)
    assert failed.status == "reward_error" and "verifier 'check' failed" in failed.info["status_reason"]
