"""What ``trine serve`` checks before a request reaches the engine: the key, the body's size, the model name,
the limits of :class:`~trine.serve.schemas.ServeSettings`, and how many requests generate at once.

Each check raises :class:`~trine.serve.schemas.ApiError` with the OpenAI error body's fields and a message
naming the field, the value, the limit and the fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from trine.serve.schemas import ApiError, ChatRequest, CompletionRequest, Message, ServeSettings
from trine.types import SamplingParams

if TYPE_CHECKING:
    from starlette.requests import Request


def bad(param: str | None, message: str) -> ApiError:
    """A 400 ``invalid_request_error`` about ``param``."""
    return ApiError(400, message, param=param)


class Gate:
    """At most ``max_concurrent`` holders at once and ``max_queue`` waiters; one more gets 429."""

    def __init__(self, max_concurrent: int, max_queue: int) -> None:
        self.max_concurrent, self.max_queue = max_concurrent, max_queue
        self.active = 0
        self.waiting = 0
        self._free = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one generating slot (waiting in the queue while all are taken)."""
        if self.active >= self.max_concurrent and self.waiting >= self.max_queue:
            raise ApiError(
                429,
                f"the server is busy: {self.active} requests generating and {self.waiting} waiting "
                f"(max_concurrent={self.max_concurrent}, max_queue={self.max_queue}); retry in a moment.",
                kind="rate_limit_error",
            )
        async with self._free:
            self.waiting += 1
            try:
                await self._free.wait_for(lambda: self.active < self.max_concurrent)
            finally:
                self.waiting -= 1
            self.active += 1
        try:
            yield
        finally:
            async with self._free:
                self.active -= 1
                self._free.notify()


def sampling_params(
    req: ChatRequest | CompletionRequest, limits: ServeSettings, max_completion_tokens: int | None = None
) -> SamplingParams:
    """The engine's sampling parameters for ``req``, within the server's limits."""
    max_tokens, param = req.max_tokens, "max_tokens"
    if max_completion_tokens is not None:
        if max_tokens is not None and max_tokens != max_completion_tokens:
            raise bad(
                "max_completion_tokens",
                f"max_tokens={max_tokens} and max_completion_tokens={max_completion_tokens} disagree; "
                "send only one of them.",
            )
        max_tokens, param = max_completion_tokens, "max_completion_tokens"
    if max_tokens is not None and max_tokens > limits.max_tokens:
        raise bad(
            param,
            f"{param}={max_tokens} is above this server's limit of {limits.max_tokens} tokens; "
            f"ask for at most {limits.max_tokens}.",
        )
    if req.n > limits.max_n:
        raise bad(
            "n",
            f"n={req.n} is above this server's limit of {limits.max_n} choices; ask for at most "
            f"{limits.max_n} (or send several requests).",
        )
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(req, name)
        if value not in (None, 0):
            raise bad(
                name, f"{name}={value} is not supported (the engine applies no penalties); send 0 or drop it."
            )
    return SamplingParams(
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        top_k=max(0, req.top_k or 0),
        max_tokens=limits.default_max_tokens if max_tokens is None else max_tokens,
        n=req.n,
        stop=[req.stop] if isinstance(req.stop, str) else list(req.stop or []),
        seed=req.seed,
    )


def check_chat(req: ChatRequest) -> None:
    """What a chat request may not combine: top alternatives, several choices in one session."""
    if req.top_logprobs:
        raise bad(
            "top_logprobs",
            f"top_logprobs={req.top_logprobs} is not supported: this server returns the logprob of each "
            "sampled token only; drop top_logprobs (or send 0) and keep logprobs=true.",
        )
    if req.session_id is not None and not req.record:
        raise bad(
            "record",
            "record=false with session_id: a session exists to be recorded; drop session_id or record.",
        )
    if req.session_id is not None and req.n != 1:
        raise bad(
            "n",
            f"n={req.n} with session_id: a session is one trajectory, so it takes n=1; send n=1 or drop "
            "session_id.",
        )


