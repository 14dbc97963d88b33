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


CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "ipython", "function", "model")
"""Role names chat templates write between their special tokens (``model``: Gemma's assistant)."""


def decode_messages(tokenizer: Any, ids: list[int]) -> list[dict[str, str]] | None:
    """The conversation a chat-templated prompt holds, as ``{"role", "content"}`` messages, without the
    template's markup (``<|im_start|>user ...``); None when its tokens are not such a conversation.

    The template's special tokens split the ids into pieces; a piece that starts with a role name
    (``user\\nWhat is 2+3?``: ChatML, Gemma) or is one (``user`` between Llama-3's header tokens, its
    content the next piece) opens a message. The generation prompt (an empty last assistant turn) is
    left out. None when text lies outside any message or no role is found: the caller then shows
    ``tokenizer.decode(ids, skip_special_tokens=True)``.
    """
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    special |= {i for i, t in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items() if t.special}
    pieces: list[list[int]] = [[]]
    for i in ids:
        if i in special:
            pieces.append([])
        else:
            pieces[-1].append(i)
    messages: list[dict[str, str]] = []
    role: str | None = None  # named by the last piece, its content still to come
    for text in (tokenizer.decode(p) for p in pieces if p):
        first, newline, rest = text.partition("\n")
        if first.strip() in CHAT_ROLES:
            if role is not None:
                messages.append({"role": role, "content": ""})
            role = first.strip()
            if not newline:
                continue
            content = rest
        elif role is not None:
            content = text
        elif text.strip():
            return None  # text outside any message: not a conversation this can read
        else:
            continue
        messages.append({"role": role, "content": content.strip()})
        role = None
    while messages and messages[-1]["role"] in ("assistant", "model") and not messages[-1]["content"]:
        messages.pop()  # the generation prompt
    return messages or None


def chat_text(messages: list[dict[str, Any]]) -> str:
    """A chat as people read it (no template markup): a lone user message as its text, otherwise
    ``role: text`` blocks."""
    if len(messages) == 1 and messages[0].get("role") == "user":
        return str(messages[0].get("content", ""))
    return "\n\n".join(f"{m.get('role', '?')}: {m.get('content', '')}" for m in messages)


def readable_prompt(tokenizer: Any, ids: list[int]) -> tuple[str, list[dict[str, str]] | None]:
    """``(text, messages)`` of prompt token ids for people: the conversation (:func:`decode_messages`)
    and its :func:`chat_text`, else the decoded text without special tokens and None."""
    messages = decode_messages(tokenizer, ids)
    if messages:
        return chat_text(messages), messages
    return tokenizer.decode(ids, skip_special_tokens=True), None
