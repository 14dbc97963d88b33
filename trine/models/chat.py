"""Chat-template encoding shared by the engine, workflows and supervised data."""

from __future__ import annotations

from typing import Any


def encode_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of ``messages`` rendered with the chat template plus the generation prompt."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def encode_sft(tokenizer: Any, messages: list[dict[str, str]], response: str) -> tuple[list[int], int]:
    """``(tokens, prompt_length)`` for a supervised row: prompt + response + eos.

    The response is tokenized on its own and appended to the prompt ids (token-in, token-out),
    so the loss mask covers exactly the assistant's tokens and its end-of-turn token.
    """
    prompt = encode_prompt(tokenizer, messages)
    response_ids = tokenizer(response, add_special_tokens=False)["input_ids"]
    if tokenizer.eos_token_id is not None:
        response_ids.append(tokenizer.eos_token_id)
    return prompt + response_ids, len(prompt)


def encode_conversation(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[list[int], int, list[int]]:
    """``(tokens, prompt_length, action_mask)`` for a whole chat, training on assistant turns only.

    The chat is rendered turn by turn with the chat template; each turn's new text is tokenized on
    its own and appended. Assistant turns (their content and end-of-turn) get mask 1, everything
    else (system/user turns, the assistant header) 0. ``prompt_length`` ends where the first
    assistant content starts.
    """
    if not any(m.get("role") == "assistant" for m in messages):
        raise ValueError("a supervised chat needs at least one assistant message to train on")
    pieces: list[tuple[str, int]] = []
    shown = ""
    for i, message in enumerate(messages):
        if message.get("role") == "assistant":
            head = _render(tokenizer, messages[:i], generation_prompt=True)
            pieces.append((_delta(shown, head), 0))
            shown = head
        text = _render(tokenizer, messages[: i + 1], generation_prompt=False)
        pieces.append((_delta(shown, text), 1 if message.get("role") == "assistant" else 0))
        shown = text
    tokens: list[int] = []
    mask: list[int] = []
    for text, trainable in pieces:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] if text else []
        tokens += ids
        mask += [trainable] * len(ids)
    prompt_length = mask.index(1)
    return tokens, prompt_length, mask[prompt_length:]


def _render(tokenizer: Any, messages: list[dict[str, str]], generation_prompt: bool) -> str:
    if not messages:
        return ""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def _delta(before: str, after: str) -> str:
    if not after.startswith(before):
        raise ValueError(
            "the chat template does not render a conversation as a prefix of its continuation; "
            "per-turn loss masks need a prefix-consistent template (e.g. ChatML)"
        )
    return after[len(before) :]