def completion_prompt(req: CompletionRequest, tokenizer: object) -> list[int]:
    """The prompt's token ids (text is tokenized as the model's tokenizer does by default)."""
    if req.logprobs:
        raise bad(
            "logprobs",
            f"logprobs={req.logprobs} asks for the top alternatives of each token, which this server does "
            "not compute; send logprobs=0 for the logprob of each sampled token.",
        )
    if isinstance(req.prompt, str):
        return list(tokenizer(req.prompt)["input_ids"])  # type: ignore[operator]
    vocab = len(tokenizer)  # type: ignore[arg-type]
    outside = [t for t in req.prompt if t >= vocab]
    if outside:
        raise bad(
            "prompt",
            f"prompt holds token id {outside[0]}, outside the vocabulary of {vocab} tokens; send ids in "
            f"0..{vocab - 1} or a text prompt.",
        )
    return list(req.prompt)


def check_prompt_text(req: ChatRequest | CompletionRequest, limits: ServeSettings) -> None:
    """400 before anything is tokenized when the prompt cannot fit ``max_prompt_tokens``: its text is longer
    than ``max_prompt_tokens`` x ``max_chars_per_token`` characters (messages: every text, name, tool call
    and tool definition counted), or it is a list of more token ids than that."""
    limit, per_token = limits.max_prompt_tokens, limits.max_chars_per_token
    if isinstance(req, CompletionRequest):
        param, chars = "prompt", len(req.prompt)
        if isinstance(req.prompt, list):
            if chars > limit:
                raise bad(param, f"prompt is {chars} token ids, above max_prompt_tokens={limit}; shorten it.")
            return
    else:
        param, chars = "messages", sum(_message_chars(m) for m in req.messages)
        if req.tools:
            chars += len(json.dumps([t.model_dump(exclude_none=True) for t in req.tools]))
    if chars > limit * per_token:
        raise bad(
            param,
            f"{param} holds {chars} characters: more than max_prompt_tokens={limit} tokens can hold (at most "
            f"{limit * per_token} characters, {per_token} per token: serve.max_chars_per_token); shorten it.",
        )


def _message_chars(message: Message) -> int:
    content = message.content
    chars = len(content) if isinstance(content, str) else sum(len(p.text) for p in content or [])
    chars += len(message.name or "")
    for call in message.tool_calls or []:
        chars += len(call.function.name) + len(call.function.arguments)
    return chars


def check_prompt(prompt_ids: list[int], limit: int, param: str) -> list[int]:
    """``prompt_ids`` if it is neither empty nor above ``max_prompt_tokens``."""
    if not prompt_ids:
        raise bad(param, f"{param} renders to no tokens; send some text.")
    if len(prompt_ids) > limit:
        raise bad(
            param,
            f"{param} is {len(prompt_ids)} tokens after the chat template, above max_prompt_tokens={limit}; "
            "shorten it.",
        )
    return prompt_ids


def check_model(model: str, served: str) -> None:
    """404 unless ``model`` is the name this server serves."""
    if model != served:
        raise ApiError(
            404,
            f"model {model!r} is not served here; this server serves {served!r} (GET /v1/models lists it).",
            param="model",
        )


def check_auth(request: Request, api_key: str | None) -> None:
    """401 unless the request carries ``Authorization: Bearer <api_key>`` (constant-time compare)."""
    if api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), api_key.encode()):
        raise ApiError(
            401,
            "missing or wrong API key: send 'Authorization: Bearer <key>' with the key this server was "
            "started with.",
            kind="authentication_error",
        )


async def read_body(request: Request, limit: int) -> bytes:
    """The body, or 413 as soon as it passes ``limit`` bytes (declared or streamed)."""
    declared = request.headers.get("content-length", "")
    too_big = ApiError(413, f"the request body is larger than {limit} bytes; send a smaller request.")
    if declared.isdigit() and int(declared) > limit:
        raise too_big
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


__all__ = [
    "Gate",
    "bad",
    "check_auth",
    "check_chat",
    "check_model",
    "check_prompt",
    "check_prompt_text",
    "completion_prompt",
    "read_body",
    "sampling_params",
]
