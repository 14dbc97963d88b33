"""An environment served by an `OpenEnv <https://github.com/meta-pytorch/OpenEnv>`_ server, as an async
:class:`~trine.workflows.envs.base.Environment`.

OpenEnv (``openenv-core``) serves an environment over HTTP from a FastAPI app (``create_app`` /
``create_fastapi_app``, usually in a container or a Hugging Face Space). Its own client,
``openenv.core.EnvClient``, plays an episode over the server's WebSocket ``/ws``: one connection is one
session with its own environment instance, and each message is JSON::

    -> {"type": "reset", "data": {"seed": 7, "episode_id": "..."}}    <- {"type": "observation", "data": {...}}
    -> {"type": "step", "data": {<the action's fields>}}               <- {"type": "observation", "data": {...}}
    -> {"type": "close"}                                                (errors: {"type": "error", "data": {"message"}})

where an observation's ``data`` is ``{"observation": {<fields>}, "reward": float | None, "done": bool}``.
:class:`OpenEnvEnv` speaks that protocol itself (``transport: ws``, the default; needs ``websockets``), so
Trine needs neither openenv-core nor the environment's package: only the server's URL and the name of the
action field the model's reply goes into. The server's plain HTTP ``POST /reset`` and ``POST /step``
(``transport: http``, through ``httpx``) build a fresh environment for every request in openenv-core 0.2+,
so they suit only servers that keep one episode per server (older OpenEnv servers, OpenEnv-style servers
of one's own).

Use it from any environment workflow (``multi_turn``, ``step_wise``)::

    workflow: multi_turn
    workflow_args:
      env: trine.workflows.envs.openenv:OpenEnvEnv
      env_args: {base_url: "http://127.0.0.1:8001", action_key: message, observation_key: echoed_message}
      max_turns: 4

Each episode resets with the task's seed (:func:`~trine.workflows.envs.base.episode_seed`: the row's
``seed`` or a hash of the task id, equal for every rollout of the task) and ``reset_args`` plus the row
keys named by ``reset_keys``. The observation's text is its ``observation_key`` field (None: its only text
field, else the observation as JSON). A reward of None counts as 0. Anything that goes wrong (a refused
connection, a server error, no answer within ``timeout``, a malformed reply) raises
:class:`OpenEnvError`, which the workflow's environment pool turns into an ``env_error`` episode, counted
by reason; the run goes on.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from typing import Any, Literal

from trine.types import Task
from trine.workflows.envs.base import StepResult, episode_seed, plain

TRANSPORTS = ("ws", "http")
"""How :class:`OpenEnvEnv` talks to the server: a WebSocket session (``/ws``) or plain HTTP requests."""


class OpenEnvError(RuntimeError):
    """An OpenEnv server refused, failed or did not answer; the message names the server and the call."""


class OpenEnvEnv:
    """One OpenEnv session at a time (see the module docstring).

    Args:
        base_url: the server's address, e.g. ``http://127.0.0.1:8001`` (``ws://`` works too).
        action_key: the action field that receives the model's reply (OpenEnv's echo and chat
            environments call it ``message``; the coding environment ``code``).
        action_args: further fields of every action (constants the environment's action type requires).
        observation_key: the observation field read as the next user message (None: the only text field
            of the observation, else the whole observation as JSON).
        reset_args: further fields of every reset request (an OpenEnv environment's ``reset`` takes the
            ones it declares).
        reset_keys: row keys passed to ``reset`` too (a row's ``difficulty``, ``level``...).
        seed_key, seed_per_rollout: the episode seed (:func:`~trine.workflows.envs.base.episode_seed`).
        transport: ``ws`` (OpenEnv's session protocol) or ``http`` (stateless ``/reset`` and ``/step``).
        timeout: seconds to connect and seconds each reply may take.
    """

    def __init__(
        self,
        base_url: str,
        *,
        action_key: str = "message",
        action_args: dict[str, Any] | None = None,
        observation_key: str | None = None,
        reset_args: dict[str, Any] | None = None,
        reset_keys: list[str] | tuple[str, ...] = (),
        seed_key: str = "seed",
        seed_per_rollout: bool = False,
        transport: Literal["ws", "http"] = "ws",
        timeout: float = 30.0,
    ) -> None:
        if not isinstance(base_url, str) or not base_url.startswith(
            ("http://", "https://", "ws://", "wss://")
        ):
            raise ValueError(
                f"env_args.base_url={base_url!r}; expected the OpenEnv server's address, e.g. http://127.0.0.1:8001"
            )
        if transport not in TRANSPORTS:
            raise ValueError(f"env_args.transport={transport!r}; expected one of {TRANSPORTS}.")
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"env_args.timeout={timeout!r}; expected seconds > 0.")
        self.base_url = base_url.rstrip("/")
        self.action_key = action_key
        self.action_args = dict(action_args or {})
        self.observation_key = observation_key
        self.reset_args = dict(reset_args or {})
        self.reset_keys = tuple(reset_keys)
        self.seed_key = seed_key
        self.seed_per_rollout = seed_per_rollout
        self.transport = transport
        self.timeout = float(timeout)
        self._ws: Any = None
        self._http: Any = None
        self._text: str | None = None  # the last observation's text; None outside an episode

    # -- the Environment protocol -------------------------------------------------------------------

    async def reset(self, task: Task, rollout: int = 0) -> str:
        """Start an episode of ``task`` on the server; returns the first observation's text."""
        data = {**self.reset_args, **{k: task.raw[k] for k in self.reset_keys if k in task.raw}}
        data.setdefault(
            "seed", episode_seed(task, rollout, seed_key=self.seed_key, per_rollout=self.seed_per_rollout)
        )
        data.setdefault("episode_id", f"{task.task_id}#{rollout}")
        reply = await self._call("reset", data)
        text, _, done, _ = self._result(reply, "reset")
        self._text = None if done else text
        return text

    async def step(self, action: str) -> StepResult:
        """Send the model's reply as the action's ``action_key``; returns ``(observation, reward, done, info)``."""
        if self._text is None:
            raise OpenEnvError(
                f"OpenEnv server {self.base_url}: step() before reset() or after the episode ended"
            )
        reply = await self._call("step", {**self.action_args, self.action_key: action})
        result = self._result(reply, "step")
        self._text = None if result[2] else result[0]
        return result

    def state_hash(self) -> str:
        """A hash of the current observation's text (OpenEnv's ``state`` would cost a round trip)."""
        if self._text is None:
            raise RuntimeError("state_hash() of an OpenEnv environment called outside an episode")
        return hashlib.sha1(self._text.encode()).hexdigest()[:16]

    async def close(self) -> None:
        """End the session (``{"type": "close"}``) and drop the connection."""
        self._text = None
        ws, self._ws = self._ws, None
        http, self._http = self._http, None
        if ws is not None:
            try:
                await asyncio.wait_for(ws.send(json.dumps({"type": "close"})), self.timeout)
                # the server ends the session and closes the connection itself: let it (a client that
                # hangs up first makes openenv-core log a traceback per session)
                await asyncio.wait_for(ws.wait_closed(), min(self.timeout, 5.0))
            except Exception:  # closing a broken or slow session: nothing left to save
                pass
            try:
                await asyncio.wait_for(ws.close(), self.timeout)
            except Exception:  # closing a broken session: nothing left to save
                pass
        if http is not None:
            await http.aclose()

    # -- transport ----------------------------------------------------------------------------------

    async def _call(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        try:
            if self.transport == "http":
                return await self._http_call(kind, data)
            return await self._ws_call(kind, data)
        except OpenEnvError:
            raise
        except (asyncio.TimeoutError, TimeoutError):
            await self._drop()
            raise OpenEnvError(
                f"OpenEnv server {self.base_url}: {kind} got no answer within {self.timeout:g} s "
                "(env_args.timeout); is the server overloaded or the environment stuck?"
            ) from None
        except Exception as err:  # a refused or dropped connection, a bad status: the episode's env_error
            await self._drop()
            raise OpenEnvError(
                f"OpenEnv server {self.base_url}: {kind} failed: {type(err).__name__}: {err}. Check that the "
                "server runs at env_args.base_url and serves this environment."
            ) from err

    async def _ws_call(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        if self._ws is None:
            from websockets.asyncio.client import connect

            url = _ws_url(self.base_url)
            self._ws = await asyncio.wait_for(connect(url, open_timeout=self.timeout), self.timeout)
        await asyncio.wait_for(self._ws.send(json.dumps({"type": kind, "data": data})), self.timeout)
        raw = await asyncio.wait_for(self._ws.recv(), self.timeout)
        message = json.loads(raw)
        if not isinstance(message, dict):
            raise OpenEnvError(
                f"OpenEnv server {self.base_url}: {kind} answered {str(raw)[:200]!r}, not a JSON object"
            )
        if message.get("type") == "error":
            details = message.get("data") or {}
            raise OpenEnvError(
                f"OpenEnv server {self.base_url}: {kind} failed on the server: {details.get('message', details)} "
                f"(code {details.get('code')})" + (f"; the action was {data}" if kind == "step" else "")
            )
        return message.get("data") or {}

    async def _http_call(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        if self._http is None:
            import httpx

            self._http = httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout)
        body = data if kind == "reset" else {"action": data}
        response = await self._http.post(f"/{kind}", json=body)
        if response.status_code != 200:
            raise OpenEnvError(
                f"OpenEnv server {self.base_url}: POST /{kind} answered {response.status_code}: "
                f"{response.text[:300]}" + (f"; the action was {data}" if kind == "step" else "")
            )
        return response.json()

    async def _drop(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None:
            try:
                await asyncio.wait_for(ws.close(), 1.0)
            except Exception:
                pass

    # -- replies ------------------------------------------------------------------------------------

    def _result(self, reply: Any, kind: str) -> StepResult:
        if not isinstance(reply, dict) or not isinstance(reply.get("observation"), dict):
            raise OpenEnvError(
                f"OpenEnv server {self.base_url}: {kind} answered {str(reply)[:200]!r}; expected "
                "{'observation': {...}, 'reward': ..., 'done': ...}"
            )
        observation = reply["observation"]
        reward = reply.get("reward")
        try:
            value = 0.0 if reward is None else float(reward)
        except (TypeError, ValueError):
            raise OpenEnvError(
                f"OpenEnv server {self.base_url}: {kind} gave reward {reward!r}, not a number"
            ) from None
        if value != value or value in (float("inf"), float("-inf")):
            raise OpenEnvError(
                f"OpenEnv server {self.base_url}: {kind} gave reward {value}, not a finite number"
            )
        info = {"observation": plain(observation), "reward_given": reward is not None}
        return self._text_of(observation), value, bool(reply.get("done", False)), info

    def _text_of(self, observation: dict[str, Any]) -> str:
        if self.observation_key is not None:
            if self.observation_key not in observation:
                raise OpenEnvError(
                    f"OpenEnv server {self.base_url}: the observation has no field {self.observation_key!r} "
                    f"(env_args.observation_key); its fields are {sorted(observation)}"
                )
            value = observation[self.observation_key]
            return value if isinstance(value, str) else json.dumps(plain(value))
        texts = [v for v in observation.values() if isinstance(v, str)]
        if len(texts) == 1:
            return texts[0]
        return json.dumps(plain(observation), sort_keys=True)


def _ws_url(base_url: str) -> str:
    """The session URL of a server at ``base_url``: ``http(s)://`` becomes ``ws(s)://``, plus ``/ws``."""
    base_url = base_url.rstrip("/")
    if base_url.startswith("https://"):
        base_url = "wss://" + base_url[len("https://") :]
    elif base_url.startswith("http://"):
        base_url = "ws://" + base_url[len("http://") :]
    return base_url if base_url.endswith("/ws") else base_url + "/ws"
