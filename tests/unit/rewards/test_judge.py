"""Auxiliary models and the LLM-judge reward, over a real OpenAI-compatible HTTP endpoint and a local engine.

The endpoint is a small FastAPI app served by uvicorn on 127.0.0.1: a scripted judge (it says "yes" when
the reference answer appears in the response it is shown), because a tiny model cannot judge; the
``openai`` client, the HTTP round trip, the thread-to-loop bridge and the explorer's wiring are real.
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time

import pytest

from tests.helpers import EXAMPLE, read_metrics, write_arithmetic_config
from trine.config import load_config, validate_dict
from trine.models.auxiliary import AuxiliaryModels
from trine.rewards.judge import llm_judge, parse_verdict
from trine.types import Task

pytest.importorskip("openai", reason="the openai client (extra `agents`) is not installed")
fastapi = pytest.importorskip("fastapi", reason="fastapi is not installed")
uvicorn = pytest.importorskip("uvicorn", reason="uvicorn is not installed")


def _judge_app(seen: list[dict]):
    app = fastapi.FastAPI()

    @app.post("/v1/chat/completions")
    async def complete(body: dict) -> dict:
        seen.append(body)
        prompt = body["messages"][-1]["content"]
        answer = re.search(r"Reference answer:\n(.*)\n", prompt).group(1)
        response = prompt.split("Response:\n", 1)[1]
        verdict = "yes" if answer in response else "no"
        return {
            "id": "judge-1",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": verdict},
                    "finish_reason": "stop",
                    "logprobs": {
                        "content": [{"token": verdict, "logprob": -0.01, "bytes": None, "top_logprobs": []}]
                    },
                }
            ],
        }

    return app


@pytest.fixture(scope="module")
def judge_url():
    seen: list[dict] = []
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(_judge_app(seen), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 20
    while not server.started and time.time() < deadline:
        time.sleep(0.05)
    assert server.started, "the judge endpoint did not start"
    yield f"http://127.0.0.1:{port}/v1", seen
    server.should_exit = True
    thread.join(timeout=10)


def test_a_reward_asks_the_judge_from_its_thread_through_the_explorers_loop(judge_url):
    from trine.models.openai_model import OpenAIModel

    url, seen = judge_url
    loop = asyncio.new_event_loop()
    models = AuxiliaryModels({"judge": OpenAIModel(url, "judge-model")}, loop)
    task = Task("t", "What is 2+3?", answer="5")
    results = {}

    def reward_thread() -> None:  # how the explorer calls a reward: in a worker thread
        results["right"] = llm_judge("It is 5.", task, models=models)
        results["wrong"] = llm_judge("It is 7.", task, models=models)

    worker = threading.Thread(target=reward_thread)
    worker.start()
    while worker.is_alive():  # the explorer's loop keeps running while rewards wait
        loop.run_until_complete(asyncio.sleep(0.01))
    loop.close()
    assert results == {"right": {"judge": 1.0}, "wrong": {"judge": 0.0}}
    assert seen[-1]["model"] == "judge-model" and seen[-1]["temperature"] == 0.0
    with pytest.raises(
        KeyError, match="no auxiliary model 'critic'; explorer.auxiliary_models defines: judge"
    ):
        models["critic"]


def test_verdicts_are_read_or_refused_with_the_reply():
    assert parse_verdict("Yes, it is.") == 1.0 and parse_verdict("incorrect") == 0.0
    assert parse_verdict("Score: 7/10", scale=10) == 0.7 and parse_verdict("12", scale=10) == 1.0
    with pytest.raises(ValueError, match="replied 'maybe'; expected yes/no or a number"):
        parse_verdict("maybe")


@pytest.mark.slow
def test_a_run_trains_on_the_judges_rewards(tmp_path, tiny_model_dir, judge_url):
    url, seen = judge_url
    before = len(seen)
    over = {
        "tasks": {"total_steps": 2, "train": {"reward": "llm_judge", "reward_args": {"judge": "judge"}}},
        "explorer": {"auxiliary_models": {"judge": {"base_url": url, "model": "judge-model"}}},
    }
    from trine.loop import run

    run(load_config(write_arithmetic_config(tmp_path, tiny_model_dir, "judged", over)))
    rows = [r for r in read_metrics(tmp_path / "judged") if "trainer/loss" in r]
    assert len(rows) == 2 and all("explorer/reward_mean" in r for r in rows)
    assert len(seen) - before == 2 * 16  # every response of 2 steps x 4 tasks x 4 samples was judged


def test_judge_settings_are_checked_before_the_run(tmp_path, tiny_model_dir):
    base = {
        "model": {"path": str(tiny_model_dir)},
        "tasks": {
            "total_steps": 1,
            "train": {
                "path": str(EXAMPLE / "data" / "train.jsonl"),
                "reward": "llm_judge",
                "reward_args": {"judge": "gpt"},
            },
        },
    }
    problems = " ".join(validate_dict(base)[1])
    assert "reward_args['judge']='gpt' names no auxiliary model" in problems
    wrong = {**base, "explorer": {"auxiliary_models": {"gpt": {"base_url": "http://x/v1"}}}}
    assert "needs model (its name there)" in " ".join(validate_dict(wrong)[1])
    both = {
        **base,
        "explorer": {"auxiliary_models": {"gpt": {"path": str(tiny_model_dir), "base_url": "http://x/v1"}}},
    }
    assert "exactly one of path" in " ".join(validate_dict(both)[1])


def test_a_local_auxiliary_model_answers_through_its_own_engine(tiny_model_dir):
    from trine.models import load_model, load_tokenizer
    from trine.models.engine import HFEngine

    engine = HFEngine(load_model(tiny_model_dir), load_tokenizer(tiny_model_dir), seed=0)
    loop = asyncio.new_event_loop()
    models = AuxiliaryModels({"partner": engine}, loop)
    out = {}
    worker = threading.Thread(
        target=lambda: out.update(
            text=models.ask("partner", [{"role": "user", "content": "hi"}], max_tokens=5)
        )
    )
    worker.start()
    while worker.is_alive():
        loop.run_until_complete(asyncio.sleep(0.01))
    loop.close()
    engine.close()
    assert isinstance(out["text"], str)
