"""``trine serve`` over real HTTP: a uvicorn server on a loopback port, the real HFEngine on the tiny model,
the official ``openai`` client for the good paths and httpx for the bad ones; experiences land in a real
MemoryBuffer (one test: the SQL buffer on a SQLite file)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="trine serve needs fastapi (pip install 'trine[dev]')")
pytest.importorskip("uvicorn", reason="trine serve needs uvicorn (pip install 'trine[dev]')")
openai = pytest.importorskip("openai", reason="the tests speak to the server with the openai client")
httpx = pytest.importorskip("httpx")

from tests.helpers import GOOD_CHAT, SERVE_MODEL, serving  # noqa: E402
from trine.buffer import BufferTimeout, MemoryBuffer, SQLBuffer  # noqa: E402
from trine.models.engine import HFEngine  # noqa: E402
from trine.serve import ServeSettings  # noqa: E402
from trine.tools import format_tool_call  # noqa: E402
from trine.types import Completion, SamplingParams  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}},
    },
}


# ---------------------------------------------------------------------------------------------- helpers
class Scripted:
    """An engine stand-in over the real tokenizer for what a random tiny model never does (call a tool,
    be slow, hang): its reply is ``policy(prompt text)`` + ``<|im_end|>``, logprob -0.5 per token, after
    ``delay`` seconds; a prompt containing ``hang`` waits 30 s."""

    def __init__(
        self, tokenizer: Any, policy: Callable[[str], str], *, delay: float = 0.0, hang: str | None = None
    ) -> None:
        self.tokenizer, self.policy, self.delay, self.hang = tokenizer, policy, delay, hang
        self.policy_version = 3

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        prompt = self.tokenizer.decode(prompt_ids)
        await asyncio.sleep(30 if self.hang is not None and self.hang in prompt else self.delay)
        full = self.tokenizer(self.policy(prompt), add_special_tokens=False)["input_ids"]
        full.append(self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
        ids = full[: params.max_tokens]
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        reason = "stop" if len(full) <= params.max_tokens else "length"
        return [
            Completion(list(prompt_ids), ids, [-0.5] * len(ids), text, reason, 3) for _ in range(params.n)
        ]


class Failing:
    """The real engine, except that a prompt containing ``boom`` raises inside ``generate``."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine, self.tokenizer = engine, engine.tokenizer

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        if "boom" in self.tokenizer.decode(prompt_ids):
            raise RuntimeError("CUDA error: device-side assert (simulated)")
        return await self.engine.generate(prompt_ids, params)


class Stalling(MemoryBuffer):
    """A memory buffer whose ``put`` hangs for ``stall`` seconds while ``stall`` is set."""

    stall = 0.0

    def put(self, experiences: list[Any]) -> None:
        time.sleep(self.stall)
        super().put(experiences)


def taken(buffer: Any, n: int) -> list[Any]:
    """The ``n`` trainable experiences the buffer hands out (fails if fewer are ready)."""
    return buffer.get(n, timeout=2)


def as_dict(message: Any) -> dict[str, Any]:
    """An assistant reply echoed back the way agents do (``message.model_dump()``, Nones dropped)."""
    return message.model_dump(exclude_none=True)


# ---------------------------------------------------------------------------------------------- fixtures
@pytest.fixture
def fresh_engine(model, tokenizer):
    """A new ``HFEngine`` (seed 0, policy version 0) over the module's model, for a test that changes the
    engine's version: the module's ``engine`` (tests/conftest.py) keeps serving version 0."""
    engine = HFEngine(model, tokenizer, seed=0)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def module_server(engine):
    with serving(engine, MemoryBuffer()) as s:
        yield s


@pytest.fixture
def served(module_server):
    """The module's server, its buffer holding no trainable experience: what a test rewards, it takes."""
    ready = int(module_server.buffer.metrics()["buffer/size"])
    if ready:
        module_server.buffer.get(ready, timeout=1)
    return module_server


# ---------------------------------------------------------------------------------------------- good paths
def test_models_and_health_name_the_model_and_policy_version(served, engine):
    assert [m.id for m in served.client().models.list().data] == [SERVE_MODEL]
    health = httpx.get(f"{served.url}/health").json()
    assert health["status"] == "ok" and health["policy_version"] == engine.policy_version == 0


