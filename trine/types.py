"""The nouns that cross stage boundaries: Task, Experience, SamplingParams, Completion.

Everything here is plain data (dataclasses of Python lists, numbers and strings) so it can be
queued, stored as JSON, sent to another process or Ray actor, and read by any stage without
importing another stage.
"""

from __future__ import annotations

import itertools
import math
import numbers
import os
import uuid
from dataclasses import asdict, dataclass, field, fields
from typing import Any

_counter = itertools.count()


def new_id(prefix: str = "") -> str:
    """A short unique id, unique across processes (pid + counter + random suffix)."""
    return f"{prefix}{os.getpid():x}-{next(_counter):x}-{uuid.uuid4().hex[:6]}"


@dataclass
class SamplingParams:
    """How a rollout model samples one request.

    Logprobs are those of the distribution a token was drawn from: ``log_softmax(logits / temperature)``,
    truncated to the top-k / top-p kept set and renormalised when top_k > 0 or top_p < 1. The trainer
    recomputes the same quantity (:mod:`trine.models.sampling`) from ``Experience.info["top_k"]`` /
    ``["top_p"]``, which the explorer records from the task's sampling settings.
    """

    temperature: float = 1.0
    """Softmax temperature; 0 means greedy decoding."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability sums to top_p (1 = off)."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 = off; RL wants it off)."""
    max_tokens: int = 64
    """Maximum number of new tokens per completion."""
    n: int = 1
    """Number of completions to sample for the prompt."""
    stop: list[str] = field(default_factory=list)
    """Stop strings: generation ends once the decoded response contains one (it is kept)."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Extra stop token ids besides the tokenizer's eos."""
    seed: int | None = None
    """Seed for this request; None uses the engine's own generator (reproducible from its seed)."""
    ignore_eos: bool = False
    """Keep generating past eos until max_tokens or a stop token (benchmarks, fixed-length sampling)."""

    def replace(self, **changes: Any) -> SamplingParams:
        data = asdict(self)
        data.update(changes)
        return SamplingParams(**data)


@dataclass
class Completion:
    """What a rollout model returns for one sample."""

    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    """"stop" (eos, stop token or stop string) or "length" (max_tokens reached)."""
    policy_version: int | None = None
    """The weights version its first token was sampled with (None: the engine does not say)."""
    token_versions: list[int] | None = None
    """The weights version each response token was sampled with, when they differ (a partial rollout
    went on under new weights); None when all tokens come from one version."""


