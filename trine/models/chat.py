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
