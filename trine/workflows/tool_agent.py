"""The tool-using agent workflow (``tool_agent``): the model answers with tool calls until it gives an answer.

Each of ``task.repeat`` rollouts (run concurrently, so the engine batches their turns) is one
:class:`~trine.workflows.trajectory.Trajectory`: the task's chat with the tools listed by the chat template;
then turn after turn the model samples, its ``<tool_call>`` blocks (Hermes / Qwen2.5 format) run
concurrently in a :class:`~trine.tools.ToolBox` (each under ``tool_timeout``), and their results come
back as ``tool`` messages, token-in token-out. A turn without a tool call is the answer, scored by the
task's reward. Faults stay inside the episode: a malformed call, an unknown tool, a tool that raises,
hangs or whose MCP server died is an error observation for the model (and a counter: ``tools/*``; per
rollout ``info["invalid_actions"]``, the failed calls); a
turn past ``turn_timeout`` ends the episode as ``timeout``, a conversation past ``max_tokens`` or
``max_turns`` as ``truncated`` (reward 0: no answer), each recorded in ``Experience.status`` (reason: ``info["status_reason"]``).

Tools are Python functions (import paths, schema from their type hints) and the tools of MCP servers
(``mcp_servers``: :class:`~trine.tools.MCPServer` fields), which the workflow starts on first use on the
explorer's event loop and stops in :meth:`ToolAgentWorkflow.aclose` (the explorer calls it at the end
of the stage).

``output: trajectory`` gives one experience per rollout (observation tokens masked out); ``output:
turns`` one per turn (``run_id`` / ``step`` set, the episode's reward on every turn), for step-wise
advantages.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from typing import Any, ClassVar, Literal

from trine import registry
from trine.tools import (
    MCPServer,
    MCPTools,
    ToolBox,
    ToolCall,
    ToolResult,
    function_tool,
    parse_tool_calls,
    tool_messages,
)
from trine.types import Experience, Task
from trine.workflows.base import RolloutModel, ScoreFn, leave_pending
from trine.workflows.trajectory import Trajectory

Output = Literal["trajectory", "turns"]


class ToolAgentWorkflow:
    """Multi-turn tool use; see the module docstring.

    Args:
        reward: the explorer's score function of the final answer.
        tools: Python functions offered as tools: names registered as kind ``tool`` (``@trine.register(
            "tool", "name")`` in a ``--plugin`` file) or import paths ``"package.module:function"``.
        mcp_servers: MCP servers whose tools are offered (dicts of :class:`~trine.tools.MCPServer`
            fields: ``command``, ``url``, ``env``, ``cwd``, ``prefix``, ...). A command starting with
            ``python`` runs under the Python that runs Trine (its virtual environment).
        tool_timeout: seconds one tool call may take (then an error observation).
        max_turns: model turns per episode (the last one must answer).
        max_tokens: token budget of the whole conversation (None: unbounded).
        turn_timeout: seconds one model turn may take (None: the explorer's task timeout bounds it).
        system_prompt: system message when the task has none.
        verify: check the final answer by running a tool instead of the task's reward (a tool-verified
            reward): ``{tool: NAME, arguments: {...}}``, the arguments' strings filled in with
            ``{answer}`` (the final answer's text), ``{task_answer}`` and ``{row[key]}``; the tool's output
            is the reward (a number). The verifier is not offered to the model. A verifier that fails or
            returns no number gives status ``reward_error``.
        list_tools: render the tools' JSON schemas into the prompt with the chat template's ``tools=``
            (off: the system prompt describes them, e.g. for a small model with a short context).
        output: ``"trajectory"`` (one experience per rollout) or ``"turns"`` (one per turn).
        defer_reward: do not score the answer: leave the reward pending for a grader or a person
            (:func:`~trine.workflows.base.leave_pending`; the answer is ``info["response"]``).
    """

    registry_args: ClassVar[dict[str, str]] = {"tools": "tool"}
    """Arguments that name entries of another registry kind (``trine validate`` checks them)."""

    def __init__(
        self,
        reward: ScoreFn | None = None,
        *,
        tools: list[str] | None = None,
        mcp_servers: list[dict[str, Any]] | None = None,
        tool_timeout: float = 10.0,
        max_turns: int = 4,
        max_tokens: int | None = None,
        turn_timeout: float | None = None,
        system_prompt: str | None = None,
        list_tools: bool = True,
        verify: dict[str, Any] | None = None,
        output: Output = "trajectory",
        defer_reward: bool = False,
    ) -> None:
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"max_turns={max_turns!r}; expected an integer >= 1.")
        if output not in ("trajectory", "turns"):
            raise ValueError(f"output={output!r}; expected 'trajectory' or 'turns'.")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 2):
            raise ValueError(f"max_tokens={max_tokens!r}; expected an integer >= 2 or null.")
        if not tools and not mcp_servers:
            raise ValueError(
                "tool_agent needs tools: give tools (registered names or import paths) or mcp_servers."
            )
        self.reward = reward
        self.box = ToolBox([_tool(name) for name in tools or []], timeout=tool_timeout)
        self.servers = [MCPTools(MCPServer(**_own_python(spec))) for spec in mcp_servers or []]
        self._opened = False
        self._open_lock: asyncio.Lock | None = None
        self.max_turns, self.max_tokens, self.turn_timeout = max_turns, max_tokens, turn_timeout
        self.system_prompt = system_prompt
        self.list_tools = list_tools
        if verify is not None and (not isinstance(verify, dict) or not isinstance(verify.get("tool"), str)):
            raise ValueError(f"verify={verify!r}; expected {{tool: NAME, arguments: {{...}}}} naming a tool")
        self.verify = verify
        self._verifier: ToolBox | None = None
        self.output: Output = output
        self.defer_reward = defer_reward

    async def run(self, task: Task, model: RolloutModel) -> list[Experience]:
        """All experiences of ``task.repeat`` concurrent episodes."""
        await self._open()
        episodes = await asyncio.gather(*(self.episode(task, model, i) for i in range(task.repeat)))
        out = [e for episode in episodes for e in episode]
        return leave_pending(out, task) if self.defer_reward else out

    async def episode(self, task: Task, model: RolloutModel, index: int = 0) -> list[Experience]:
        """One rollout: turns until an answer, the budget, ``max_turns`` or a timeout."""
        tools = self.box.specs() if self.list_tools else None
        traj = Trajectory(model.tokenizer, self.messages(task), tools=tools, max_tokens=self.max_tokens)
        params = task.sampling.replace(n=1)
        answer, counts = None, Counter()
        for turn in range(self.max_turns):
            if traj.ended:
                break
            room = traj.room()
            if room < 1:
                traj.end("truncated", f"no room left in max_tokens={self.max_tokens} before turn {turn}")
                break
            request = model.generate(traj.tokens, params.replace(max_tokens=min(params.max_tokens, room)))
            try:
                completion = (await asyncio.wait_for(request, self.turn_timeout))[0]
            except asyncio.TimeoutError:
                traj.end("timeout", f"turn {turn} took longer than turn_timeout={self.turn_timeout}s")
                break
            traj.add_completion(completion, model.policy_version)
            calls, malformed = parse_tool_calls(completion.text)
            if not calls and not malformed:
                answer = completion.text
                break
            results = await self.box.run(calls, malformed)
            counts.update(_count(results))
            traj.add_messages(tool_messages(results))
        else:
            traj.end("truncated", f"no answer within max_turns={self.max_turns}")
        if not traj.turns:  # nothing to train on: the explorer retries or skips the task with this reason
            raise RuntimeError(f"the episode ended before its first turn: {traj.status}: {traj.reason}")
        reward, parts = (None, {}) if self.defer_reward else await self._score(answer, task, traj)
        temperature = params.temperature
        exps = (
            [traj.experience(reward, parts, temperature)]
            if self.output == "trajectory"
            else traj.turn_experiences(reward, parts, temperature)
        )
        for e in exps:
            e.info.update(rollout_index=index, invalid_actions=counts["tools/errors"])
        if exps:
            exps[-1].info["counters"] = {k: float(v) for k, v in counts.items()}
        return exps

    async def _score(
        self, answer: str | None, task: Task, traj: Trajectory
    ) -> tuple[float, dict[str, float]]:
        """The answer's reward (0 without an answer); a reward that fails or times out is recorded as
        status ``reward_error`` with its reason (kept out of the loss by ``trainer.train_statuses``)."""
        if answer is None:
            return 0.0, {}
        try:
            if self._verifier is not None:
                return await self._verified(answer, task)
            return await self.reward(answer, task)
        except Exception as err:  # noqa: BLE001 - recorded on the trajectory, not a failed task
            traj.end("reward_error", f"{type(err).__name__}: {err}"[:500])
            return 0.0, {}

    async def _verified(self, answer: str, task: Task) -> tuple[float, dict[str, float]]:
        """The verifier tool's verdict on ``answer`` (see ``verify``)."""
        assert self._verifier is not None and self.verify is not None
        fields = {"answer": answer, "task_answer": task.answer, "row": task.raw}
        arguments = {
            k: v.format(**fields) if isinstance(v, str) else v
            for k, v in (self.verify.get("arguments") or {}).items()
        }
        (result,) = await self._verifier.run([ToolCall("verify", self.verify["tool"], arguments)])
        if result.status != "ok":
            raise RuntimeError(f"the verifier {self.verify['tool']!r} failed: {result.content}")
        try:
            return float(result.content.strip()), {"verified": float(result.content.strip())}
        except ValueError:
            raise ValueError(
                f"the verifier {self.verify['tool']!r} returned {result.content[:200]!r}, not a number"
            ) from None

    def messages(self, task: Task) -> list[dict[str, str]]:
        """The opening chat: the system prompt (if any) and the task's question."""
        if isinstance(task.question, list):
            return [dict(m) for m in task.question]
        system = task.system_prompt or self.system_prompt
        return ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": task.question}
        ]

    async def _open(self) -> None:
        """Start the MCP servers and add their tools (once, on the explorer's event loop)."""
        if self._opened:
            return
        self._open_lock = self._open_lock or asyncio.Lock()
        async with self._open_lock:
            if not self._opened:
                for server in self.servers:
                    self.box.extend(await server.open())
                if self.verify is not None:  # the workflow runs it, the model never sees it
                    self._verifier = ToolBox([self.box.remove(self.verify["tool"])], timeout=self.box.timeout)
                self._opened = True

    async def aclose(self) -> None:
        """Stop the MCP servers this workflow started."""
        for server in self.servers:
            await server.aclose()


def _count(results: list[ToolResult]) -> Counter:
    counts: Counter = Counter({"tools/calls": len(results)})
    for r in results:
        if r.status != "ok":
            counts["tools/errors"] += 1
        key = {"timeout": "tools/timeouts", "unknown_tool": "tools/unknown", "malformed": "tools/malformed"}
        if r.status in key:
            counts[key[r.status]] += 1
    return counts


def _own_python(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with a leading ``python`` / ``python3`` of its command replaced by this interpreter."""
    command = spec.get("command")
    if isinstance(command, (list, tuple)) and command and command[0] in ("python", "python3"):
        return {**spec, "command": [sys.executable, *command[1:]]}
    return spec


def _tool(name: str) -> Any:
    """The function tool ``name`` names: a registered tool keeps its registered name, a function given by
    import path its own name."""
    return function_tool(registry.resolve("tool", name), name=None if ":" in name else name)
