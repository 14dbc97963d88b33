"""The HTTP layer of ``trine serve``: an OpenAI-compatible API in front of the rollout engine.

:func:`create_app` returns a FastAPI app (fastapi is imported only there) with

- ``GET /v1/models``, ``GET /health`` (with the ``policy_version`` being served);
- ``POST /v1/chat/completions`` and ``POST /v1/completions`` (OpenAI wire format, streaming included;
  extensions ``session_id``, ``task_id``, ``return_token_ids``, ``top_k``);
- ``POST /v1/feedback`` (a reward for a response or a session, once) and
  ``POST /v1/sessions/{session_id}/commit``.

Every call is recorded by the :class:`~trine.serve.sessions.SessionStore` (see there). Requests reach the
engine concurrently (it batches them); at most ``max_concurrent`` generate at once, ``max_queue`` more
wait, any more get 429. Every refusal is an OpenAI error body naming the field; an engine error fails
only its own request (500); a request that waits past ``request_timeout`` gets 504. With ``api_key``
set, ``/v1`` routes need ``Authorization: Bearer <key>`` (compared in constant time). Counters for the
monitor: :meth:`OpenAIServer.metrics` (``app.state.server``).

A prompt is bounded by its characters before it is tokenized (``max_prompt_tokens`` x
``max_chars_per_token``), and tokenized on a worker thread, so one huge prompt never stalls the others.
A completion request with an ``Idempotency-Key`` header is answered once (:mod:`trine.serve.idempotency`).
A client that disconnects before its request is read is logged as one line (no traceback).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from trine.blocking import run_blocking
from trine.serve.idempotency import (
    Replays,
    answer_from_rows,
    fingerprint,
    idempotency_key,
    keyed_response_id,
)
from trine.serve.limits import (
    Gate,
    bad,
    check_auth,
    check_chat,
    check_model,
    check_prompt,
    check_prompt_text,
    completion_prompt,
    read_body,
    sampling_params,
)
from trine.serve.render import render_prompt, template_messages
from trine.serve.responses import Answer, chat_body, chat_chunks, completion_body, completion_chunks, sse
from trine.serve.schemas import (
    ApiError,
    ChatRequest,
    CommitRequest,
    CompletionRequest,
    FeedbackRequest,
    ServeSettings,
    parse_body,
)
from trine.serve.sessions import SessionStore
from trine.types import Completion, SamplingParams

if TYPE_CHECKING:
    from fastapi import FastAPI
    from pydantic import BaseModel
    from starlette.requests import Request
    from starlette.responses import Response

log = logging.getLogger("trine.serve")
M = TypeVar("M", bound="BaseModel")

_ALWAYS = (
    "requests",
    "requests_chat",
    "requests_completions",
    "prompt_tokens",
    "completion_tokens",
    "rejected",
)
_REASONS = {
    400: "bad_request", 401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 409: "conflict",
    410: "gone", 413: "too_large", 415: "unsupported_media_type", 422: "idempotency_key_reused",
    429: "too_many_requests",
    500: "engine_error", 503: "unavailable", 504: "timeout",
}  # fmt: skip


class Sampler(Protocol):
    """What the server uses of a rollout engine (``trine.models.engine.HFEngine`` or any engine)."""

    tokenizer: Any
    policy_version: int

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]: ...


class OpenAIServer:
    """The endpoints' logic over one engine, one recorder and the settings (see the module docstring)."""

    def __init__(self, engine: Sampler, recorder: SessionStore, settings: ServeSettings) -> None:
        self.engine = engine
        self.store = recorder
        self.settings = settings
        self.tokenizer = engine.tokenizer
        self.gate = Gate(settings.max_concurrent, settings.max_queue)
        self.replays = Replays(settings.idempotency_keys)
        self.counts: Counter[str] = Counter()
        self.started = int(time.time())

    # ------------------------------------------------------------------ endpoints
    async def models(self, request: Request) -> dict[str, Any]:
        check_auth(request, self.settings.api_key)
        name = self.settings.model_name
        card = {
            "id": name,
            "object": "model",
            "created": self.started,
            "owned_by": "trine",
            "policy_version": self.engine.policy_version,  # the weights it serves now (an extension)
        }
        return {"object": "list", "data": [card]}

    async def health(self, request: Request) -> dict[str, Any]:
        version = self.engine.policy_version
        return {"status": "ok", "model": self.settings.model_name, "policy_version": version}

    async def chat(self, request: Request) -> Answer:
        req = await self._parse(request, ChatRequest)
        self.counts["requests_chat"] += 1
        check_model(req.model, self.settings.model_name)
        params = sampling_params(req, self.settings, req.max_completion_tokens)
        check_chat(req)
        check_prompt_text(req, self.settings)
        messages = template_messages(req.messages, self.tokenizer)
        tools = None
        if req.tools and req.tool_choice != "none":
            tools = [t.model_dump(exclude_none=True) for t in req.tools]
        key = idempotency_key(request)
        answer = self._answer(
            "chatcmpl-", req, params, request, key, tools=bool(tools), logprobs=req.logprobs
        )

        async def run(info: dict[str, Any]) -> None:
            if req.session_id is not None:
                return await self._session_turn(answer, params, req, messages, tools)
            prompt = await run_blocking(render_prompt, self.tokenizer, messages, tools)  # off the event loop
            answer.prompt_ids = check_prompt(prompt, self.settings.max_prompt_tokens, "messages")
            await self._sample_and_record(answer, params, req, {"endpoint": "chat", **info})

        return await self._once(answer, req, key, run)

    async def _session_turn(
        self,
        answer: Answer,
        params: SamplingParams,
        req: ChatRequest,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
    ) -> None:
        assert req.session_id is not None
        limit = self.settings.max_prompt_tokens
        opened = self.store.turn(
            req.session_id, messages, tools, task_id=req.task_id, user=req.user, max_prompt_tokens=limit
        )
        async with opened as turn:
            answer.prompt_ids, answer.session_id, answer.turn = turn.prompt_ids, req.session_id, turn.turn
            answer.completions = await self._generate(turn.prompt_ids, params)
            answer.policy_version = self._version(answer.completions)
            self.store.complete(turn, answer.completions[0], answer.response_id, answer.policy_version)

    async def completions(self, request: Request) -> Answer:
        req = await self._parse(request, CompletionRequest)
        self.counts["requests_completions"] += 1
        check_model(req.model, self.settings.model_name)
        params = sampling_params(req, self.settings)
        check_prompt_text(req, self.settings)
        key = idempotency_key(request)
        answer = self._answer(
            "cmpl-", req, params, request, key, tools=False, logprobs=req.logprobs is not None
        )

        async def run(info: dict[str, Any]) -> None:
            prompt = await run_blocking(completion_prompt, req, self.tokenizer)  # off the event loop
            answer.prompt_ids = check_prompt(prompt, self.settings.max_prompt_tokens, "prompt")
            await self._sample_and_record(answer, params, req, {"endpoint": "completions", **info})

        return await self._once(answer, req, key, run)

    async def feedback(self, request: Request) -> dict[str, Any]:
        req = await self._parse(request, FeedbackRequest)
        if (req.response_id is None) == (req.session_id is None):
            raise bad(
                "response_id",
                "feedback names a response or a session: give exactly one of response_id and session_id.",
            )
        if req.choice is not None and req.response_id is None:
            raise bad("choice", "choice names a choice of a response: give response_id with it.")
        return await self.store.feedback(
            response_id=req.response_id, session_id=req.session_id, reward=req.reward, choice=req.choice
        )

    async def commit(self, request: Request) -> dict[str, Any]:
        req = await self._parse(request, CommitRequest, optional=True)
        return await self.store.commit(request.path_params["session_id"], req.reward)

    def metrics(self) -> dict[str, float]:
        """Flat ``serve/*`` counters and gauges: requests, tokens, rejected by reason, sessions, feedback."""
        out = {f"serve/{name}": float(value) for name, value in sorted(self.counts.items())}
        for name in _ALWAYS:
            out.setdefault(f"serve/{name}", 0.0)
        out["serve/idempotent_replays"] = float(self.replays.replayed)
        out["serve/generating"] = float(self.gate.active)
        out["serve/queued"] = float(self.gate.waiting)
        out["serve/policy_version"] = float(self.engine.policy_version)
        out.update(self.store.metrics())
        return out

    # ------------------------------------------------------------------ helpers
    def _answer(
        self,
        prefix: str,
        req: Any,
        params: SamplingParams,
        request: Request,
        key: str | None,
        *,
        tools: bool,
        logprobs: bool,
    ) -> Answer:
        rid = prefix + uuid.uuid4().hex if key is None else keyed_response_id(prefix, request.url.path, key)
        return Answer(
            response_id=rid,
            model=self.settings.model_name,
            created=int(time.time()),
            prompt_ids=[],
            completions=[],
            policy_version=self.engine.policy_version,
            stop=list(params.stop),
            return_token_ids=req.return_token_ids,
            logprobs=logprobs,
            parse_tools=tools,
            include_usage=bool(req.stream_options and req.stream_options.include_usage),
            stream=req.stream,
        )

    async def _once(
        self,
        answer: Answer,
        req: ChatRequest | CompletionRequest,
        key: str | None,
        run: Callable[[dict[str, Any]], Awaitable[None]],
    ) -> Answer:
        """``run(info)`` fills ``answer``; with an Idempotency-Key, once per key (``info`` records it)."""
        if key is None:
            await run({})
            return answer
        print_ = fingerprint(req)

        async def find() -> Answer | None:
            if not req.record or getattr(req, "session_id", None) is not None:
                return None  # kept in memory only
            rows = [e for e, _ in await self.store.find_response(answer.response_id)]
            return answer_from_rows(answer, rows, key, print_) if rows else None

        async def compute() -> Answer:
            await run({"idempotency_key": key, "request_sha256": print_})
            return answer

        return await self.replays.answer(answer.response_id, key, print_, find, compute)

    async def _sample_and_record(
        self,
        answer: Answer,
        params: SamplingParams,
        req: ChatRequest | CompletionRequest,
        info: dict[str, Any],
    ) -> None:
        answer.completions = await self._generate(answer.prompt_ids, params)
        answer.policy_version = self._version(answer.completions)
        if not req.record:
            self.counts["unrecorded"] += 1
            return
        if req.user is not None:
            info["user"] = req.user
        await self.store.record_response(
            answer.response_id,
            answer.prompt_ids,
            answer.completions,
            task_id=req.task_id,
            version=answer.policy_version,
            info=info,
        )

    async def _generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        timeout = self.settings.request_timeout
        async with self.gate.slot():
            try:
                completions = await asyncio.wait_for(self.engine.generate(prompt_ids, params), timeout)
            except TimeoutError:
                message = (
                    f"the engine did not answer within request_timeout={timeout:g} s; retry, or ask for less."
                )
                raise ApiError(504, message, kind="server_error") from None
            except Exception as err:
                log.exception("trine serve: the engine failed on one request")
                message = (
                    f"the engine failed on this request ({type(err).__name__}: {err}); other requests go on."
                )
                raise ApiError(500, message, kind="server_error") from None
        if len(completions) != params.n:
            message = f"the engine returned {len(completions)} completions for n={params.n}."
            raise ApiError(500, message, kind="server_error")
        self.counts["prompt_tokens"] += len(prompt_ids)
        self.counts["completion_tokens"] += sum(len(c.response_ids) for c in completions)
        return completions

    async def _parse(self, request: Request, model: type[M], *, optional: bool = False) -> M:
        check_auth(request, self.settings.api_key)
        body = await read_body(request, self.settings.max_body_bytes)
        return parse_body(body, request.headers.get("content-type"), model, optional=optional)

    def _version(self, completions: list[Completion]) -> int:
        versions = [c.policy_version for c in completions if c.policy_version is not None]
        return min(versions) if versions else self.engine.policy_version

    def count_error(self, status: int) -> None:
        """Count one refused or failed request by reason (``serve/rejected_<reason>``)."""
        self.counts["rejected"] += 1
        self.counts[f"rejected_{_REASONS.get(status, str(status))}"] += 1


