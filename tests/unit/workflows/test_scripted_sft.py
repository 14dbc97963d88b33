"""SFT rows from scripted episodes (issue 26 item 4d): the rows train on exactly the tokens and mask the
``multi_turn`` workflow produces for the same episode."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.unit.workflows.test_multi_turn import Conversational
from trine.tasks import TaskSet
from trine.tasks.supervised import sft_experiences
from trine.types import SamplingParams, Task
from trine.workflows import MultiTurnWorkflow, scripted_sft_rows
from trine.workflows.envs import grid_world_tasks

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ARGS = {"env": "grid_world", "max_steps": 3, "system_prompt": "Reach G. Answer with a move."}


def walker(conversation: str) -> str:
    """A scripted player that reads only how many moves it made: down, right, down, ..."""
    return ["down", "right"][conversation.count("<|im_start|>assistant\n") % 2 - 1]


def by_messages(messages: list[dict]) -> str:
    return ["down", "right"][sum(m["role"] == "assistant" for m in messages) % 2]


def test_rows_train_exactly_the_tokens_and_mask_multi_turn_samples(tokenizer, tmp_path):
    rows = grid_world_tasks(3, size=3, max_steps=3)
    made = scripted_sft_rows(
        rows, by_messages, tokenizer, workflow="multi_turn", workflow_args=ARGS, max_tokens=8
    )
    assert len(made) == 3 and all(r["messages"][-1]["role"] == "assistant" for r in made)
    assert made[0]["messages"][0] == {"role": "system", "content": ARGS["system_prompt"]}

    # the same episodes, sampled by the workflow from a model that replies like the policy
    wf = MultiTurnWorkflow(**ARGS)
    model = Conversational(tokenizer, walker)
    sampling = SamplingParams(temperature=1.0, max_tokens=8)

    async def play():
        try:
            return [
                (await wf.run(Task(f"g/{i}", row["question"], raw=row, sampling=sampling), model))[0]
                for i, row in enumerate(rows)
            ]
        finally:
            await wf.aclose()

    sampled = asyncio.run(play())

    path = tmp_path / "sft.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in made))
    trained = sft_experiences(
        list(TaskSet(str(path), messages_key="messages", answer_key=None)), tokenizer, None
    )
    for row, e, sft in zip(made, sampled, trained):
        assert sft.tokens == e.tokens and sft.prompt_length == e.prompt_length
        assert sft.action_mask == e.action_mask
        assert sft.kind == "sft" and row["reward"] == e.reward
    assert any(
        0 in e.action_mask for e in sampled
    )  # a game of several turns: its observations stay untrained


def test_rows_made_with_another_tokenizer_are_refused(tokenizer, tmp_path):
    (row,) = scripted_sft_rows(
        grid_world_tasks(1, size=3, max_steps=2), by_messages, tokenizer, workflow_args=ARGS, max_tokens=8
    )
    row["rendered"]["text"] = "something else"
    path = tmp_path / "sft.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match="made with another tokenizer"):
        sft_experiences(list(TaskSet(str(path), messages_key="messages", answer_key=None)), tokenizer, None)


def test_keep_filters_episodes_and_a_long_reply_names_max_tokens(tokenizer):
    rows = grid_world_tasks(2, size=3, max_steps=2)
    assert scripted_sft_rows(rows, by_messages, tokenizer, workflow_args=ARGS, keep=lambda e: False) == []
    with pytest.raises(ValueError, match="max_tokens=2"):
        scripted_sft_rows(rows, lambda m: "down down down", tokenizer, workflow_args=ARGS, max_tokens=2)
