"""``Idempotency-Key``: a request retried with the same key gets the first answer, recorded once.

A client that lost an answer (a dropped connection, a timeout) sends the request again with the same
``Idempotency-Key`` header (any text of 1 to 256 printable ASCII characters, e.g. a UUID per logical
request). The key names one request of one endpoint:

- the response id is derived from the endpoint and the key (:func:`keyed_response_id`), so every try
  of it, on any server of the run, answers with the same id;
- :class:`Replays` keeps the answers of the last ``serve.idempotency_keys`` keys in memory. A retry
  that arrives while the first try still generates waits for it; a retry after it gets its answer
  again, nothing sampled or recorded twice. A first try that failed (an error answer) is not kept: the
  retry runs again;
- a key this process does not remember is looked up in the buffer (:func:`answer_from_rows`): a
  recorded call without a session is found there after the memory forgot it, or after a restart. (A
  session's turn, or a ``record: false`` call, is kept in memory only.)

The same key with a different request body (compared by :func:`fingerprint`) is refused with 422.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trine.serve.responses import Answer
from trine.serve.schemas import ApiError
from trine.types import Completion, Experience

if TYPE_CHECKING:
    from pydantic import BaseModel
    from starlette.requests import Request

HEADER = "Idempotency-Key"
MAX_KEY = 256


def idempotency_key(request: Request) -> str | None:
    """The request's ``Idempotency-Key`` (None: not sent), or 400 if it is empty, too long or not text."""
    key = request.headers.get(HEADER)
    if key is None:
        return None
    if not 0 < len(key) <= MAX_KEY or not key.isascii() or not key.isprintable():
        raise ApiError(
            400,
            f"header {HEADER}={key[:40]!r} is not a key: send 1 to {MAX_KEY} printable ASCII characters "
            "(e.g. a UUID), the same for every try of one request.",
            param=HEADER,
        )
    return key


def keyed_response_id(prefix: str, endpoint: str, key: str) -> str:
    """The response id of every try of the request ``key`` names on ``endpoint``."""
    return prefix + hashlib.sha256(f"{endpoint}\n{key}".encode()).hexdigest()[:32]


def fingerprint(req: BaseModel) -> str:
    """What must be the same in every try of one key: the parsed request, hashed."""
    return hashlib.sha256(req.model_dump_json().encode()).hexdigest()


def reused(key: str) -> ApiError:
    """422: the key came with another request before."""
    return ApiError(
        422,
        f"{HEADER} {key[:40]!r} was sent before with a different request; a key names one request: send "
        "a new key for a new request.",
        param=HEADER,
    )


@dataclass
class _Entry:
    fingerprint: str
    answered: asyncio.Future[Answer | None]
    """The answer, or None once the try failed (the entry is gone then)."""


class Replays:
    """The answers of keyed requests by response id, the newest ``size`` kept (see the module docstring)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.entries: OrderedDict[str, _Entry] = OrderedDict()
        self.replayed = 0
        """Retries answered with an earlier answer (memory or buffer)."""

    async def answer(
        self,
        response_id: str,
        key: str,
        print_: str,
        find: Callable[[], Awaitable[Answer | None]],
        compute: Callable[[], Awaitable[Answer]],
    ) -> Answer:
        """The answer of ``response_id``: remembered, else ``find()`` (the buffer), else ``compute()``.
        ``print_`` is the request's :func:`fingerprint`; another one for the same key is refused (422)."""
        while (entry := self.entries.get(response_id)) is not None:
            if entry.fingerprint != print_:
                raise reused(key)
            earlier = await asyncio.shield(entry.answered)
            if earlier is not None:
                self.replayed += 1
                return earlier
            # the try this one waited for failed and is forgotten: this one runs (or waits for another)
        entry = _Entry(print_, asyncio.get_running_loop().create_future())
        self.entries[response_id] = entry
        try:
            found = await find()
            if found is not None:
                self.replayed += 1
            result = found if found is not None else await compute()
        except BaseException:
            if self.entries.get(response_id) is entry:
                del self.entries[response_id]
            entry.answered.set_result(None)
            raise
        entry.answered.set_result(result)
        self._trim()
        return result

    def _trim(self) -> None:
        for old in list(self.entries):
            if len(self.entries) <= self.size:
                return
            if self.entries[old].answered.done():
                del self.entries[old]


def answer_from_rows(answer: Answer, rows: list[Experience], key: str, print_: str) -> Answer:
    """``answer`` (built from the retried request) filled with what the buffer recorded for its first try:
    one row per choice, in choice order. 422 if the first try was another request."""
    if rows[0].info.get("request_sha256") != print_:
        raise reused(key)
    answer.prompt_ids = list(rows[0].tokens[: rows[0].prompt_length])
    answer.completions = [
        Completion(
            prompt_ids=answer.prompt_ids,
            response_ids=list(e.response_tokens),
            logprobs=list(e.logprobs or []),
            text=str(e.info.get("response", "")),
            finish_reason=str(e.info.get("finish_reason", "stop")),
            policy_version=e.policy_version,
            token_versions=e.info.get("token_versions"),
        )
        for e in rows
    ]
    answer.policy_version = min(e.policy_version for e in rows)
    return answer


__all__ = [
    "HEADER",
    "Replays",
    "answer_from_rows",
    "fingerprint",
    "idempotency_key",
    "keyed_response_id",
    "reused",
]
