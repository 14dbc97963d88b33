"""``model.engine: openai``: the explorer samples the policy from an OpenAI-compatible server.

:class:`OpenAIEngine` is a :class:`~trine.models.protocol.RolloutModel` whose sampling happens on a server
(``trine serve`` on the run directory, vLLM >= 0.10.2, SGLang...) and whose tokenizer is local (``model.path``
/ ``model.tokenizer_path``: the trainer trains the local model, the server must serve the same weights).
It stays **token-in token-out**:

- ``await generate(prompt_ids, params)`` POSTs ``/v1/completions`` with the prompt as token ids, ``n``,
  temperature / top_p / top_k (sent only when > 0) / max_tokens / stop / seed, ``logprobs: 0`` (the
  logprob of each sampled token) and ``return_token_ids: true``. The server's ``token_ids`` per choice are
  the response tokens, its ``token_logprobs`` their behaviour logprobs; the text is decoded locally from the
  tokens (as :class:`~trine.models.engine.HFEngine` does: a stop string stays in it). ``policy_version``
  comes from the response's top-level ``policy_version`` (``trine serve`` sends it; None elsewhere).
- ``await chat(messages, params)`` renders the chat template **locally** (:meth:`encode_chat`) and calls
  :meth:`generate`, so multi-turn workflows see exactly the tokens they will train on.

Where it cannot, it says so (:class:`OpenAIEngineError`, naming the server, the missing field and the fix):
a response without ``token_ids`` (a hosted API, or vLLM without ``return_token_ids``) or without per-token
logprobs is refused rather than re-tokenized or recomputed: a policy cannot be trained token-in token-out
from text, and the behaviour logprobs are what the loss's importance ratio needs. ``load_weights`` is
refused too: the server loads its own weights (``trine serve`` loads the versions ``trine train`` publishes
into the run directory), which is why the engine is for mode async with ``launch: processes``
(:func:`trine.config.engines.engine_problems`).

A server error, a refused connection or a request past ``timeout`` raises :class:`OpenAIEngineError` in the
workflow that asked, so the explorer counts the task (retried, then skipped) — never a hang. One
``AsyncOpenAI`` client is kept per event loop (the explorer and its evaluator run different loops).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from trine.models.chat import encode_prompt
from trine.models.openai_model import OpenAIModel
from trine.types import Completion, SamplingParams

if TYPE_CHECKING:
    from trine.config import ExplorerConfig, ModelConfig

FIX = (
    "use a server that returns token ids and logprobs: `trine serve` on the run directory, or vLLM >= 0.10.2 "
    "(it honours return_token_ids); a text-only API cannot train a policy token-in token-out"
)


class OpenAIEngineError(RuntimeError):
    """The server failed, timed out, or answered without what a trained policy needs (see the message)."""


class OpenAIEngine(OpenAIModel):
    """Rollout engine over ``served_model`` at ``base_url`` (e.g. ``http://127.0.0.1:8000/v1``).

    Args:
        model: the local policy (unused: the server samples; kept for the engine constructor convention).
        tokenizer: the local tokenizer of the policy (chat template, decoding).
        base_url: the server's ``/v1`` URL.
        served_model: the model name the server expects in requests (``/v1/models`` lists it).
        api_key_env: environment variable holding the API key (None: no key).
        timeout: seconds one HTTP request may take (the client retries a failed one once).
        max_batch_size, seed: accepted for the engine convention; the server batches and seeds
            (``SamplingParams.seed`` is sent with each request that has one).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        base_url: str,
        served_model: str,
        api_key_env: str | None = None,
        timeout: float = 120.0,
        max_batch_size: int = 256,
        seed: int = 0,
    ) -> None:
        super().__init__(
            base_url, served_model, api_key_env=api_key_env, timeout=timeout, tokenizer=tokenizer
        )
        self.policy_version = 0
        """The newest weights version the server reported (0 until it reports one)."""

    weights = "server"
    """Where the weights it samples live (:mod:`trine.models.protocol`): on the server, which loads its own
    (published versions are not loaded into this engine)."""

    @classmethod
    def from_config(
        cls, model: Any, tokenizer: Any, section: ModelConfig, explorer: ExplorerConfig, seed: int
    ) -> OpenAIEngine:
        """The engine of ``model.engine: openai`` (the ``model`` config section ``section``): the server at
        ``model.base_url`` serving ``model.served_model``, one request taking up to ``model.timeout``."""
        assert section.base_url is not None and section.served_model is not None  # checked by ModelConfig
        timeout = {} if section.timeout is None else {"timeout": section.timeout}
        return cls(
            model,
            tokenizer,
            base_url=section.base_url,
            served_model=section.served_model,
            api_key_env=section.api_key_env,
            max_batch_size=explorer.max_batch_size,
            seed=seed,
            **timeout,
        )

    # ----------------------------------------------------------------- sampling
    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        """``params.n`` completions of ``prompt_ids`` sampled by the server (token ids and logprobs out)."""
        if not prompt_ids:
            raise ValueError("generate() got an empty prompt; pass at least one token id.")
        import openai

        request, extra = self._request(list(prompt_ids), params)
        try:
            response = await self._client().completions.create(**request, extra_body=extra)
        except openai.APITimeoutError:
            raise OpenAIEngineError(
                f"{self.base_url}: no answer within model.timeout={self.timeout:g}s; is the server overloaded or "
                "stuck? Raise model.timeout or lower explorer.max_concurrency."
            ) from None
        except openai.APIConnectionError as err:
            raise OpenAIEngineError(
                f"{self.base_url}: cannot connect ({err.__cause__ or err}); start the server (e.g. `trine serve "
                "CONFIG`) or fix model.base_url."
            ) from None
        except openai.APIStatusError as err:
            raise OpenAIEngineError(
                f"{self.base_url}: HTTP {err.status_code}: {_message(err)}"
                + (f"; check model.served_model={self.model!r}" if err.status_code == 404 else "")
            ) from None
        return self._completions(list(prompt_ids), response)

    async def chat(self, messages: list[dict[str, Any]], params: SamplingParams) -> list[Completion]:
        """The chat template applied locally (with the generation prompt), then :meth:`generate`."""
        return await self.generate(self.encode_chat(messages), params)

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of ``messages`` rendered with the local tokenizer's chat template."""
        return encode_prompt(self.tokenizer, messages)

    def _request(
        self, prompt_ids: list[int], params: SamplingParams
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The ``completions.create`` arguments and the non-OpenAI fields (``extra_body``)."""
        request: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt_ids,
            "n": params.n,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "max_tokens": params.max_tokens,
            "logprobs": 0,
        }
        if params.stop:
            request["stop"] = list(params.stop)
        if params.seed is not None:
            request["seed"] = params.seed
        extra: dict[str, Any] = {"return_token_ids": True, "record": False}  # trine serve: we record it
        if params.top_k > 0:
            extra["top_k"] = params.top_k
        if params.stop_token_ids:  # vLLM's extensions, sent only when used
            extra["stop_token_ids"] = list(params.stop_token_ids)
        if params.ignore_eos:
            extra["ignore_eos"] = True
        return request, extra

    def _completions(self, prompt_ids: list[int], response: Any) -> list[Completion]:
        """Completions from a ``text_completion`` response; :class:`OpenAIEngineError` where it lacks
        token ids or logprobs, or echoes another prompt."""
        top = response.model_extra or {}
        version = top.get("policy_version")
        if isinstance(version, int):
            self.policy_version = max(self.policy_version, version)
        out = []
        for choice in sorted(response.choices, key=lambda c: c.index):
            extra = choice.model_extra or {}
            echoed = top.get("prompt_token_ids", extra.get("prompt_token_ids"))
            if echoed is not None and list(echoed) != prompt_ids:
                raise OpenAIEngineError(
                    f"{self.base_url}: prompt_token_ids in the response differ from the {len(prompt_ids)} "
                    f"prompt ids sent (got {len(echoed)}); the server changed the prompt (e.g. added a BOS "
                    "token): configure it to take token-id prompts as they are"
                )
            ids = extra.get("token_ids")
            if ids is None:
                raise OpenAIEngineError(
                    f"{self.base_url}: the response has no 'token_ids' per choice (it answered return_token_ids"
                    f"=true with text only); {FIX}"
                )
            logprobs = getattr(choice.logprobs, "token_logprobs", None) if choice.logprobs else None
            if logprobs is None or len(logprobs) != len(ids):
                got = "none" if logprobs is None else f"{len(logprobs)} for {len(ids)} tokens"
                raise OpenAIEngineError(
                    f"{self.base_url}: the response lacks 'logprobs.token_logprobs' of the sampled tokens "
                    f"({got}; it was asked for logprobs=0); {FIX}"
                )
            out.append(
                Completion(
                    prompt_ids=list(prompt_ids),
                    response_ids=[int(i) for i in ids],
                    logprobs=[float(x) for x in logprobs],
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    finish_reason=choice.finish_reason or "stop",
                    policy_version=version if isinstance(version, int) else None,
                )
            )
        return out

    # ----------------------------------------------------------------- weights and state
    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Refused: the server loads its own weights (see :func:`trine.config.engines.engine_problems`)."""
        raise OpenAIEngineError(
            f"model.engine: openai samples {self.base_url}, which loads its own weights; it cannot load version "
            f"{version}. Run mode async with launch: processes and `trine serve` on the run directory (it "
            "loads the weights trine train publishes)."
        )

    @contextlib.contextmanager
    def seeded(self, seed: int) -> Iterator[None]:
        """Remote sampling: reproducible only through ``SamplingParams.seed`` per request (nothing to do)."""
        yield

    def state_dict(self) -> dict[str, Any]:
        return {"policy_version": self.policy_version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy_version = int(state.get("policy_version", self.policy_version))


def _message(err: Any) -> str:
    """The error message of an OpenAI error body (or the raw text)."""
    body = getattr(err, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
    return str(getattr(err, "message", err))
