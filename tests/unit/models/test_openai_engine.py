"""``model.engine: openai`` over real HTTP: :class:`OpenAIEngine` against the real ``trine serve`` app (uvicorn in
a thread, the real HFEngine on the tiny model; ``serving`` from tests/helpers.py), an explorer run on
arithmetic tasks through it, a text-only server standing in for a hosted API, a dead and a hanging server,
and the config checks."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

pytest.importorskip("openai", reason="the openai engine speaks through the openai client (extra `agents`)")
fastapi = pytest.importorskip("fastapi", reason="the test servers need fastapi (pip install 'trine[dev]')")
uvicorn = pytest.importorskip("uvicorn", reason="the test servers need uvicorn (pip install 'trine[dev]')")

import torch  # noqa: E402

from tests.helpers import SERVE_MODEL, serving, write_arithmetic_config  # noqa: E402
from trine import build  # noqa: E402
from trine.buffer import MemoryBuffer  # noqa: E402
from trine.config import load_config, validate_dict  # noqa: E402
from trine.config.engines import engine_problems  # noqa: E402
from trine.explorer import Explorer  # noqa: E402
from trine.models import load_model  # noqa: E402
from trine.models.chat import encode_prompt  # noqa: E402
from trine.models.openai_engine import OpenAIEngine, OpenAIEngineError  # noqa: E402
from trine.types import SamplingParams, Task  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class Recording(MemoryBuffer):
    """A memory buffer that also keeps every experience put in it (what the server recorded)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list = []

    def put(self, experiences: list) -> None:
        self.seen.extend(experiences)
        super().put(experiences)


@pytest.fixture(scope="module")
def server(engine):
    with serving(engine, Recording()) as s:
        yield s


def remote(url: str, tokenizer, **kwargs) -> OpenAIEngine:
    return OpenAIEngine(None, tokenizer, base_url=f"{url}/v1", served_model=SERVE_MODEL, **kwargs)


