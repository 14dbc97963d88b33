"""A rollout-model interface over any OpenAI-compatible server (vLLM, SGLang, ``trine serve``, a hosted API).

:class:`OpenAIModel` speaks the chat-completions API through the official ``openai`` client (extra
``agents``). It implements the parts of :class:`~trine.models.protocol.RolloutModel` that a remote model
can: ``await chat(messages, params)`` returns :class:`~trine.types.Completion` objects with the text, the
finish reason and, where the server returns them, per-token logprobs. It cannot return the token ids it
sampled (the chat API does not carry them), so it serves **auxiliary** models — a judge, a second agent,
a user simulator — whose text a workflow reads, not a policy being trained; ``generate`` on token ids,
``load_weights`` and checkpoints of the sampling stream say so with a clear error. The policy's rollout
engine over such a server (token ids via ``/v1/completions``) is its subclass
:class:`~trine.models.openai_engine.OpenAIEngine` (``model.engine: openai``).

One ``AsyncOpenAI`` client is kept per event loop (an explorer and its evaluator run different loops).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from typing import Any

from trine.types import Completion, SamplingParams


class OpenAIModel:
    """Chat completions from ``model`` at ``base_url`` (e.g. ``http://127.0.0.1:8000/v1``).

    Args:
        base_url: the server's ``/v1`` URL.
        model: the model name the server expects.
        api_key_env: name of the environment variable holding the API key (None: no key, "EMPTY").
        timeout: seconds per request.
        tokenizer: optional tokenizer (only for callers that want ``encode_chat``).
    """

    policy_version = 0

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str | None = None,
        timeout: float = 60.0,
        tokenizer: Any = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"base_url={base_url!r}; expected an http(s) URL such as http://127.0.0.1:8000/v1"
            )
        if api_key_env is not None and not os.environ.get(api_key_env):
            raise ValueError(
                f"api_key_env={api_key_env!r} names an environment variable that is not set; export it "
                "(the key itself never goes into a config file)."
            )
        self.base_url, self.model, self.timeout, self.tokenizer = base_url, model, timeout, tokenizer
        self.api_key = os.environ[api_key_env] if api_key_env else "EMPTY"
        self._clients: dict[int, tuple[asyncio.AbstractEventLoop, Any]] = {}

    def _client(self) -> Any:
        """The client of the running event loop (made on first use; those of closed loops are dropped,
        so a new loop that reuses a closed one's id never gets its client)."""
        loop = asyncio.get_running_loop()
        entry = self._clients.get(id(loop))
        if entry is None or entry[0] is not loop:
            from openai import AsyncOpenAI

            for key in [k for k, (other, _) in self._clients.items() if other.is_closed()]:
                del self._clients[key]
            client = AsyncOpenAI(
                base_url=self.base_url, api_key=self.api_key, timeout=self.timeout, max_retries=1
            )
            entry = self._clients[id(loop)] = (loop, client)
        return entry[1]

    async def chat(self, messages: list[dict[str, Any]], params: SamplingParams) -> list[Completion]:
        """``params.n`` chat completions of ``messages`` (text, finish reason, logprobs if returned)."""
        request: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "n": params.n,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_tokens,
            "logprobs": True,
        }
        if params.stop:
            request["stop"] = list(params.stop)
        if params.seed is not None:
            request["seed"] = params.seed
        response = await self._client().chat.completions.create(**request)
        out = []
        for choice in response.choices:
            content = choice.logprobs.content if choice.logprobs is not None else None
            out.append(
                Completion(
                    prompt_ids=[],
                    response_ids=[],
                    logprobs=[float(t.logprob) for t in content] if content else [],
                    text=choice.message.content or "",
                    finish_reason=choice.finish_reason or "stop",
                )
            )
        return out

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        raise NotImplementedError(
            f"OpenAIModel({self.base_url}) samples chats, not token ids: call chat(messages, params). A policy "
            "trained token-in token-out needs model.engine: hf, or model.engine: openai (OpenAIEngine, over a "
            "server that returns token ids)."
        )

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        raise NotImplementedError(
            f"OpenAIModel({self.base_url}) serves remote weights; it cannot load new ones"
        )

    @contextlib.contextmanager
    def seeded(self, seed: int) -> Iterator[None]:
        """Remote sampling: pass ``SamplingParams.seed`` per request instead (nothing to do here)."""
        yield

    def state_dict(self) -> dict[str, Any]:
        return {"policy_version": self.policy_version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None

    def close(self) -> None:
        """Forget the clients (their connections close with their event loops)."""
        self._clients.clear()
