"""OpenAI response bodies and stream chunks from what the engine sampled.

:class:`Answer` is one request's result (prompt ids, completions, the policy version, the session and
turn); :func:`chat_body` / :func:`completion_body` write it as ``chat.completion`` / ``text_completion``
and :func:`chat_chunks` / :func:`completion_chunks` as the chunks of a stream (:func:`sse` frames them,
ending with ``data: [DONE]``). The engine returns whole completions, so a stream sends each choice's
text in one chunk once it is sampled.

Beside the OpenAI fields every body carries ``policy_version`` (the weights that sampled it) and, for a
session, ``session_id`` and ``turn``; with ``return_token_ids`` it carries ``prompt_token_ids`` (top
level) and ``token_ids`` per choice — vLLM's names — exactly the tokens recorded as experience. Text is
cut before a stop string as the OpenAI API does; ``token_ids`` and ``logprobs`` keep every sampled
token.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from trine.serve.render import reply_message
from trine.types import Completion


@dataclass
class Answer:
    """One request's result, ready to be written as a response or a stream."""

    response_id: str
    model: str
    created: int
    prompt_ids: list[int]
    completions: list[Completion]
    policy_version: int
    session_id: str | None = None
    turn: int | None = None
    stop: list[str] = field(default_factory=list)
    return_token_ids: bool = False
    logprobs: bool = False
    parse_tools: bool = False
    include_usage: bool = False
    stream: bool = False
    """Send it as server-sent events (``stream=true``)."""

    def usage(self) -> dict[str, int]:
        prompt = len(self.prompt_ids)
        completion = sum(len(c.response_ids) for c in self.completions)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def extras(self) -> dict[str, Any]:
        """The top-level fields beside OpenAI's (policy version, session, turn)."""
        out: dict[str, Any] = {"policy_version": self.policy_version}
        if self.session_id is not None:
            out.update(session_id=self.session_id, turn=self.turn)
        return out

    def text(self, c: Completion) -> str:
        """The completion's text cut before its first stop string (when it stopped on one)."""
        text = c.text
        if c.finish_reason == "stop":
            cuts = [text.find(s) for s in self.stop if s in text]
            if cuts:
                text = text[: min(cuts)]
        return text


def chat_body(answer: Answer, tokenizer: Any) -> dict[str, Any]:
    """The ``chat.completion`` object."""
    choices = []
    for index, c in enumerate(answer.completions):
        message, calls = reply_message(
            answer.text(c),
            parse_tools=answer.parse_tools,
            call_prefix=f"call_{answer.response_id[-8:]}_{index}_",
        )
        choice: dict[str, Any] = {
            "index": index,
            "message": message,
            "finish_reason": "tool_calls" if calls else c.finish_reason,
            "logprobs": {"content": _chat_logprobs(c, tokenizer)} if answer.logprobs else None,
        }
        choices.append(choice)
    return _body(answer, "chat.completion", choices)