def test_a_call_is_recorded_token_in_token_out_and_rewarded_once(served, tokenizer):
    client = served.client()
    resp = client.chat.completions.create(
        model=SERVE_MODEL,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+3?"}],
        n=2,
        max_tokens=5,
        temperature=1.0,
        logprobs=True,
        seed=7,
        user="alice",
        extra_body={"return_token_ids": True, "task_id": "q-7"},
    )
    extra = resp.model_extra
    assert extra["policy_version"] == 0 and len(resp.choices) == 2 and resp.usage.completion_tokens > 0
    prompt = extra["prompt_token_ids"]
    assert tokenizer.decode(prompt).endswith("What is 2+3?<|im_end|>\n<|im_start|>assistant\n")
    pending = served.buffer.metrics()["buffer/pending"]
    assert pending >= 2  # written at once, reward pending

    ok = served.post("/v1/feedback", {"response_id": resp.id, "reward": 1.0})
    assert ok.status_code == 200 and ok.json()["rewarded"] == 2
    again = served.post("/v1/feedback", {"response_id": resp.id, "reward": 0.0})
    assert again.status_code == 409 and again.json()["error"]["param"] == "response_id"

    exps = sorted(taken(served.buffer, 2), key=lambda e: e.info["choice_index"])
    for choice, exp in zip(resp.choices, exps):
        exp.check()
        ids = choice.model_extra["token_ids"]
        assert exp.tokens[: exp.prompt_length] == prompt and exp.response_tokens == ids
        assert exp.logprobs == [t.logprob for t in choice.logprobs.content] and exp.action_mask == [1] * len(
            ids
        )
        assert exp.reward == 1.0 and exp.task_id == exp.group_id == "q-7" and exp.policy_version == 0
        assert exp.info["response_id"] == resp.id and exp.info["user"] == "alice"
        assert exp.info["response"].startswith(choice.message.content)
    assert served.buffer.metrics()["buffer/pending"] == pending - 2  # filled once, nothing else touched
    with pytest.raises(BufferTimeout):
        served.buffer.get(1, timeout=0.05)  # the second feedback wrote nothing


def test_each_choice_gets_its_own_reward_once(served):
    """A group of answers (``n`` > 1) graded one by one, as GRPO needs: ``choice`` names the answer."""
    resp = served.client().chat.completions.create(
        model=SERVE_MODEL, messages=[{"role": "user", "content": "1+1="}], n=3, max_tokens=3, temperature=1.0
    )
    for i, reward in ((2, 0.0), (0, 1.0)):
        fb = served.post("/v1/feedback", {"response_id": resp.id, "choice": i, "reward": reward})
        assert fb.status_code == 200 and fb.json()["rewarded"] == 1
    twice = served.post("/v1/feedback", {"response_id": resp.id, "choice": 2, "reward": 1.0})
    assert twice.status_code == 409
    whole = served.post("/v1/feedback", {"response_id": resp.id, "reward": 1.0})  # 0 and 2 have theirs
    assert whole.status_code == 409
    beyond = served.post("/v1/feedback", {"response_id": resp.id, "choice": 3, "reward": 1.0})
    assert beyond.status_code == 400 and "has 3 choice(s)" in beyond.json()["error"]["message"]
    alone = served.post("/v1/feedback", {"session_id": "s", "choice": 0, "reward": 1.0})
    assert alone.status_code == 400 and alone.json()["error"]["param"] == "choice"
    assert (
        served.post("/v1/feedback", {"response_id": resp.id, "choice": 1, "reward": 0.5}).status_code == 200
    )
    exps = sorted(taken(served.buffer, 3), key=lambda e: e.info["choice_index"])
    assert [e.reward for e in exps] == [1.0, 0.5, 0.0]


def test_record_false_answers_without_recording(served):
    """What ``model.engine: openai`` sends: the explorer records its own experiences, not the server."""
    pending = served.buffer.metrics()["buffer/pending"]
    resp = served.client().chat.completions.create(
        model=SERVE_MODEL,
        messages=[{"role": "user", "content": "1+1="}],
        max_tokens=3,
        extra_body={"record": False},
    )
    assert resp.choices and served.buffer.metrics()["buffer/pending"] == pending
    assert served.post("/v1/feedback", {"response_id": resp.id, "reward": 1.0}).status_code == 404
    bad = {
        "model": SERVE_MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "record": False,
        "session_id": "s",
    }
    refused = served.post("/v1/chat/completions", bad)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "record"