def create_app(engine: Sampler, recorder: SessionStore, settings: ServeSettings) -> FastAPI:
    """The FastAPI app of ``trine serve`` (its :class:`OpenAIServer` is ``app.state.server``)."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    server = OpenAIServer(engine, recorder, settings)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(_expire_loop(recorder, settings.session_timeout))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await recorder.aclose()

    app = FastAPI(title="trine serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    routes: list[tuple[str, str, Callable[[Request], Awaitable[Any]]]] = [
        ("/health", "GET", server.health),
        ("/v1/models", "GET", server.models),
        ("/v1/chat/completions", "POST", server.chat),
        ("/v1/completions", "POST", server.completions),
        ("/v1/feedback", "POST", server.feedback),
        ("/v1/sessions/{session_id}/commit", "POST", server.commit),
    ]
    for path, method, handler in routes:
        app.router.add_route(path, _endpoint(server, handler), methods=[method])

    async def http_error(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 500)
        paths = ", ".join(f"{method} {path}" for path, method, _ in routes)
        message = (
            f"{request.method} {request.url.path}: {getattr(exc, 'detail', exc)}; the endpoints are {paths}."
        )
        return _error(server, ApiError(status, message))

    async def invalid(request: Request, exc: Exception) -> Response:
        # FastAPI's 422 (a route added on top of this app with typed parameters) as the OpenAI 400
        errors = list(getattr(exc, "errors", list)())
        loc = [
            str(x) for x in (errors[0].get("loc", ()) if errors else ()) if x not in ("body", "query", "path")
        ]
        param = ".".join(loc) or None
        detail = errors[0].get("msg", "invalid value") if errors else "invalid request"
        return _error(
            server, ApiError(400, f"{param or 'the request'}: {detail}; fix {param!r}.", param=param)
        )

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(RequestValidationError, invalid)
    return app


def _endpoint(
    server: OpenAIServer, handler: Callable[[Request], Awaitable[Any]]
) -> Callable[[Request], Awaitable[Response]]:
    """Wrap a handler: count it, turn its result into JSON or a stream and any refusal into an error body."""
    from starlette.requests import ClientDisconnect
    from starlette.responses import JSONResponse, Response, StreamingResponse

    async def endpoint(request: Request) -> Response:
        server.counts["requests"] += 1
        try:
            result = await handler(request)
            if not isinstance(result, Answer):
                return JSONResponse(result)
            if result.stream:  # built whole before the first byte goes out: a failure is still a 500
                chunks = list(_chunks(result, server.tokenizer))
                return StreamingResponse(sse(iter(chunks)), media_type="text/event-stream")
            return JSONResponse(_body(result, server.tokenizer))
        except ApiError as err:
            return _error(server, err)
        except ClientDisconnect:  # it hung up before sending its whole request: nobody reads an answer
            server.counts["client_disconnects"] += 1
            what = f"{request.method} {request.url.path}"
            log.warning("trine serve: %s: the client disconnected before sending its whole request", what)
            return Response(status_code=400)
        except Exception as err:  # a bug must fail this request only, with the OpenAI error body
            log.exception("trine serve: %s %s failed", request.method, request.url.path)
            message = f"internal error ({type(err).__name__}: {err})."
            return _error(server, ApiError(500, message, kind="server_error"))

    return endpoint


def _body(answer: Answer, tokenizer: Any) -> dict[str, Any]:
    chat = answer.response_id.startswith("chatcmpl-")
    return chat_body(answer, tokenizer) if chat else completion_body(answer, tokenizer)


def _chunks(answer: Answer, tokenizer: Any) -> Iterator[dict[str, Any]]:
    chat = answer.response_id.startswith("chatcmpl-")
    return chat_chunks(answer, tokenizer) if chat else completion_chunks(answer, tokenizer)


def _error(server: OpenAIServer, err: ApiError) -> Response:
    from starlette.responses import JSONResponse

    server.count_error(err.status)
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


async def _expire_loop(store: SessionStore, timeout: float) -> None:
    """Write idle sessions every ``min(1 s, timeout / 4)``; a failing write is logged and retried."""
    interval = max(0.02, min(1.0, timeout / 4))
    while True:
        await asyncio.sleep(interval)
        try:
            await store.expire()
        except Exception:
            log.exception("trine serve: writing expired sessions failed (retried at the next check)")


__all__ = ["OpenAIServer", "Sampler", "create_app"]
