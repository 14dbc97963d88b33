"""``trine serve`` against hostile and unlucky clients (issue 25), over real HTTP: a huge prompt, a slow
tokenizer, a client that hangs up mid-request, retries with an ``Idempotency-Key``; and, with real
``trine serve`` processes, a server killed with ``kill -9`` and started again on its run directory, and
a keep-alive connection reused after an idle pause."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

pytest.importorskip("fastapi", reason="trine serve needs fastapi (pip install 'trine[dev]')")
pytest.importorskip("uvicorn", reason="trine serve needs uvicorn (pip install 'trine[dev]')")
openai = pytest.importorskip("openai", reason="the tests speak to the server with the openai client")
httpx = pytest.importorskip("httpx")

from tests.helpers import GOOD_CHAT, SERVE_MODEL, serve_settings, served_url, serving, trine  # noqa: E402
from trine.buffer import MemoryBuffer, SQLBuffer  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HUGE = "hello world " * 500_000
"""6 MB of text: under the 8 MiB body limit, tokenized in ~6 s by the tiny model's tokenizer."""


def _in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    """Start ``fn()`` in a thread; the dict gets its ``result`` and ``seconds``."""
    out: dict[str, Any] = {}

    def run() -> None:
        start = time.monotonic()
        out["result"] = fn()
        out["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _timed(fn: Any) -> tuple[Any, float]:
    start = time.monotonic()
    return fn(), time.monotonic() - start


# ------------------------------------------------------------------------------------------- item 5
@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {**GOOD_CHAT, "messages": [{"role": "user", "content": HUGE}]}, "messages"),
        ("/v1/completions", {"model": SERVE_MODEL, "prompt": HUGE, "max_tokens": 2}, "prompt"),
        ("/v1/completions", {"model": SERVE_MODEL, "prompt": [1] * 200_000, "max_tokens": 2}, "prompt"),
    ],
    ids=["chat", "text", "token-ids"],
)
def test_a_huge_prompt_is_refused_at_once_while_a_small_request_is_answered(engine, path, body, param):
    """The prompt limit is checked on characters before tokenizing: a 6 MB prompt (which took the whole
    event loop for seconds while it was tokenized) gets 400 at once, and others are answered meanwhile."""
    with serving(engine, MemoryBuffer()) as s:
        thread, huge = _in_thread(lambda: s.post(path, body))
        time.sleep(0.3)  # the huge request is being sent / handled
        small, seconds = _timed(lambda: s.post("/v1/chat/completions", GOOD_CHAT))
        thread.join(60)
        assert small.status_code == 200 and seconds < 3, seconds
        refused = huge["result"]
        assert refused.status_code == 400 and huge["seconds"] < 3, (refused.status_code, huge["seconds"])
        error = refused.json()["error"]
        assert error["param"] == param and "max_prompt_tokens=300" in error["message"], error


