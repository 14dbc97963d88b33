"""Config section of ``trine serve`` (:mod:`trine.serve`, :mod:`trine.launch.serve`): where it listens, who may
call it, and the limits that keep one client from starving the others (re-exported by :mod:`trine.config`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field, model_validator

from trine.config.base import Count, NonNegInt, Positive, Section

if TYPE_CHECKING:
    from trine.config import RunConfig, TasksConfig


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
    max_chars_per_token: Count = 32
    """The cheap bound checked before tokenizing: a prompt whose text has more than ``max_prompt_tokens`` x
    this many characters is refused at once (400), never tokenized. Real text averages 3-5 characters per
    token; raise it only for data made of very long tokens (e.g. long runs of spaces)."""
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
    keep_alive_timeout: Positive = 30.0
    """Seconds an idle HTTP keep-alive connection stays open (uvicorn's ``timeout_keep_alive``). Clients
    reuse connections; uvicorn's default of 5 s closes one just as a client sends its next request on it,
    which the client sees as a connection error."""
    idempotency_keys: Count = 4096
    """Answers to requests with an ``Idempotency-Key`` header kept in memory for retries (the oldest
    forgotten first); a recorded call's answer is also found in the buffer after that, or after a restart."""

    @model_validator(mode="after")
    def _limits(self) -> ServeConfig:
        if self.default_max_tokens > self.max_tokens:
            raise ValueError(
                f"serve.default_max_tokens={self.default_max_tokens} is above serve.max_tokens={self.max_tokens}; "
                "lower it or raise max_tokens"
            )
        return self


def serve_source_problems(tasks: TasksConfig, mode: str) -> list[str]:
    """``tasks.source: serve`` (the agents calling ``trine serve`` bring the tasks): mode async, a step
    count, no taskset."""
    problems = []
    if mode != "async":
        problems.append(
            f"tasks.source: serve trains on the calls agents make to `trine serve`, which runs beside a `trine "
            f"train` process of mode async (mode is {mode!r}); set mode: async"
        )
    if tasks.total_steps is None:
        problems.append(
            "tasks.source: serve needs tasks.total_steps (the most steps; buffer.end_after_idle ends the stage "
            "earlier once the agents stop)"
            + (
                f"; tasks.epochs={tasks.epochs} does not apply to served calls: remove it"
                if tasks.epochs
                else ""
            )
        )
    for key, given in (("train", tasks.train), ("mix", tasks.mix), ("expert", tasks.expert)):
        if given:
            problems.append(
                f"tasks.{key} is not read with tasks.source: serve (the agents send their own prompts to "
                f"`trine serve`); remove it, or remove tasks.source to explore a taskset with `trine explore`"
            )
    return problems


def serve_run_problems(cfg: RunConfig) -> list[str]:
    """What a served run (``tasks.source: serve``) needs beyond its tasks: its processes, a SQL buffer
    (:func:`trine.config.checks._process_problems` says so), the rows per step; and ``buffer.end_after_idle``
    below ``sync.wait_timeout`` in any run."""
    problems = []
    idle, wait = cfg.buffer.end_after_idle, cfg.sync.wait_timeout
    if idle is not None and wait is not None and idle >= wait:
        problems.append(
            f"buffer.end_after_idle={idle:g} is not below sync.wait_timeout={wait:g}: the trainer would fail "
            "waiting for a batch before it ends idle; lower end_after_idle or raise wait_timeout"
        )
    if cfg.tasks.source != "serve":
        return problems
    if cfg.launch != "processes" or cfg.cluster.backend != "local":
        problems.append(
            f"tasks.source: serve runs as two processes on this machine's run directory, `trine serve CONFIG` "
            f"and `trine train CONFIG` (launch is {cfg.launch!r}, cluster.backend {cfg.cluster.backend!r}); set "
            "launch: processes and remove cluster.backend"
        )
    if cfg.trainer.batch_size is None:
        problems.append(
            "tasks.source: serve needs trainer.batch_size, the rewarded rows each step trains on (e.g. 128 "
            "for 16 questions x 8 answers per agent round: a multiple of the agent's group size)"
        )
    return problems
