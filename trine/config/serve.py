"""Config section of ``trine serve`` (:mod:`trine.serve`, :mod:`trine.launch.serve`): where it listens, who may
call it, and the limits that keep one client from starving the others (re-exported by :mod:`trine.config`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from trine.config.base import Count, NonNegInt, Positive, Section


class ServeConfig(Section):
    """The OpenAI-compatible server in front of the rollout model (``trine serve CONFIG``)."""

    host: str = "127.0.0.1"
    """Address to listen on (loopback by default: set ``0.0.0.0`` only behind ``api_key_env``)."""
    port: Annotated[int, Field(ge=0, le=65535)] = 8000
    """Port to listen on (0: a free one, printed at start)."""
    api_key_env: str | None = None
    """Environment variable holding the bearer token clients must send (None: no token asked); the
    token itself never goes into a config file."""
    model_name: str | None = None
    """The model name ``/v1/models`` lists and requests name (None: the run's ``name``)."""
    max_concurrent: Count = 64
    """Requests generating at once (the engine batches them)."""
    max_queue: NonNegInt = 256
    """Requests that may wait for a generating slot; beyond that a request gets 429."""
    max_prompt_tokens: Count | None = None
    """Longest prompt after the chat template (None: the model's context length minus ``max_tokens``)."""
    max_tokens: Count = 1024
    """Largest ``max_tokens`` a request may ask for."""
    default_max_tokens: Count = 256
    """``max_tokens`` of a request that does not say."""
    max_n: Count = 16
    """Largest ``n`` (choices per request)."""
    session_timeout: Positive = 600.0
    """Seconds an agent session may stay idle before it is written as it is (pending its reward)."""
    weights_poll_seconds: Positive = 1.0
    """How often the server looks for newer weights published by ``trine train``."""
    request_timeout: Positive = 600.0
    """Seconds one request may wait for the engine (and for a buffer write) before it gets 504."""

    @model_validator(mode="after")
    def _limits(self) -> ServeConfig:
        if self.default_max_tokens > self.max_tokens:
            raise ValueError(
                f"serve.default_max_tokens={self.default_max_tokens} is above serve.max_tokens={self.max_tokens}; "
                "lower it or raise max_tokens"
            )
        return self