@dataclass
class Task:
    """One row of a taskset plus how to run it."""

    task_id: str
    """Stable id of the row (taskset name + row index unless the data carries one)."""
    question: str | list[dict[str, str]]
    """The prompt: a user message text, or a full chat (list of {role, content})."""
    answer: Any = None
    """Reference answer given to the reward function (may be None)."""
    raw: dict[str, Any] = field(default_factory=dict)
    """The whole original row, for rewards and workflows that need more fields."""
    system_prompt: str | None = None
    workflow: str = "single_turn"
    """Workflow name (built-in) or "package.module:attr"."""
    reward: str = "exact_match"
    """Reward function name (built-in) or "package.module:attr"."""
    repeat: int = 1
    """Group size: how many rollouts to run for this task."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    taskset: str = "train"
    """Name of the taskset the task came from."""
    workflow_args: dict[str, Any] = field(default_factory=dict)
    reward_args: dict[str, Any] = field(default_factory=dict)

    def messages(self) -> list[dict[str, str]]:
        """The chat to send: the system prompt (if any) followed by the question."""
        chat = (
            list(self.question)
            if isinstance(self.question, list)
            else [{"role": "user", "content": self.question}]
        )
        if self.system_prompt and not (chat and chat[0].get("role") == "system"):
            chat.insert(0, {"role": "system", "content": self.system_prompt})
        return chat


EXPERIENCE_KINDS = ("rollout", "sft", "preference")


TRAJECTORY_STATUSES: tuple[str, ...] = (
    "ok",
    "truncated",
    "timeout",
    "env_error",
    "tool_error",
    "reward_error",
)
"""How a trajectory ended: ``ok``; ``truncated`` (a token budget, ``max_tokens`` or ``max_turns`` ran out
before the episode ended); ``timeout`` (a turn took longer than its limit); ``env_error`` (the environment
raised or hung); ``tool_error`` (a tool failed so that the episode could not go on); ``reward_error`` (the
reward could not be computed: stored with reward 0 and this status, never a silent 0)."""


@dataclass
class Experience:
    """One trajectory (or one step of one), as the trainer needs it.

    ``tokens`` holds prompt + response; ``action_mask`` and ``logprobs`` cover only the response
    part (``len(tokens) - prompt_length`` entries). ``action_mask`` is 1 for tokens the model
    generated and 0 for observation/tool text appended by a workflow.
    """

    tokens: list[int]
    prompt_length: int
    action_mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    """Behaviour-policy logprobs of the response tokens (0 where action_mask is 0)."""
    reward: float | None = None
    """Scalar reward; None while the reward is pending."""
    token_rewards: list[float] | None = None
    task_id: str = ""
    group_id: str = ""
    """Experiences that are alternatives for the same prompt share a group_id (GRPO groups)."""
    run_id: str = ""
    """One rollout of a task; the steps of a multi-step rollout share it."""
    step: int = 0
    """Index of the step within its run (multi-step workflows)."""
    policy_version: int = 0
    """Version of the weights that produced the response."""
    kind: str = "rollout"
    """"rollout", "sft" or "preference"."""
    status: str = "ok"
    """How the trajectory ended (:data:`TRAJECTORY_STATUSES`); experiences whose status is not in
    ``trainer.train_statuses`` are stored for inspection but kept out of the loss."""
    info: dict[str, Any] = field(default_factory=dict)
    """Free-form JSON-able details: reward parts, response text, finish reason..."""
    id: str = field(default_factory=new_id)

    @property
    def response_length(self) -> int:
        return len(self.tokens) - self.prompt_length

    @property
    def response_tokens(self) -> list[int]:
        return self.tokens[self.prompt_length :]

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Experience:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def check(self) -> None:
        """Raise ValueError if a field has the wrong type or the fields are inconsistent."""
        self._check_types()
        n = self.response_length
        if self.prompt_length < 0 or n < 0:
            raise ValueError(
                f"Experience {self.id}: prompt_length={self.prompt_length} does not fit "
                f"{len(self.tokens)} tokens; expected 0 <= prompt_length <= len(tokens)."
            )
        if len(self.action_mask) != n:
            raise ValueError(
                f"Experience {self.id}: action_mask has {len(self.action_mask)} entries but the "
                f"response has {n} tokens; build it with one entry per response token."
            )
        if self.logprobs is not None and len(self.logprobs) != n:
            raise ValueError(
                f"Experience {self.id}: logprobs has {len(self.logprobs)} entries but the "
                f"response has {n} tokens; pass one logprob per response token (0 for masked)."
            )
        if self.kind not in EXPERIENCE_KINDS:
            raise ValueError(f"Experience {self.id}: kind={self.kind!r}; expected one of {EXPERIENCE_KINDS}.")
        if self.status not in TRAJECTORY_STATUSES:
            raise ValueError(
                f"Experience {self.id}: status={self.status!r}; expected one of {TRAJECTORY_STATUSES}."
            )

    def _check_types(self) -> None:
        if not isinstance(self.tokens, list) or not all(type(t) is int for t in self.tokens):
            bad = (
                self.tokens
                if not isinstance(self.tokens, list)
                else next(t for t in self.tokens if type(t) is not int)
            )
            raise ValueError(
                f"Experience {self.id}: tokens must be a list of Python ints, found {_short(bad)} of type "
                f"{type(bad).__name__}; convert token ids with list(...) / .tolist()."
            )
        for name in ("action_mask", "logprobs", "token_rewards"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, list):
                raise ValueError(
                    f"Experience {self.id}: {name} is {_short(value)} of type {type(value).__name__}; "
                    "expected a list with one entry per response token."
                )
        reward = self.reward
        if reward is not None and (
            isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward)
        ):
            raise ValueError(
                f"Experience {self.id}: reward={_short(reward)} of type {type(reward).__name__}; expected "
                "None (pending) or a finite number. Return float(...) and guard against NaN/inf."
            )
        if type(self.prompt_length) is not int or type(self.step) is not int:
            raise ValueError(
                f"Experience {self.id}: prompt_length={self.prompt_length!r} and step={self.step!r} must "
                "be Python ints."
            )
        if not isinstance(self.info, dict):
            raise ValueError(
                f"Experience {self.id}: info is {_short(self.info)} of type {type(self.info).__name__}; "
                "expected a dict."
            )


def _short(value: Any, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