def local_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> list[float]:
    """``log_softmax(logits / temperature)`` of each response token under ``model`` (what the trainer sees)."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1).tolist()


def test_generate_returns_the_servers_tokens_and_logprobs(server, engine, tokenizer, tiny_model_dir):
    prompt = encode_prompt(tokenizer, [{"role": "user", "content": "What is 2+3?"}])
    client = remote(server.url, tokenizer)
    before = len(server.buffer.seen)
    engine.policy_version = 5  # what the server serves: the client must read it, not assume it
    try:
        params = SamplingParams(temperature=0.8, max_tokens=8, n=3, seed=11)
        completions = asyncio.run(client.generate(prompt, params))
    finally:
        engine.policy_version = 0
    assert len(completions) == 3 and client.policy_version == 5
    assert len(server.buffer.seen) == before  # record: false — the explorer records its own experiences
    model = load_model(tiny_model_dir, dtype="float32", device="cpu")  # the same weights, held locally
    for c in completions:
        assert c.prompt_ids == prompt and c.response_ids
        assert c.policy_version == 5 and c.finish_reason in ("stop", "length")
        assert c.text == tokenizer.decode(c.response_ids, skip_special_tokens=True)
        mine = local_logprobs(model, prompt, c.response_ids, 0.8)
        assert max(abs(a - b) for a, b in zip(mine, c.logprobs)) < 1e-4


def test_chat_renders_locally_and_stop_strings_end_the_response(server, tokenizer):
    client = remote(server.url, tokenizer)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1+1="}]
    seeded = SamplingParams(temperature=1.0, max_tokens=12, seed=5, ignore_eos=False)
    (full,) = asyncio.run(client.chat(messages, seeded))
    assert full.prompt_ids == encode_prompt(tokenizer, messages) == client.encode_chat(messages)
    pieces = [tokenizer.decode([t], skip_special_tokens=True) for t in full.response_ids]
    visible = [i for i, p in enumerate(pieces) if p.strip() and i < len(pieces) - 1]
    assert visible, f"no visible token to stop on before the end of {full.text!r}"
    stop = pieces[visible[0]].strip()
    (cut,) = asyncio.run(client.chat(messages, seeded.replace(stop=[stop])))  # same seed: same tokens
    assert cut.finish_reason == "stop" and len(cut.response_ids) < len(full.response_ids)
    assert cut.response_ids == full.response_ids[: len(cut.response_ids)] and stop in cut.text


def test_an_explorer_run_through_the_server_yields_valid_experiences(server, tokenizer):
    tasks = [
        Task(f"t{i}", q, answer=a, repeat=2, sampling=SamplingParams(temperature=1.0, max_tokens=6))
        for i, (q, a) in enumerate([("2+3=", "5"), ("1+1=", "2")])
    ]
    explorer = Explorer(remote(server.url, tokenizer), max_retries=0, timeout=30)
    before = len(server.buffer.seen)
    try:
        experiences, metrics = explorer.explore(tasks, batch_index=0, version=0)
    finally:
        explorer.close()
    assert len(experiences) == 4 and metrics["explorer/skipped"] == 0
    assert len(server.buffer.seen) == before  # recorded once, by the explorer, not twice
    for e in experiences:
        e.check()
        assert e.reward is not None and len(e.logprobs) == len(e.tokens) - e.prompt_length > 0
        prompt = encode_prompt(
            tokenizer, [{"role": "user", "content": "2+3=" if e.task_id == "t0" else "1+1="}]
        )
        assert e.tokens[: e.prompt_length] == prompt


# ---------------------------------------------------------------------------------------------- errors
def _hosted_app(mode: str):
    """An OpenAI-style ``/v1/completions`` that answers as the official API does: text and logprobs, no
    token ids (``mode="text"``); token ids without logprobs (``"no_logprobs"``); or never (``"hang"``)."""
    app = fastapi.FastAPI()

    @app.post("/v1/completions")
    async def complete(body: dict) -> dict:
        if mode == "hang":
            await asyncio.sleep(30)
        choice = {"index": 0, "text": " 5", "finish_reason": "stop", "logprobs": None}
        if mode == "text":
            choice["logprobs"] = {
                "tokens": [" 5"],
                "token_logprobs": [-0.1],
                "top_logprobs": None,
                "text_offset": [0],
            }
        else:
            choice["token_ids"] = [20]
        return {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 0,
            "model": body["model"],
            "choices": [choice],
        }

    return app


@pytest.fixture(scope="module")
def hosted():
    """Base URLs of the three stand-in servers, served by one uvicorn in a thread."""
    root = fastapi.FastAPI()
    for mode in ("text", "no_logprobs", "hang"):
        root.mount(f"/{mode}", _hosted_app(mode))
    server = uvicorn.Server(uvicorn.Config(root, host="127.0.0.1", port=0, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        assert thread.is_alive()
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    server.should_exit = server.force_exit = True  # do not wait for the hanging request
    thread.join(timeout=10)


def test_a_text_only_server_is_refused_naming_the_field_and_the_fix(hosted, tokenizer):
    prompt = encode_prompt(tokenizer, [{"role": "user", "content": "2+3="}])
    with pytest.raises(OpenAIEngineError, match=r"/text/v1: the response has no 'token_ids'.*trine serve"):
        asyncio.run(remote(f"{hosted}/text", tokenizer).generate(prompt, SamplingParams()))
    with pytest.raises(OpenAIEngineError, match=r"lacks 'logprobs.token_logprobs'.*return_token_ids"):
        asyncio.run(remote(f"{hosted}/no_logprobs", tokenizer).generate(prompt, SamplingParams()))
    # in an explorer: the task fails, is counted and skipped; the run goes on
    explorer = Explorer(remote(f"{hosted}/text", tokenizer), max_retries=1, max_skip_ratio=1.0)
    try:
        experiences, metrics = explorer.explore(
            [Task("t", "2+3=", answer="5", repeat=2)], batch_index=0, version=0
        )
    finally:
        explorer.close()
    assert experiences == [] and metrics["explorer/skipped"] == 1 and metrics["explorer/retries"] == 1


def test_a_dead_or_hanging_server_fails_the_call_within_its_timeout(hosted, tokenizer):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    for url, pattern in (
        (f"http://127.0.0.1:{dead}", "cannot connect"),
        (f"{hosted}/hang", "no answer within"),
    ):
        start = time.monotonic()
        with pytest.raises(OpenAIEngineError, match=pattern):
            asyncio.run(remote(url, tokenizer, timeout=0.5).generate([1, 2, 3], SamplingParams()))
        assert time.monotonic() - start < 5  # one try, one retry, each bounded by the timeout


def test_load_weights_is_refused_with_the_setup_that_works(tokenizer):
    client = remote("http://127.0.0.1:9", tokenizer)
    with pytest.raises(OpenAIEngineError, match="loads its own weights.*launch: processes.*trine serve"):
        client.load_weights({}, 3)
    client.load_state_dict({"policy_version": 4})
    assert client.state_dict() == {"policy_version": 4}


def test_config_checks(tmp_path, tiny_model_dir, tokenizer):
    def errors(model: dict, extra: dict | None = None) -> list[str]:
        path = write_arithmetic_config(tmp_path, tiny_model_dir, "c", {"model": model}, extra)
        from trine.config import read_yaml

        return validate_dict(read_yaml(path), base_dir=path.parent)[1]

    async_processes = {"mode": "async", "launch": "processes", "buffer": {"storage": "sql"}}
    good = {"engine": "openai", "base_url": "http://127.0.0.1:8000/v1", "served_model": "run", "timeout": 5}
    assert errors(good, async_processes) == []
    (missing,) = errors({"engine": "openai"}, async_processes)
    assert "needs model.base_url" in missing and "needs model.served_model" in missing
    (stray,) = errors({"base_url": "http://127.0.0.1:8000/v1"})
    assert "model.base_url is read only by model.engine: openai" in stray and "remove it" in stray
    (scheme,) = errors({**good, "base_url": "127.0.0.1:8000/v1"}, async_processes)
    assert "expected http(s)://" in scheme
    (sync,) = errors(good)
    assert "mode sync" in sync and "launch: processes" in sync and "trine serve" in sync
    # the checks that need the whole run (trine.config.engines, for trine.config.checks.mode_problems)
    path = write_arithmetic_config(tmp_path, tiny_model_dir, "t", {"model": good}, async_processes)
    (cfg,) = load_config(path)
    assert engine_problems(cfg) == []
    built = build._engine(cfg, None, tokenizer)  # what trine explore samples with
    assert isinstance(built, OpenAIEngine) and (built.base_url, built.model, built.timeout) == (
        "http://127.0.0.1:8000/v1",
        "run",
        5,
    )
    thread = cfg.model_copy(update={"launch": "thread"})
    (problem,) = engine_problems(thread)
    assert "launch: thread" in problem and "'copy'" in problem and "trine serve" in problem