def _body(answer: Answer, kind: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
    """The response object around ``choices`` (one per completion, in order), with the token ids the
    request asked for (``return_token_ids``: vLLM's field names)."""
    if answer.return_token_ids:
        for choice, c in zip(choices, answer.completions):
            choice["token_ids"] = list(c.response_ids)
    body = _head(answer, kind)
    body.update(choices=choices, usage=answer.usage())
    if answer.return_token_ids:
        body["prompt_token_ids"] = list(answer.prompt_ids)
    return body


def chat_chunks(answer: Answer, tokenizer: Any) -> Iterator[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects of a stream: per choice its role, its content (with logprobs
    and token ids), its tool calls, its finish reason; then the usage when asked."""
    body = chat_body(answer, tokenizer)
    first = True
    for choice in body["choices"]:
        message, index = choice["message"], choice["index"]
        head = _chunk(answer, {"role": "assistant", "content": ""}, index)
        if first and answer.return_token_ids:
            head["prompt_token_ids"] = body["prompt_token_ids"]
        first = False
        yield head
        delta = _chunk(answer, {"content": message["content"]}, index, logprobs=choice["logprobs"])
        if answer.return_token_ids:
            delta["choices"][0]["token_ids"] = choice["token_ids"]
        yield delta
        if message.get("tool_calls"):
            calls = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
            yield _chunk(answer, {"tool_calls": calls}, index)
        yield _chunk(answer, {}, index, finish_reason=choice["finish_reason"])
    if answer.include_usage:
        yield {**_head(answer, "chat.completion.chunk"), "choices": [], "usage": body["usage"]}


def completion_body(answer: Answer, tokenizer: Any) -> dict[str, Any]:
    """The ``text_completion`` object."""
    choices = []
    for index, c in enumerate(answer.completions):
        choice: dict[str, Any] = {
            "index": index,
            "text": answer.text(c),
            "finish_reason": c.finish_reason,
            "logprobs": _completion_logprobs(c, tokenizer) if answer.logprobs else None,
        }
        choices.append(choice)
    return _body(answer, "text_completion", choices)


def completion_chunks(answer: Answer, tokenizer: Any) -> Iterator[dict[str, Any]]:
    """The chunks of a streamed ``/v1/completions``: per choice its text, then its finish reason."""
    body = completion_body(answer, tokenizer)
    for n, choice in enumerate(body["choices"]):
        head = {**_head(answer, "text_completion"), "choices": [{**choice, "finish_reason": None}]}
        if n == 0 and answer.return_token_ids:
            head["prompt_token_ids"] = body["prompt_token_ids"]
        yield head
        end = {
            "index": choice["index"],
            "text": "",
            "finish_reason": choice["finish_reason"],
            "logprobs": None,
        }
        yield {**_head(answer, "text_completion"), "choices": [end]}
    if answer.include_usage:
        yield {**_head(answer, "text_completion"), "choices": [], "usage": body["usage"]}


def sse(chunks: Iterator[dict[str, Any]]) -> Iterator[bytes]:
    """Server-sent events: ``data: <json>`` per chunk, then ``data: [DONE]``."""
    for chunk in chunks:
        yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n".encode()
    yield b"data: [DONE]\n\n"


def token_strings(tokenizer: Any, ids: list[int]) -> list[str]:
    """Each token's text on its own (what ``logprobs`` shows as ``token``)."""
    return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]


def _head(answer: Answer, kind: str) -> dict[str, Any]:
    return {
        "id": answer.response_id,
        "object": kind,
        "created": answer.created,
        "model": answer.model,
        "system_fingerprint": None,
        **answer.extras(),
    }


def _chunk(
    answer: Answer,
    delta: dict[str, Any],
    index: int,
    *,
    logprobs: Any = None,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    return {**_head(answer, "chat.completion.chunk"), "choices": [choice]}


def _finite(value: float) -> float:
    """A logprob JSON can carry (-inf, which strict JSON cannot write, becomes -9999.0 as OpenAI does)."""
    value = float(value)
    return value if math.isfinite(value) else -9999.0


def _chat_logprobs(c: Completion, tokenizer: Any) -> list[dict[str, Any]]:
    return [
        {"token": s, "logprob": _finite(lp), "bytes": list(s.encode()), "top_logprobs": []}
        for s, lp in zip(token_strings(tokenizer, list(c.response_ids)), c.logprobs)
    ]


def _completion_logprobs(c: Completion, tokenizer: Any) -> dict[str, Any]:
    tokens = token_strings(tokenizer, list(c.response_ids))
    offsets, pos = [], 0
    for s in tokens:
        offsets.append(pos)
        pos += len(s)
    return {
        "tokens": tokens,
        "token_logprobs": [_finite(x) for x in c.logprobs],
        "top_logprobs": None,
        "text_offset": offsets,
    }


__all__ = [
    "Answer",
    "chat_body",
    "chat_chunks",
    "completion_body",
    "completion_chunks",
    "sse",
    "token_strings",
]
