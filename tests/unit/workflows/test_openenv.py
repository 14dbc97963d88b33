"""``OpenEnvEnv`` against an in-process server speaking OpenEnv's session protocol (the WebSocket ``/ws``
messages of openenv-core's ``EnvClient``) and against plain HTTP ``/reset`` + ``/step``: episodes, the
observation's text, seeds, and every failure as an ``OpenEnvError`` that the workflows count as ``env_error``.
The real openenv-core server is played in tests/e2e/test_openenv_run.py."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from tests.helpers import ScriptedModel, env_task
from trine.workflows import StepWiseWorkflow
from trine.workflows.envs import EnvFailure
from trine.workflows.envs.openenv import OpenEnvEnv, OpenEnvError, _ws_url

websockets = pytest.importorskip(
    "websockets", reason='websockets is not installed (pip install -e ".[envs]")'
)


def observation(text: str, reward=None, done=False, **more) -> dict:
    return {"observation": {"text": text, **more}, "reward": reward, "done": done}


async def session(ws, log: list) -> None:
    """One OpenEnv session: a secret number drawn from the reset seed, hints after each guess."""
    secret = None
    async for raw in ws:
        message = json.loads(raw)
        log.append(message)
        kind, data = message["type"], message.get("data", {})
        if kind == "close":
            return
        if kind == "reset":
            secret = data["seed"] % 4 + 1
            reply = observation("guess 1..4", turn=0)
        elif kind == "step" and data.get("message") == "boom":
            reply = None
            await ws.send(
                json.dumps({"type": "error", "data": {"message": "boom!", "code": "EXECUTION_ERROR"}})
            )
        elif kind == "step" and data.get("message") == "hang":
            await asyncio.sleep(1.5)
            return
        elif kind == "step":
            guess = int(data["message"])
            hint = "correct" if guess == secret else ("higher" if guess < secret else "lower")
            reply = observation(hint, reward=float(guess == secret), done=guess == secret, turn=1)
        if reply is not None:
            await ws.send(json.dumps({"type": "observation", "data": reply}))


def play(coro_fn):
    """Run ``coro_fn(url, log)`` with the fake server listening on a free port."""
    from websockets.asyncio.server import serve

    async def main():
        log: list = []
        async with serve(lambda ws: session(ws, log), "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            return await coro_fn(f"http://127.0.0.1:{port}", log)

    return asyncio.run(main())


def bisect(observation_text: str, state={}) -> str:  # noqa: B006 - a tiny scripted policy's memory
    lo, hi = state.get("range", (1, 4))
    if observation_text == "higher":
        lo = state["last"] + 1
    elif observation_text == "lower":
        hi = state["last"] - 1
    else:
        lo, hi = 1, 4
    state["range"], state["last"] = (lo, hi), (lo + hi) // 2
    return str(state["last"])


def test_an_episode_over_the_session_protocol():
    async def run(url, log):
        env = OpenEnvEnv(url, observation_key="text", reset_args={"level": 2})
        first = await env.reset(env_task("guess/0", seed=2))
        hash0 = env.state_hash()
        steps = [await env.step(str(guess)) for guess in (1, 3)]
        await env.close()
        return first, hash0, steps, log

    first, hash0, steps, log = play(run)
    assert first == "guess 1..4" and len(hash0) == 16
    assert [s[:3] for s in steps] == [("higher", 0.0, False), ("correct", 1.0, True)]
    assert steps[0][3] == {"observation": {"text": "higher", "turn": 1}, "reward_given": True}
    assert log[0] == {"type": "reset", "data": {"level": 2, "seed": 2, "episode_id": "guess/0#0"}}
    assert log[1] == {"type": "step", "data": {"message": "1"}} and log[-1] == {"type": "close"}


def test_the_observation_text_without_a_key():
    env = OpenEnvEnv("http://x")
    assert env._text_of({"text": "hi", "turn": 1}) == "hi"  # the only text field
    assert env._text_of({"a": "x", "b": "y"}) == '{"a": "x", "b": "y"}'
    with pytest.raises(
        OpenEnvError, match=r"no field 'prompt' \(env_args.observation_key\); its fields are \['a'\]"
    ):
        OpenEnvEnv("http://x", observation_key="prompt")._text_of({"a": 1})
    assert _ws_url("https://h:1/") == "wss://h:1/ws" and _ws_url("ws://h/ws") == "ws://h/ws"


def test_settings_are_checked():
    with pytest.raises(ValueError, match="base_url='localhost:8001'; expected the OpenEnv server's address"):
        OpenEnvEnv("localhost:8001")
    with pytest.raises(ValueError, match="transport='grpc'"):
        OpenEnvEnv("http://x", transport="grpc")


def test_server_errors_timeouts_and_refusals_raise_openenv_error():
    async def run(url, log):
        env = OpenEnvEnv(url, timeout=0.5)
        await env.reset(env_task(seed=1))
        with pytest.raises(OpenEnvError, match=r"step failed on the server: boom! \(code EXECUTION_ERROR\)"):
            await env.step("boom")
        await env.reset(env_task(seed=1))  # the session goes on after a server error
        with pytest.raises(OpenEnvError, match="step got no answer within 0.5 s"):
            await env.step("hang")
        await env.close()

    play(run)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = OpenEnvEnv(f"http://127.0.0.1:{port}", timeout=2)
    with pytest.raises(
        OpenEnvError, match=f"http://127.0.0.1:{port}: reset failed: .*Check that the server runs"
    ):
        asyncio.run(env.reset(env_task()))


def test_a_failing_server_is_an_env_error_of_the_workflow_and_a_good_one_plays():
    async def run(url, log):
        workflow = StepWiseWorkflow(
            env="trine.workflows.envs.openenv:OpenEnvEnv", env_args={"base_url": url}, max_steps=4
        )
        good = await workflow.run(env_task("g/0", 2, seed=3), ScriptedModel(bisect))
        replies = iter(["1", "boom"])  # a first step played, then the server fails
        bad = await workflow.run(env_task("g/1", 1, seed=3), ScriptedModel(lambda _: next(replies)))
        with pytest.raises(
            EnvFailure, match="boom!"
        ):  # nothing played: the explorer skips the task, by reason
            await workflow.run(env_task("g/2", 1, seed=3), ScriptedModel(lambda _: "boom"))
        await workflow.aclose()
        return good, bad

    good, bad = play(run)
    assert {e.status for e in good} == {"ok"} and {e.info["episode_return"] for e in good} == {1.0}
    assert [e.status for e in bad] == ["env_error"] and "boom!" in bad[0].info["status_reason"]
    assert bad[0].info["response"] == "1"


def test_the_http_transport():
    httpx = pytest.importorskip("httpx", reason="httpx is not installed")
    seen = []

    def handler(request):
        body = json.loads(request.content)
        seen.append((request.url.path, body))
        if request.url.path == "/reset":
            return httpx.Response(200, json=observation("start"))
        if body["action"]["message"] == "bad":
            return httpx.Response(422, json={"detail": "message must be a number"})
        return httpx.Response(200, json=observation("done", reward=True, done=True))

    async def run():
        env = OpenEnvEnv("http://env", transport="http", action_args={"kind": "guess"})
        env._http = httpx.AsyncClient(base_url="http://env", transport=httpx.MockTransport(handler))
        first = await env.reset(env_task(seed=5))
        with pytest.raises(OpenEnvError, match="POST /step answered 422: .*must be a number.*the action was"):
            await env.step("bad")
        await env.reset(env_task(seed=5))
        result = await env.step("2")
        await env.close()
        return first, result

    first, result = asyncio.run(run())
    assert first == "start" and result[:3] == ("done", 1.0, True)
    assert seen[0] == ("/reset", {"seed": 5, "episode_id": "t/0#0"})
    assert seen[-1] == ("/step", {"action": {"kind": "guess", "message": "2"}})
