"""SFT rows from episodes a scripted policy plays, rendered token for token as the workflow renders them.

A warm start for an environment task is usually a supervised stage on games played by a scripted player
(examples/guess_number/make_data.py writes such chats by hand). Rendering those chats anew for SFT can
differ from what the RL workflow produces (where a turn's end-of-turn newline goes, which tokens are
trained). :func:`scripted_sft_rows` instead plays the episodes **through the workflow itself** — the policy
stands in for the model (:class:`ScriptedPolicy`) — and keeps each rollout's exact tokens and action mask::

    from trine.models import load_tokenizer
    from trine.workflows import scripted_sft_rows

    rows = scripted_sft_rows(
        tasks,                                   # trine.Task objects or taskset rows ({"question", "seed", ...})
        policy=lambda messages: "[4]",           # the conversation so far -> the reply
        tokenizer=load_tokenizer("model"),
        workflow="multi_turn",
        workflow_args={"env": "textarena", "env_args": {"game": "GuessTheNumber-v0"}, "max_steps": 8},
        keep=lambda e: e.info["success"],        # e.g. only won games
    )
    # write rows to sft.jsonl; a stage with mode: train, algorithm: sft and
    # tasks.train: {path: sft.jsonl, messages_key: messages, answer_key: null} trains on exactly these tokens

Each row is ``{"messages": [...], "rendered": {"tokens", "prompt_length", "action_mask", "text"}, "task_id",
"reward"}`` (and the task's ``answer`` when it has one): the messages for people (and templates), ``rendered`` what the SFT stage trains on
(:func:`trine.tasks.supervised.sft_experiences`, which refuses it under another tokenizer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from trine import registry
from trine.models.chat import decode_messages, encode_prompt
from trine.types import Completion, Experience, SamplingParams, Task

Policy = Callable[[list[dict[str, str]]], str]
"""The scripted player: the conversation so far (``{"role", "content"}`` messages) -> the reply text."""


class ScriptedPolicy:
    """A rollout model whose reply is ``policy(messages)`` followed by the end-of-turn token (logprobs 0):
    what a workflow drives in place of a model to play scripted episodes."""

    policy_version = 0

    def __init__(self, tokenizer: Any, policy: Policy) -> None:
        self.tokenizer, self.policy = tokenizer, policy

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        messages = decode_messages(self.tokenizer, list(prompt_ids)) or []
        return [self._reply(list(prompt_ids), messages, params) for _ in range(params.n)]

    async def chat(self, messages: list[dict[str, str]], params: SamplingParams) -> list[Completion]:
        ids = encode_prompt(self.tokenizer, messages)
        return [self._reply(ids, [dict(m) for m in messages], params) for _ in range(params.n)]

    def _reply(
        self, prompt_ids: list[int], messages: list[dict[str, str]], params: SamplingParams
    ) -> Completion:
        text = self.policy(messages)
        if not isinstance(text, str):
            raise TypeError(f"the scripted policy returned {text!r}; expected the reply as a str")
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        if len(ids) > params.max_tokens:
            raise ValueError(
                f"the scripted reply {text[:80]!r} has {len(ids)} tokens, over the workflow's "
                f"max_tokens={params.max_tokens}; raise the sampling max_tokens the rows are made with"
            )
        return Completion(prompt_ids, ids, [0.0] * len(ids), text, "stop")


def scripted_sft_rows(
    tasks: Sequence[Task | dict[str, Any]],
    policy: Policy,
    tokenizer: Any,
    *,
    workflow: str = "multi_turn",
    workflow_args: dict[str, Any] | None = None,
    max_tokens: int = 256,
    reward: Callable[..., Any] | None = None,
    keep: Callable[[Experience], bool] | None = None,
) -> list[dict[str, Any]]:
    """Play each task once with ``policy`` through ``workflow`` (a name or import path, built with
    ``workflow_args``) and return one SFT row per rollout that ``keep`` accepts (default: all); see the
    module docstring. A task given as a row becomes ``Task(task_id="scripted/<i>", question=row["question"],
    raw=row)``; ``max_tokens`` is each turn's token limit. ``reward`` is the workflow's score function
    (``await reward(text, task) -> (reward, parts)``), for workflows that score answers (``tool_agent``);
    environment workflows take the environment's rewards."""
    built = registry.resolve("workflow", workflow)(reward=reward or _no_reward, **(workflow_args or {}))
    model = ScriptedPolicy(tokenizer, policy)
    sampling = SamplingParams(temperature=1.0, max_tokens=max_tokens)

    async def play() -> list[tuple[Task, Experience]]:
        out = []
        try:
            for i, item in enumerate(tasks):
                task = item if isinstance(item, Task) else _task(item, i, workflow)
                out += [(task, e) for e in await built.run(replace(task, repeat=1, sampling=sampling), model)]
        finally:
            if hasattr(built, "aclose"):
                await built.aclose()
        return out

    rows = []
    for task, e in asyncio.run(play()):
        if keep is None or keep(e):
            answer = {} if task.answer is None else {"answer": task.answer}
            rows.append({**sft_row(e, tokenizer), **answer})
    return rows


def sft_row(e: Experience, tokenizer: Any) -> dict[str, Any]:
    """An experience as an SFT row (see the module docstring): a whole conversation (``output: trajectory``)
    trains every turn of it, a step or a turn (``step_wise``, ``output: turns``) its own reply."""
    messages = decode_messages(tokenizer, e.tokens)
    if not messages:
        raise ValueError(
            f"task {e.task_id}: its tokens do not decode to a chat; the workflow must use the chat template"
        )
    rendered = {
        "tokens": list(e.tokens),
        "prompt_length": e.prompt_length,
        "action_mask": list(e.action_mask),
        "text": tokenizer.decode(e.tokens),
    }
    return {"messages": messages, "rendered": rendered, "task_id": e.task_id, "reward": e.reward}


def _task(row: dict[str, Any], i: int, workflow: str) -> Task:
    return Task(
        f"scripted/{i}", row.get("question", ""), answer=row.get("answer"), raw=dict(row), workflow=workflow
    )


async def _no_reward(text: str, task: Task) -> tuple[float, dict[str, float]]:
    return 0.0, {}
