"""What ``trine serve`` accepts and how it refuses: request bodies, settings, and OpenAI-style errors.

Request bodies are parsed here, not by FastAPI, so that every refusal has the OpenAI error body
(``{"error": {"message", "type", "param", "code"}}``) and a message that names the field, what was
expected and the fix: :func:`parse_body` turns raw bytes into one of the request models below or raises
:class:`ApiError`. The models are strict (no string-to-number coercion, no unknown fields, finite
numbers only); limits that depend on the server's settings (``n``, ``max_tokens``) are checked by the
app against :class:`ServeSettings` (the ``serve`` config section, resolved for one server).

Fields follow the OpenAI API (compare ``openai.types.chat.completion_create_params``); the extensions a
client sends through ``extra_body`` are ``session_id``, ``task_id``, ``return_token_ids`` (vLLM's name)
and ``top_k``.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from trine.config.base import Count
from trine.config.serve import ServeConfig

MAX_SEED = 2**63 - 1
_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
_ID = Annotated[str, Field(min_length=1, max_length=256)]
_Stop = Annotated[str, Field(min_length=1)]
_Prompt = (
    Annotated[str, Field(min_length=1)] | Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
)


class ServeSettings(ServeConfig):
    """Limits and identity of one server: the ``serve`` config section (:class:`~trine.config.ServeConfig`
    declares every limit once: type, range, default, docs) with the values a running server resolves
    (:func:`trine.launch.serve.settings_of`) and the few that are no config key."""

    model_config = ConfigDict(frozen=True)

    model_name: str = "trine"
    """``serve.model_name`` resolved (``trine serve``: the run's ``name`` when unset): the one model name
    ``/v1/models`` lists and requests must name."""
    max_prompt_tokens: Count = 4096
    """``serve.max_prompt_tokens`` resolved (``trine serve``: the model's context length minus ``max_tokens``
    when unset): the longest prompt after the chat template (a session: the whole conversation so far)."""
    api_key: str | None = None
    """Bearer token every ``/v1`` request must send (``trine serve``: read from ``serve.api_key_env``; None:
    no authentication)."""
    max_body_bytes: Count = 8 * 1024 * 1024
    """Largest request body; a longer one gets 413."""

    @field_validator("api_key")
    @classmethod
    def _token(cls, v: str | None) -> str | None:
        if v is not None and not v:
            raise ValueError("ServeSettings.api_key is an empty string; give a token or None (no auth).")
        return v


class ApiError(Exception):
    """A refusal with its HTTP status and the OpenAI error body's fields."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, kind: str = "invalid_request_error"
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict[str, Any]:
        """``{"error": {"message", "type", "param", "code"}}`` as the OpenAI API writes it."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


# ---------------------------------------------------------------------------------------------- models
class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class TextPart(_Strict):
    """One ``{"type": "text", "text": ...}`` content part (the only kind a text model reads)."""

    type: Literal["text"]
    text: str


class FunctionCallIn(_Strict):
    name: str
    arguments: str
    """JSON text of the arguments (what the API returned, echoed back)."""


class ToolCallIn(_Strict):
    """An assistant message's tool call as the API writes it."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn


class Message(_Strict):
    """One chat message (system / developer / user / assistant / tool)."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    refusal: None = None
    """Echoed back by clients as ``null``; anything else is refused."""
    annotations: list[Any] | None = None
    audio: None = None
    function_call: None = None


class FunctionDef(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(_Strict):
    """One entry of ``tools``: a function the chat template shows the model."""

    type: Literal["function"]
    function: FunctionDef


class StreamOptions(_Strict):
    include_usage: bool = False


class ResponseFormat(_Strict):
    type: Literal["text"]


class _Sampling(_Strict):
    """Fields both completion endpoints share (sampling, streaming, Trine's extensions)."""

    model: str
    n: Annotated[int, Field(ge=1)] = 1
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=2**31 - 1)] | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    stop: _Stop | Annotated[list[_Stop], Field(max_length=16)] | None = None
    seed: Annotated[int, Field(ge=0, le=MAX_SEED)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    """Accepted as 0 only (the engine has no penalties)."""
    frequency_penalty: float | None = None
    """Accepted as 0 only."""
    user: Annotated[str, Field(max_length=256)] | None = None
    task_id: _ID | None = None
    return_token_ids: bool = False
    record: bool = True
    """False: answer without recording an experience (an explorer sampling through the server with
    ``model.engine: openai`` records its own experiences; feedback on such a response gets 404)."""


class ChatRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: Annotated[list[Message], Field(min_length=1)]
    tools: list[ToolDef] | None = None
    tool_choice: Literal["auto", "none"] | None = None
    parallel_tool_calls: bool | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    response_format: ResponseFormat | None = None
    session_id: _ID | None = None


class CompletionRequest(_Sampling):
    """``POST /v1/completions``: one prompt, as text or token ids."""

    prompt: _Prompt
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    echo: Literal[False] = False


class FeedbackRequest(_Strict):
    """``POST /v1/feedback``: a reward for one response (all its choices, or the one ``choice`` names) or
    one session."""

    response_id: _ID | None = None
    session_id: _ID | None = None
    choice: Annotated[int, Field(ge=0)] | None = None
    """The index of the choice rewarded (a response with ``n`` > 1 answers: one reward each, GRPO)."""
    reward: float


class CommitRequest(_Strict):
    """``POST /v1/sessions/{session_id}/commit``: close a session, with its reward if known."""

    reward: float | None = None


# ---------------------------------------------------------------------------------------------- parsing
M = TypeVar("M", bound=BaseModel)


def parse_body(raw: bytes, content_type: str | None, model: type[M], *, optional: bool = False) -> M:
    """The request model in ``raw`` (JSON), or :class:`ApiError` (400 / 415) saying what is wrong.

    ``optional``: an empty body stands for ``{}`` (any content type)."""
    if optional and not raw.strip():
        return model.model_validate({})
    media = (content_type or "").split(";")[0].strip().lower()
    if media != "application/json":
        raise ApiError(
            415,
            f"Content-Type {content_type!r} is not supported; send the body as JSON with "
            "'Content-Type: application/json'.",
        )
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as err:
        detail = err.msg if isinstance(err, json.JSONDecodeError) else type(err).__name__
        raise ApiError(400, f"the request body is not valid JSON ({detail}); send one JSON object.") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the request body is a JSON {type(data).__name__}; send one JSON object.")
    if _SURROGATE.search(raw):
        _check_unicode(data)
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise validation_error(err, model) from None
    except RecursionError:
        raise ApiError(400, "the request body is nested too deeply; send a flat JSON object.") from None


def _check_unicode(data: Any) -> None:
    """Refuse text with a lone UTF-16 surrogate (``\\ud800`` without its pair): no tokenizer can read it."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise ApiError(
            400,
            "the request body holds a lone UTF-16 surrogate escape (\\ud800-\\udfff without its pair); "
            "send valid Unicode text.",
        ) from None


def validation_error(err: ValidationError, model: type[BaseModel]) -> ApiError:
    """The first field pydantic refused, as an :class:`ApiError` naming it, the value and the fix."""
    errors = err.errors(include_url=False)
    param = _param(errors[0]["loc"])
    same = [e for e in errors if _param(e["loc"]) == param]
    first = same[0]
    if first["type"] == "extra_forbidden":
        known = ", ".join(sorted(model.model_fields)) if len(first["loc"]) == 1 else ""
        hint = f"; accepted fields: {known}" if known else ""
        return ApiError(400, f"unknown field {param!r}: remove it{hint}.", param=param)
    if first["type"] == "missing":
        return ApiError(400, f"{param!r} is required; add it to the request.", param=param)
    reasons = " or ".join(dict.fromkeys(_lower(e["msg"].replace("Input should", "it should")) for e in same))
    value = _short(first.get("input"))
    return ApiError(400, f"{param}={value} is invalid: {reasons}; fix {param!r}.", param=param)


def _param(loc: tuple[Any, ...]) -> str:
    """``messages.0.content`` from a pydantic location (dropping union branch tags such as ``str``)."""
    tags = {"str", "int", "float", "bool", "none", "list", "dict", "literal"}
    parts = []
    for part in loc:
        if isinstance(part, int):
            parts.append(str(part))
        elif isinstance(part, str) and part not in tags and "[" not in part and not part[:1].isupper():
            parts.append(part)
    return ".".join(parts) or "body"


def _lower(text: str) -> str:
    return text[:1].lower() + text[1:]


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = [
    "ApiError",
    "ChatRequest",
    "CommitRequest",
    "CompletionRequest",
    "FeedbackRequest",
    "Message",
    "ServeSettings",
    "ToolDef",
    "parse_body",
    "validation_error",
]
