"""A bounded fuzz of ``trine serve`` over real HTTP: a few hundred malformed requests (garbage bytes, random
JSON, wrong types, huge numbers, deep nesting, lone surrogates, wrong content types, every endpoint), each
answered with a 4xx OpenAI error body in time — never a 5xx, never a hang — and a good request after them
still succeeds."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="trine serve needs fastapi (pip install 'trine[dev]')")
pytest.importorskip("uvicorn", reason="trine serve needs uvicorn (pip install 'trine[dev]')")
httpx = pytest.importorskip("httpx")

from tests.helpers import GOOD_CHAT, SERVE_MODEL, serving  # noqa: E402
from trine.buffer import MemoryBuffer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# Values each field must refuse (none of them may ever reach the engine).
INVALID: dict[str, list[Any]] = {
    "model": [1, None, [], {}, "x" * 300],
    "messages": [
        "hi", [1], [], [{"role": "user"}], [{"content": "x"}], [{"role": "user", "content": {"a": 1}}],
        [{"role": "user", "content": [{"type": "x"}]}],
        [{"role": "tool", "content": "x", "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": ""}}]}],  # noqa: E501
        [{"role": "assistant", "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "[1]"}}]}],
        [{"role": "user", "content": "x" * 5000}], [{"role": "user", "content": "x", "extra": 1}],
    ],
    "n": [0, -1, 10**30, 1.5, "2", True, 99],
    "temperature": [-1, 3, "1", [1], 1e308, False],
    "top_p": [0, 1.5, -0.1, "x"],
    "top_k": [-2, 10**30, 1.5],
    "max_tokens": [0, -5, 10**40, 2.5, "10", 17],
    "stop": [1, [1], "", [""], ["a"] * 20, {"a": 1}],
    "seed": [-1, 2**64, 1.5, "1"],
    "stream": ["yes", 1, None],
    "logprobs": ["true", 2],
    "top_logprobs": [-1, 21, 3],
    "session_id": ["", 5, "x" * 300],
    "tools": ["add", [1], [{"type": "function"}], [{"type": "x", "function": {"name": "a"}}]],
    "tool_choice": ["required", {"type": "function"}],
    "response_format": [{"type": "json_object"}],
    "presence_penalty": [0.5, "0"],
    "return_token_ids": ["yes"],
}  # fmt: skip
COMPLETION_INVALID: dict[str, list[Any]] = {
    "prompt": [[], "", [-1], [10**9], [1.5], {"a": 1}, ["a", "b"], [[1, 2]], None],
    "logprobs": [3, -1, True],
    "echo": [True],
    "max_tokens": [0, 10**6],
}
RAW = [
    b"", b"{", b"}", b"null", b"[]", b"42", b'"text"', b"\xff\xfe\x00garbage", b"{'single': 'quotes'}",
    b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}',
    b"[" * 100_000 + b"]" * 100_000, b'{"n": ' + b"9" * 5000 + b"}", b'{"a": NaN}', b'{"a": Infinity}',
    json.dumps({**GOOD_CHAT, "temperature": float("nan")}).encode(),
]  # fmt: skip
PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/feedback", "/v1/sessions/zz/commit"]


def cases(rng: random.Random) -> list[tuple[str, bytes, str]]:
    """``(path, body, content type)``: every listed invalid value, then random garbage, ~350 in all."""
    out = []
    for field, values in INVALID.items():
        out += [
            ("/v1/chat/completions", json.dumps({**GOOD_CHAT, field: v}).encode(), "application/json")
            for v in values
        ]
    completion = {"model": SERVE_MODEL, "prompt": "hi", "max_tokens": 2}
    for field, values in COMPLETION_INVALID.items():
        out += [
            ("/v1/completions", json.dumps({**completion, field: v}).encode(), "application/json")
            for v in values
        ]
    out += [(path, raw, "application/json") for path in PATHS for raw in RAW]
    for _ in range(200):
        path = rng.choice(PATHS)
        kind = rng.random()
        if kind < 0.3:
            body = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
        elif kind < 0.6:
            body = json.dumps({_word(rng): _junk(rng, 3) for _ in range(rng.randrange(1, 5))}).encode()
        elif kind < 0.8:
            body = json.dumps({**GOOD_CHAT, rng.choice(list(INVALID)): _junk(rng, 2), _word(rng): 1}).encode()
        else:
            body = json.dumps(_junk(rng, 4)).encode()
        ctype = rng.choice(["application/json"] * 3 + ["text/plain", "application/x-www-form-urlencoded", ""])
        out.append((path, body, ctype))
    out += [
        (
            "/v1/feedback",
            json.dumps({"response_id": _word(rng), "reward": rng.random()}).encode(),
            "application/json",
        )
    ]
    return out


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randrange(6, 12))) + "_x"


def _junk(rng: random.Random, depth: int) -> Any:
    choice = rng.randrange(8 if depth > 0 else 6)
    if choice == 0:
        return rng.choice([None, True, False])
    if choice == 1:
        return rng.choice([0, -1, 2**70, -(2**70), 7])
    if choice == 2:
        return rng.choice([0.5, -1e308, 1e-320, 3.0])
    if choice == 3:
        return "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(0, 30)))
    if choice in (4, 5):
        return _word(rng)
    if choice == 6:
        return [_junk(rng, depth - 1) for _ in range(rng.randrange(0, 4))]
    return {_word(rng): _junk(rng, depth - 1) for _ in range(rng.randrange(0, 4))}


def test_hundreds_of_malformed_requests_get_4xx_and_the_server_still_answers(engine):
    started = time.monotonic()
    with (
        serving(engine, MemoryBuffer()) as s,
        httpx.Client(base_url=s.url, timeout=5) as client,
    ):
        requests = cases(random.Random(0))
        assert len(requests) >= 300
        statuses = []
        for path, body, ctype in requests:
            resp = client.post(path, content=body, headers={"content-type": ctype} if ctype else {})
            statuses.append(resp.status_code)
            assert 400 <= resp.status_code < 500, (path, body[:200], resp.status_code, resp.text[:300])
            error = resp.json()["error"]
            assert error["message"] and error["type"] in ("invalid_request_error", "authentication_error")
        good = client.post("/v1/chat/completions", json=GOOD_CHAT)
        assert good.status_code == 200 and good.json()["choices"][0]["message"]["role"] == "assistant"
        metrics = s.server.metrics()
        assert metrics["serve/rejected"] == len(requests) and metrics["serve/completion_tokens"] > 0
        assert {400, 404, 415} <= set(statuses)
    assert time.monotonic() - started < 30
