"""Supervised and preference rows made from tasks: what ``mode: train`` trains on (SFT, DPO) and the
expert rows MIX adds to a batch. Tokenization goes through :mod:`trine.models.chat`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trine.models.chat import encode_conversation, encode_sft
from trine.types import Experience, Task


def sft_experiences(tasks: Sequence[Task], tokenizer: Any, response_key: str | None) -> list[Experience]:
    """Supervised experiences (kind="sft"): a whole chat with assistant turns (``messages_key``), or
    the chat prompt followed by the target response (``response_key`` or the answer) and eos."""
    out = []
    for task in tasks:
        chat = task.messages()
        if chat[-1].get("role") == "assistant":
            tokens, prompt_length, mask = encode_conversation(tokenizer, chat)
        else:
            target = task.raw.get(response_key) if response_key else task.answer
            if target is None:
                raise ValueError(
                    f"task {task.task_id} has no target response for supervised training; set "
                    "tasks.train.response_key or answer_key to a field present in the data."
                )
            tokens, prompt_length = encode_sft(tokenizer, chat, str(target))
            mask = [1] * (len(tokens) - prompt_length)
        out.append(
            Experience(
                tokens=tokens,
                prompt_length=prompt_length,
                action_mask=mask,
                kind="sft",
                task_id=task.task_id,
                reward=0.0,
                info={"expert": True},
            )
        )
    return out


def preference_experiences(
    tasks: Sequence[Task], tokenizer: Any, chosen_key: str, rejected_key: str
) -> list[Experience]:
    """Two experiences per task (kind="preference", one ``group_id``): the prompt with the chosen
    response (``info["chosen"]`` True) and with the rejected one."""
    out = []
    for task in tasks:
        for key, chosen in ((chosen_key, True), (rejected_key, False)):
            if task.raw.get(key) is None:
                raise ValueError(
                    f"task {task.task_id} has no {key!r} field; preference data needs "
                    f"tasks.train.chosen_key / rejected_key fields (found: {sorted(task.raw)})"
                )
            tokens, prompt_length = encode_sft(tokenizer, task.messages(), str(task.raw[key]))
            out.append(
                Experience(
                    tokens=tokens,
                    prompt_length=prompt_length,
                    kind="preference",
                    action_mask=[1] * (len(tokens) - prompt_length),
                    reward=0.0,
                    task_id=task.task_id,
                    group_id=f"pair:{task.task_id}",
                    info={"chosen": chosen},
                )
            )
    return out
