"""Supervised and preference rows made from tasks: what ``mode: train`` trains on (SFT, DPO) and the
expert rows MIX adds to a batch. Tokenization goes through :mod:`trine.models.chat`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trine.models.chat import encode_conversation, encode_sft
from trine.types import Experience, Task


def sft_experiences(tasks: Sequence[Task], tokenizer: Any, response_key: str | None) -> list[Experience]:
    """Supervised experiences (kind="sft"): a row's ``rendered`` tokens as they are (rows of
    :func:`trine.workflows.scripted.scripted_sft_rows`: exactly what the workflow renders), a whole chat with
    assistant turns (``messages_key``), or the chat prompt followed by the target response (``response_key``
    or the answer) and eos."""
    out = []
    for task in tasks:
        chat = task.messages()
        if isinstance(task.raw.get(RENDERED), dict):
            tokens, prompt_length, mask = _rendered(task, tokenizer)
        elif chat[-1].get("role") == "assistant":
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


RENDERED = "rendered"
"""The row key of pre-rendered tokens: ``{"tokens", "prompt_length", "action_mask", "text"}``."""


def _rendered(task: Task, tokenizer: Any) -> tuple[list[int], int, list[int]]:
    """A row's pre-rendered ``(tokens, prompt_length, action_mask)``, checked against ``tokenizer``."""
    r = task.raw[RENDERED]
    tokens, prompt_length, mask = r.get("tokens"), r.get("prompt_length"), r.get("action_mask")
    if not (isinstance(tokens, list) and isinstance(prompt_length, int) and isinstance(mask, list)):
        raise ValueError(
            f"task {task.task_id}: {RENDERED!r} is {sorted(r)}; expected tokens, prompt_length and action_mask "
            "(rows of trine.workflows.scripted_sft_rows), or remove the key to render the messages"
        )
    if len(mask) != len(tokens) - prompt_length or not any(mask):
        raise ValueError(
            f"task {task.task_id}: {RENDERED!r} has {len(tokens)} tokens, prompt_length {prompt_length} and "
            f"{len(mask)} mask entries ({sum(mask)} trained); expected one entry per response token, some 1"
        )
    if r.get("text") is not None and tokenizer.decode(tokens) != r["text"]:
        raise ValueError(
            f"task {task.task_id}: its {RENDERED!r} tokens were made with another tokenizer (they decode to "
            f"{tokenizer.decode(tokens)[:60]!r}, not {r['text'][:60]!r}); make the rows again with this model's "
            "tokenizer (trine.workflows.scripted_sft_rows)"
        )
    return list(tokens), prompt_length, list(mask)


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