class _SlowTemplate:
    """The real tokenizer, except that rendering a chat that says ``slow`` blocks for 3 s (a big prompt
    under the limit, or a slow template): a blocking call, as tokenizing is."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def __len__(self) -> int:
        return len(self._tokenizer)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._tokenizer(*args, **kwargs)

    def apply_chat_template(self, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
        if any("slow" in str(m.get("content")) for m in messages):
            time.sleep(3)
        return self._tokenizer.apply_chat_template(messages, **kwargs)


class _Engine:
    """``engine`` sampling, ``tokenizer`` tokenizing."""

    def __init__(self, engine: Any, tokenizer: Any) -> None:
        self.engine, self.tokenizer = engine, tokenizer

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    async def generate(self, prompt_ids: list[int], params: Any) -> Any:
        return await self.engine.generate(prompt_ids, params)


@pytest.mark.parametrize("session", [False, True], ids=["call", "session"])
def test_tokenizing_runs_off_the_event_loop(engine, session):
    """A prompt that takes seconds to render and tokenize holds up no other request."""
    extra = {"session_id": "slow-one"} if session else {}
    slow_chat = {**GOOD_CHAT, "messages": [{"role": "user", "content": "slow please"}], **extra}
    with serving(_Engine(engine, _SlowTemplate(engine.tokenizer)), MemoryBuffer()) as s:
        thread, slow = _in_thread(lambda: s.post("/v1/chat/completions", slow_chat))
        time.sleep(0.3)
        small, seconds = _timed(lambda: s.post("/v1/chat/completions", GOOD_CHAT))
        assert small.status_code == 200 and seconds < 1.5, seconds
        thread.join(60)
        assert slow["result"].status_code == 200 and slow["seconds"] >= 3


# ------------------------------------------------------------------------------------------ item 11
def test_a_client_that_hangs_up_mid_request_is_one_log_line(engine, caplog):
    """A client that sends half a request and closes its connection: one warning, no traceback, and
    the server goes on."""
    caplog.set_level(logging.WARNING, logger="trine.serve")
    with serving(engine, MemoryBuffer()) as s:
        address = urlparse(s.url)
        for _ in range(3):
            with socket.create_connection((address.hostname, address.port)) as sock:
                head = "POST /v1/feedback HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                sock.sendall(f'{head}Content-Length: 1000\r\n\r\n{{"response_id": '.encode())
                time.sleep(0.2)
        deadline = time.monotonic() + 10
        while len([r for r in caplog.records if r.name == "trine.serve"]) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        records = [r for r in caplog.records if r.name == "trine.serve"]
        assert len(records) == 3, [r.getMessage() for r in records]
        for record in records:
            assert record.levelno == logging.WARNING and record.exc_info is None, record.getMessage()
            assert record.getMessage() == (
                "trine serve: POST /v1/feedback: the client disconnected before sending its whole request"
            )
        assert s.server.metrics()["serve/client_disconnects"] == 3
        assert s.post("/v1/chat/completions", GOOD_CHAT).status_code == 200


def test_a_retried_request_with_an_idempotency_key_is_answered_and_recorded_once(engine):
    body = {**GOOD_CHAT, "max_tokens": 4, "temperature": 1.0}
    with serving(engine, MemoryBuffer()) as s:
        first = s.post("/v1/chat/completions", body, headers={"Idempotency-Key": "k-1"})
        again = s.post("/v1/chat/completions", body, headers={"Idempotency-Key": "k-1"})
        assert first.status_code == again.status_code == 200 and again.json() == first.json()
        assert s.buffer.metrics()["buffer/pending"] == 1

        # tries racing each other (a client retrying a request still generating): one is sampled
        text = {"model": SERVE_MODEL, "prompt": "Once", "max_tokens": 4, "temperature": 1.0}
        keyed = {"headers": {"Idempotency-Key": "k-2"}}
        threads = [_in_thread(lambda: s.post("/v1/completions", text, **keyed)) for _ in range(4)]
        answers = []
        for thread, out in threads:
            thread.join(30)
            answers.append(out["result"])
        assert {a.status_code for a in answers} == {200} and len({a.text for a in answers}) == 1
        assert s.buffer.metrics()["buffer/pending"] == 2

        reused = s.post("/v1/chat/completions", {**body, "max_tokens": 3}, headers={"Idempotency-Key": "k-1"})
        assert reused.status_code == 422 and reused.json()["error"]["param"] == "Idempotency-Key"
        client = s.client()
        via_openai = [
            client.chat.completions.create(**body, extra_headers={"Idempotency-Key": "k-3"}) for _ in range(2)
        ]
        assert via_openai[0].id == via_openai[1].id != first.json()["id"]
        fb = s.post("/v1/feedback", {"response_id": first.json()["id"], "reward": 1.0})
        assert fb.status_code == 200 and fb.json()["rewarded"] == 1
        assert (
            s.buffer.metrics()["buffer/pending"] == 2 and s.server.metrics()["serve/idempotent_replays"] == 5
        )
        too_long = s.post("/v1/chat/completions", body, headers={"Idempotency-Key": "k" * 300})
        assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "Idempotency-Key"


def test_a_key_the_memory_forgot_is_found_in_the_sql_buffer(engine, tmp_path):
    """Keys are bounded in memory (``serve.idempotency_keys``); a recorded call is found in the buffer after."""
    buffer = SQLBuffer(f"sqlite:///{tmp_path / 'buffer.db'}", poll_interval=0.02)
    settings = serve_settings().model_copy(update={"idempotency_keys": 1})
    body = {"model": SERVE_MODEL, "prompt": "Once upon", "max_tokens": 4, "n": 2, "return_token_ids": True}
    try:
        with serving(engine, buffer, settings) as s:
            first = s.post("/v1/completions", body, headers={"Idempotency-Key": "a"}).json()
            assert s.post("/v1/completions", body, headers={"Idempotency-Key": "b"}).status_code == 200
            assert len(s.server.replays.entries) == 1  # "a" is forgotten in memory
            again = s.post("/v1/completions", body, headers={"Idempotency-Key": "a"}).json()
            assert again["id"] == first["id"] and again["choices"] == first["choices"]
            assert again["prompt_token_ids"] == first["prompt_token_ids"] and again["usage"] == first["usage"]
            assert buffer.metrics()["buffer/pending"] == 4  # a and b, two choices each: a once
            other = s.post("/v1/completions", {**body, "n": 1}, headers={"Idempotency-Key": "a"})
            assert other.status_code == 422
    finally:
        buffer.close()


# ------------------------------------------------------------------------------ real server processes
def _serve_config(fault_config: Any) -> Path:
    overrides = {
        "mode": "async",
        "launch": "processes",
        "buffer": {"storage": "sql"},
        "serve": {"port": 0, "max_tokens": 8, "default_max_tokens": 4},
    }
    return fault_config(overrides, name="served")


def _start(config: Path) -> tuple[subprocess.Popen, str, list[str]]:
    """``trine serve CONFIG``, the URL it prints and the lines it printed before."""
    server, lines = trine("serve", str(config)), []
    return server, served_url(server, lines), lines


def _stop(server: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if server.poll() is None:
        os.killpg(server.pid, sig)
    server.communicate(timeout=60)


@pytest.mark.slow
def test_a_server_killed_and_started_again_takes_feedback_retries_and_sessions(fault_config):
    """``kill -9`` a server, start one on the same run directory: feedback for a response of the first is
    recorded once, a retried keyed request gets its first answer, and an open session goes on as one
    trajectory."""
    config = _serve_config(fault_config)
    run_dir = config.with_suffix("")
    server, url, _ = _start(config)
    try:
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
        call = client.completions.create(model="served", prompt="1+1=", max_tokens=3, n=2)
        keyed = {"model": "served", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
        retry = {"extra_headers": {"Idempotency-Key": "retry-me"}, "extra_body": {"return_token_ids": True}}
        first_try = client.chat.completions.create(**keyed, **retry)
        question = [{"role": "user", "content": "What is 2+3?"}]
        session = {"session_id": "agent-1", "return_token_ids": True}
        turn0 = client.chat.completions.create(
            model="served", messages=question, max_tokens=3, extra_body=session
        )
    finally:
        _stop(server, signal.SIGKILL)

    server, url, lines = _start(config)
    try:
        client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=60)
        post = lambda path, body: httpx.post(f"{url}{path}", json=body, timeout=60)  # noqa: E731
        fed = post("/feedback", {"response_id": call.id, "reward": 1.0})
        assert fed.status_code == 200 and fed.json()["rewarded"] == 2, fed.text
        assert post("/feedback", {"response_id": call.id, "reward": 0.0}).status_code == 409
        assert any("continuing 1 open session" in line for line in lines), lines

        second_try = client.chat.completions.create(**keyed, **retry)
        assert second_try.id == first_try.id
        assert second_try.choices[0].model_extra["token_ids"] == first_try.choices[0].model_extra["token_ids"]

        echoed = {"role": "assistant", "content": turn0.choices[0].message.content or ""}
        turn1 = client.chat.completions.create(
            model="served",
            messages=[*question, echoed, {"role": "user", "content": "And 3+4?"}],
            max_tokens=3,
            extra_body={"session_id": "agent-1", "return_token_ids": True},
        )
        assert turn1.model_extra["turn"] == 1
        sampled = turn0.model_extra["prompt_token_ids"] + turn0.choices[0].model_extra["token_ids"]
        assert turn1.model_extra["prompt_token_ids"][: len(sampled)] == sampled  # token for token
        committed = post("/sessions/agent-1/commit", {"reward": 0.5})
        assert committed.status_code == 200 and committed.json()["experiences"] == 1, committed.text
    finally:
        _stop(server)

    with sqlite3.connect(run_dir / "buffer.db") as db:  # the buffer's table (trine.buffer.sql_schema)
        rows = [
            (json.loads(info), reward) for info, reward in db.execute("SELECT info, reward FROM experiences")
        ]
    assert sorted(r for info, r in rows if info.get("response_id") == call.id) == [1.0, 1.0]
    assert len([info for info, _ in rows if info.get("response_id") == first_try.id]) == 1  # recorded once
    (session,) = [(info, r) for info, r in rows if info.get("session_id") == "agent-1"]
    assert session[0]["response_ids"] == [turn0.id, turn1.id] and session[1] == 0.5
    assert session[0]["turns"] == 2 and "session_closed" not in session[0]
    assert (run_dir / "servers" / "0" / "sessions.db").is_file()


def _get(sock: socket.socket, path: str) -> bytes:
    """One HTTP/1.1 GET on an open connection; its body (b"" if the server had closed it)."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"content-length: (\d+)", head.lower()).group(1))
    while len(body) < length:
        body += sock.recv(65536)
    return body


@pytest.mark.slow
def test_a_keep_alive_connection_is_reused_after_an_idle_pause(fault_config):
    """uvicorn's default keep-alive (5 s) closed a connection as a client reused it (the client saw a
    connection error); ``serve.keep_alive_timeout`` (default 30 s) keeps it open past that."""
    server, url, _ = _start(_serve_config(fault_config))
    try:
        address = urlparse(url)
        with socket.create_connection((address.hostname, address.port), timeout=30) as sock:
            assert json.loads(_get(sock, "/health"))["status"] == "ok"
            time.sleep(6.5)
            again = _get(sock, "/health")
            assert again and json.loads(again)["status"] == "ok"
    finally:
        _stop(server)