def test_streaming_chunks_work_with_the_openai_client_and_end_with_done(served):
    stream = served.client().chat.completions.create(
        model=SERVE_MODEL,
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish in (["stop"], ["length"]) and chunks[-1].usage.completion_tokens > 0
    assert all(c.id == chunks[0].id and c.model_extra["policy_version"] == 0 for c in chunks)
    ids = [i for c in chunks if c.choices for i in c.choices[0].model_extra.get("token_ids") or []]
    assert len(ids) == chunks[-1].usage.completion_tokens and isinstance(text, str)
    raw = httpx.post(
        f"{served.url}/v1/chat/completions",
        json={"model": SERVE_MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True},
    )
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.text.rstrip().endswith("data: [DONE]")


def test_a_session_is_one_trajectory_with_observations_masked(served, tokenizer):
    client, sid = served.client(), "sess-a"
    pending = served.buffer.metrics()["buffer/pending"]
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Guess a number."}]
    replies = []
    for turn, hint in enumerate(["higher", "lower", None]):
        resp = client.chat.completions.create(
            model=SERVE_MODEL,
            messages=messages,
            max_tokens=4,
            logprobs=True,
            extra_body={"session_id": sid, "return_token_ids": True, "task_id": "guess"},
        )
        assert resp.model_extra["turn"] == turn and resp.model_extra["session_id"] == sid
        replies.append(resp)
        messages += [as_dict(resp.choices[0].message)]
        if hint:
            messages += [{"role": "user", "content": f"It is {hint}."}]
    # each call's prompt extends the previous prompt and reply token for token (history never re-tokenized)
    for before, after in zip(replies, replies[1:]):
        sent = before.model_extra["prompt_token_ids"] + before.choices[0].model_extra["token_ids"]
        assert after.model_extra["prompt_token_ids"][: len(sent)] == sent
    assert served.buffer.metrics()["buffer/pending"] == pending  # nothing written before the commit
    commit = served.post(f"/v1/sessions/{sid}/commit", {"reward": 0.5})
    assert commit.status_code == 200 and commit.json()["experiences"] == 1
    metrics = served.server.metrics()
    assert metrics["serve/sessions_opened"] >= 1 and metrics["serve/sessions_committed"] >= 1
    assert served.post(f"/v1/sessions/{sid}/commit", {"reward": 0.5}).status_code == 409
    assert served.post("/v1/feedback", {"session_id": sid, "reward": 1.0}).status_code == 409

    [exp] = taken(served.buffer, 1)
    exp.check()
    assert exp.reward == 0.5 and exp.task_id == exp.group_id == "guess" and exp.info["turns"] == 3
    assert exp.info["response_ids"] == [r.id for r in replies] and exp.info["session_id"] == sid
    sampled, observed, runs = [], [], []  # split the response into runs of equal mask
    for token, mask, logprob in zip(exp.response_tokens, exp.action_mask, exp.logprobs):
        if not runs or runs[-1][0] != mask:
            runs.append((mask, [], []))
        runs[-1][1].append(token)
        runs[-1][2].append(logprob)
    sampled = [r for r in runs if r[0] == 1]
    observed = [r for r in runs if r[0] == 0]
    assert [r[1] for r in sampled] == [r.choices[0].model_extra["token_ids"] for r in replies]
    assert [r[2] for r in sampled] == [[t.logprob for t in r.choices[0].logprobs.content] for r in replies]
    assert len(observed) == 2 and all(lp == 0.0 for r in observed for lp in r[2])
    assert "It is higher." in tokenizer.decode(observed[0][1]) and "It is lower." in tokenizer.decode(
        observed[1][1]
    )
    assert (
        exp.tokens
        == replies[2].model_extra["prompt_token_ids"] + replies[2].choices[0].model_extra["token_ids"]
    )


def test_a_session_across_a_weight_update_keeps_each_tokens_version(fresh_engine, model):
    with serving(fresh_engine, MemoryBuffer()) as s:
        first = s.client().chat.completions.create(**GOOD_CHAT, extra_body={"session_id": "w"})
        fresh_engine.load_weights(
            model.state_dict(), version=1
        )  # what the weight pick-up does between requests
        messages = [
            *GOOD_CHAT["messages"],
            as_dict(first.choices[0].message),
            {"role": "user", "content": "Two."},
        ]
        second = s.client().chat.completions.create(
            model=SERVE_MODEL, messages=messages, max_tokens=2, extra_body={"session_id": "w"}
        )
        assert (first.model_extra["policy_version"], second.model_extra["policy_version"]) == (0, 1)
        assert httpx.get(f"{s.url}/health").json()["policy_version"] == 1
        assert s.post("/v1/sessions/w/commit", {"reward": 1.0}).status_code == 200
        [exp] = taken(s.buffer, 1)
        assert exp.policy_version == 0 and set(exp.info["token_versions"]) == {0, 1}


def test_an_edited_history_forks_the_session_and_its_reward_fills_both(served):
    client, sid = served.client(), "sess-fork"
    first = client.chat.completions.create(
        model=SERVE_MODEL,
        messages=[{"role": "user", "content": "Start."}],
        max_tokens=3,
        extra_body={"session_id": sid},
    )
    edited = [
        {"role": "user", "content": "Start over, differently."},
        as_dict(first.choices[0].message),
        {"role": "user", "content": "Go on."},
    ]
    second = client.chat.completions.create(
        model=SERVE_MODEL, messages=edited, max_tokens=3, extra_body={"session_id": sid}
    )
    assert second.model_extra["turn"] == 1
    assert served.server.metrics()["serve/sessions_forked"] >= 1
    assert served.buffer.metrics()["buffer/pending"] >= 1  # the first trajectory, written pending
    fb = served.post("/v1/feedback", {"response_id": second.id, "reward": 1.0})  # a session's response id
    assert fb.status_code == 200 and fb.json()["committed"]
    exps = taken(served.buffer, 2)
    assert sorted(e.info.get("forked", False) for e in exps) == [False, True]
    assert all(e.reward == 1.0 and e.task_id == sid for e in exps)
    with pytest.raises(openai.ConflictError, match="committed"):
        client.chat.completions.create(
            model=SERVE_MODEL,
            messages=[{"role": "user", "content": "Again."}],
            extra_body={"session_id": sid},
        )


def test_tools_are_rendered_and_tool_calls_returned_then_the_tool_result_continues_the_session(tokenizer):
    call = format_tool_call("add", {"a": 2, "b": 3})

    def policy(prompt: str) -> str:
        return "The sum is 5." if "<|im_start|>tool\n5" in prompt else f"Let me add.\n{call}"

    settings = ServeSettings(
        model_name=SERVE_MODEL, max_tokens=128, default_max_tokens=16, max_prompt_tokens=1000
    )
    with serving(Scripted(tokenizer, policy), MemoryBuffer(), settings) as s:
        client, sid = s.client(), "sess-tools"
        messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2+3?"}]
        first = client.chat.completions.create(
            model=SERVE_MODEL, messages=messages, tools=[ADD], max_tokens=128,
            extra_body={"session_id": sid, "return_token_ids": True},
        )  # fmt: skip
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me add."
        [tool_call] = choice.message.tool_calls
        assert tool_call.function.name == "add" and json.loads(tool_call.function.arguments) == {
            "a": 2,
            "b": 3,
        }
        assert '"name": "add"' in tokenizer.decode(first.model_extra["prompt_token_ids"])  # tools rendered
        messages += [as_dict(choice.message), {"role": "tool", "tool_call_id": tool_call.id, "content": "5"}]
        second = client.chat.completions.create(
            model=SERVE_MODEL, messages=messages, tools=[ADD], max_tokens=128, extra_body={"session_id": sid}
        )
        assert (
            second.choices[0].message.content == "The sum is 5." and second.choices[0].finish_reason == "stop"
        )
        assert s.post("/v1/feedback", {"session_id": sid, "reward": 1.0}).status_code == 200
        [exp] = taken(s.buffer, 1)
        sampled = [t for t, m in zip(exp.response_tokens, exp.action_mask) if m]
        assert "<tool_call>" in tokenizer.decode(sampled) and exp.policy_version == 3
        observed = [t for t, m in zip(exp.response_tokens, exp.action_mask) if not m]
        assert tokenizer.decode(observed).startswith("\n<|im_start|>tool\n5<|im_end|>")


def test_completions_take_text_or_token_ids_and_are_recorded(served):
    client = served.client()
    text = client.completions.create(
        model=SERVE_MODEL,
        prompt="Once upon a time",
        max_tokens=4,
        logprobs=0,
        extra_body={"return_token_ids": True},
    )
    [choice] = text.choices
    assert (
        len(choice.logprobs.token_logprobs)
        == len(choice.model_extra["token_ids"])
        == text.usage.completion_tokens
    )
    ids = text.model_extra["prompt_token_ids"]
    again = client.completions.create(model=SERVE_MODEL, prompt=ids, max_tokens=4, n=2, seed=3)
    assert again.usage.prompt_tokens == len(ids) and len(again.choices) == 2
    streamed = list(client.completions.create(model=SERVE_MODEL, prompt="Hello", max_tokens=3, stream=True))
    assert streamed[-1].choices[0].finish_reason in ("stop", "length")
    ok = served.post("/v1/feedback", {"response_id": again.id, "reward": 0.25})
    assert ok.status_code == 200 and ok.json()["rewarded"] == 2


def test_many_concurrent_clients_are_all_answered(served):
    async def go() -> list[Any]:
        client = openai.AsyncOpenAI(base_url=f"{served.url}/v1", api_key="x", max_retries=0, timeout=30)
        calls = [
            client.chat.completions.create(
                model=SERVE_MODEL, messages=[{"role": "user", "content": f"q{i}"}], max_tokens=4
            )
            for i in range(12)
        ]
        return await asyncio.gather(*calls)

    answers = asyncio.run(go())
    assert len({a.id for a in answers}) == 12 and all(
        a.choices[0].message.content is not None for a in answers
    )


# ---------------------------------------------------------------------------------------------- bad paths
BAD = [
    # (body, status, param, words in the message); the limits are serving()'s (tests.helpers.serve_settings)
    ({**GOOD_CHAT, "colour": "red"}, 400, "colour", "unknown field"),
    ({**GOOD_CHAT, "temperature": "hot"}, 400, "temperature", "valid number"),
    ({**GOOD_CHAT, "temperature": 9}, 400, "temperature", "less than or equal to 2"),
    ({**GOOD_CHAT, "n": 9}, 400, "n", "limit of 4"),
    ({**GOOD_CHAT, "n": 2, "session_id": "s"}, 400, "n", "n=1"),
    ({**GOOD_CHAT, "max_tokens": 10**6}, 400, "max_tokens", "limit of 16"),
    (
        {"model": SERVE_MODEL, "messages": GOOD_CHAT["messages"], "max_completion_tokens": 99},
        400,
        "max_completion_tokens",
        "limit of 16",
    ),
    ({**GOOD_CHAT, "logprobs": True, "top_logprobs": 2}, 400, "top_logprobs", "not supported"),
    ({**GOOD_CHAT, "messages": []}, 400, "messages", "at least 1"),
    (
        {**GOOD_CHAT, "messages": [{"role": "user", "content": "x" * 2000}]},
        400,
        "messages",
        "max_prompt_tokens=300",
    ),
    ({**GOOD_CHAT, "messages": [{"role": "robot", "content": "x"}]}, 400, "messages.0.role", "'user'"),
    ({**GOOD_CHAT, "messages": [{"role": "user", "content": None}]}, 400, "messages.0.content", "null"),
    (
        {**GOOD_CHAT, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        400,
        "messages.0.content",
        "messages.0.content",
    ),  # fmt: skip
    ({**GOOD_CHAT, "model": "gpt-4o"}, 404, "model", "serves 'tiny'"),
    ({**GOOD_CHAT, "presence_penalty": 0.5}, 400, "presence_penalty", "not supported"),
    ({"messages": GOOD_CHAT["messages"]}, 400, "model", "required"),
]


@pytest.mark.parametrize("body,status,param,words", BAD, ids=[f"{b[2]}-{i}" for i, b in enumerate(BAD)])
def test_bad_requests_get_the_openai_error_body_naming_the_field(served, body, status, param, words):
    resp = served.post("/v1/chat/completions", body)
    error = resp.json()["error"]
    assert resp.status_code == status and error["param"] == param and error["code"] is None, error
    assert error["type"] == "invalid_request_error" and words in error["message"], error


def test_malformed_bodies_and_content_types_are_refused(served):
    url = f"{served.url}/v1/chat/completions"
    bad_json = httpx.post(url, content=b'{"model": ', headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and "not valid JSON" in bad_json.json()["error"]["message"]
    form = httpx.post(
        url, content=b"model=tiny", headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert form.status_code == 415 and "application/json" in form.json()["error"]["message"]
    array = httpx.post(url, json=[GOOD_CHAT])
    assert array.status_code == 400 and "one JSON object" in array.json()["error"]["message"]
    huge = httpx.post(
        url, content=b"{" + b" " * (9 * 1024 * 1024) + b"}", headers={"content-type": "application/json"}
    )
    assert huge.status_code == 413
    assert httpx.get(f"{served.url}/v1/chat/completions").status_code == 405
    assert httpx.get(f"{served.url}/v1/nothing").json()["error"]["type"] == "invalid_request_error"
    assert served.server.metrics()["serve/rejected_unsupported_media_type"] >= 1


def test_feedback_for_unknown_or_unnamed_targets_is_refused(served):
    assert served.post("/v1/feedback", {"response_id": "chatcmpl-nope", "reward": 1.0}).status_code == 404
    assert served.post("/v1/feedback", {"session_id": "never", "reward": 1.0}).status_code == 404
    both = served.post("/v1/feedback", {"response_id": "a", "session_id": "b", "reward": 1.0})
    assert both.status_code == 400 and "exactly one" in both.json()["error"]["message"]
    nan = httpx.post(
        f"{served.url}/v1/feedback", content=b'{"response_id": "a", "reward": NaN}',
        headers={"content-type": "application/json"},
    )  # fmt: skip
    assert nan.status_code == 400 and nan.json()["error"]["param"] == "reward"
    assert served.post("/v1/sessions/never/commit").status_code == 404


def test_a_typed_route_added_on_top_answers_400_not_422(engine):
    def extend(app: Any) -> None:
        @app.get("/v1/echo")
        def echo(k: int) -> dict[str, int]:
            return {"k": k}

    with serving(engine, MemoryBuffer(), extend=extend) as s:
        assert httpx.get(f"{s.url}/v1/echo", params={"k": 3}).json() == {"k": 3}
        wrong = httpx.get(f"{s.url}/v1/echo", params={"k": "three"})
        assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "k"


def test_an_api_key_is_required_when_set(engine):
    settings = ServeSettings(model_name=SERVE_MODEL, api_key="s3cret", max_tokens=8, default_max_tokens=2)
    with serving(engine, MemoryBuffer(), settings) as s:
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").models.list()
        missing = httpx.post(f"{s.url}/v1/chat/completions", json=GOOD_CHAT)
        assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
        assert missing.json()["error"]["type"] == "authentication_error"
        assert s.client("s3cret").chat.completions.create(**GOOD_CHAT).choices
        assert httpx.get(f"{s.url}/health").status_code == 200


def test_past_the_queue_requests_get_429_and_the_server_goes_on(tokenizer):
    settings = ServeSettings(
        model_name=SERVE_MODEL, max_concurrent=1, max_queue=1, max_tokens=8, default_max_tokens=2
    )
    with serving(Scripted(tokenizer, lambda _: "ok", delay=0.25), MemoryBuffer(), settings) as s:

        async def burst() -> list[int]:
            async with httpx.AsyncClient(timeout=10) as client:
                calls = [client.post(f"{s.url}/v1/chat/completions", json=GOOD_CHAT) for _ in range(3)]
                return sorted(r.status_code for r in await asyncio.gather(*calls))

        assert asyncio.run(burst()) == [200, 200, 429]
        assert s.server.metrics()["serve/rejected_too_many_requests"] == 1
        assert s.post("/v1/chat/completions", GOOD_CHAT).status_code == 200


def test_an_engine_error_fails_only_its_request(engine):
    with serving(Failing(engine), MemoryBuffer()) as s:
        bad = s.post("/v1/chat/completions", {**GOOD_CHAT, "messages": [{"role": "user", "content": "boom"}]})
        assert bad.status_code == 500 and bad.json()["error"]["type"] == "server_error"
        assert "device-side assert" in bad.json()["error"]["message"]
        assert s.post("/v1/chat/completions", GOOD_CHAT).status_code == 200
        # a failed session turn leaves the session as it was: the next call continues it
        first = s.client().chat.completions.create(**GOOD_CHAT, extra_body={"session_id": "sx"})
        echo = [*GOOD_CHAT["messages"], as_dict(first.choices[0].message)]
        boom = [*echo, {"role": "user", "content": "boom"}]
        failed = s.post("/v1/chat/completions", {**GOOD_CHAT, "messages": boom, "session_id": "sx"})
        assert failed.status_code == 500
        ok = s.client().chat.completions.create(
            model=SERVE_MODEL, messages=[*echo, {"role": "user", "content": "fine"}], max_tokens=2,
            extra_body={"session_id": "sx"},
        )  # fmt: skip
        assert ok.model_extra["turn"] == 1 and s.server.metrics()["serve/sessions_forked"] == 0


def test_a_hanging_engine_or_buffer_fails_its_request_in_time_and_the_server_goes_on(tokenizer):
    settings = ServeSettings(model_name=SERVE_MODEL, max_tokens=8, default_max_tokens=2, request_timeout=0.3)
    buffer = Stalling()
    slow = Scripted(tokenizer, lambda _: "ok", hang="hang")
    with serving(slow, buffer, settings, write_timeout=0.3) as s:
        started = time.monotonic()
        hung = s.post(
            "/v1/chat/completions", {**GOOD_CHAT, "messages": [{"role": "user", "content": "hang"}]}
        )
        assert hung.status_code == 504 and "request_timeout=0.3" in hung.json()["error"]["message"]
        buffer.stall = 3.0
        stuck = s.post("/v1/chat/completions", GOOD_CHAT)
        assert stuck.status_code == 503 and "buffer did not answer" in stuck.json()["error"]["message"]
        assert time.monotonic() - started < 2.5
        buffer.stall = 0.0
        assert s.post("/v1/chat/completions", GOOD_CHAT).status_code == 200
        metrics = s.server.metrics()
        assert metrics["serve/rejected_timeout"] == 1 and metrics["serve/rejected_unavailable"] == 1


def test_an_idle_session_is_written_pending_and_rewarded_later(engine):
    settings = ServeSettings(model_name=SERVE_MODEL, max_tokens=8, default_max_tokens=2, session_timeout=0.3)
    buffer = MemoryBuffer()
    with serving(engine, buffer, settings) as s:
        s.client().chat.completions.create(**GOOD_CHAT, extra_body={"session_id": "idle"})
        deadline = time.monotonic() + 5
        while s.server.metrics()["serve/sessions_expired"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)  # counted once its write returned (the row is pending a moment before)
        assert s.server.metrics()["serve/sessions_expired"] == 1 and buffer.metrics()["buffer/pending"] == 1
        assert s.post("/v1/feedback", {"session_id": "idle", "reward": 2.0}).status_code == 200
        assert s.post("/v1/feedback", {"session_id": "idle", "reward": 2.0}).status_code == 409
        [exp] = taken(buffer, 1)
        assert exp.reward == 2.0 and exp.info["session_expired"] is True


def test_the_sql_buffer_gets_each_reward_once(engine, tmp_path):
    buffer = SQLBuffer(f"sqlite:///{tmp_path / 'buffer.db'}", poll_interval=0.02)
    try:
        with serving(engine, buffer) as s:
            resp = s.client().chat.completions.create(**GOOD_CHAT, n=2)
            assert buffer.metrics()["buffer/pending"] == 2
            assert s.post("/v1/feedback", {"response_id": resp.id, "reward": 1.0}).json()["rewarded"] == 2
            assert s.post("/v1/feedback", {"response_id": resp.id, "reward": 1.0}).status_code == 409
            exps = buffer.get(2, timeout=2)
            assert [e.reward for e in exps] == [1.0, 1.0] and {e.info["response_id"] for e in exps} == {
                resp.id
            }
            assert buffer.metrics()["buffer/pending"] == 0
    finally:
        buffer.close()
