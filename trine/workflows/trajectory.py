"""Multi-turn conversations kept as tokens: the building block of agent workflows (token-in, token-out).

A :class:`Trajectory` starts from a chat (and optional tool specs) rendered once with the chat template.
Then, turn after turn:

- :meth:`Trajectory.add_completion` appends the model's sampled token ids **exactly as sampled** with
  ``action_mask`` 1, their behaviour logprobs and the weights version each was sampled with;
- :meth:`Trajectory.add_messages` appends what the world answered (user / tool messages) with
  ``action_mask`` 0: the end of the assistant's turn as the template writes it, then *only the new
  messages* rendered by the template, then the generation prompt. The history is never re-rendered or
  re-tokenized, so what the trainer sees is token for token what the model saw and produced.

The new messages are rendered as the difference between the template applied to a fixed two-message
chat and to that chat followed by them (:class:`ChatDelta`); a template that does not render a chat as a
prefix of its continuation is refused with a clear error.

A token budget (``max_tokens``: prompt + every turn + every observation) bounds the conversation:
:meth:`Trajectory.room` says how many tokens the next turn may sample, and an observation that does not
fit ends the episode with status ``"truncated"`` instead of raising. Every trajectory ends with a
status (:data:`STATUSES`) and a reason.

Two outputs from the same rollout:

- :meth:`Trajectory.experience`: one experience of the whole conversation (the observation tokens
  masked out), the concatenated form;
- :meth:`Trajectory.turn_experiences`: one experience per turn (prompt = everything before the turn,
  response = the turn's tokens), the step-wise form that GiGPO and per-turn rewards need.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Literal

from trine.types import TRAJECTORY_STATUSES, Completion, Experience, new_id

Status = Literal["ok", "truncated", "timeout", "env_error", "tool_error", "reward_error"]
STATUSES = TRAJECTORY_STATUSES

_PROBE = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "x"}]


class ChatDelta:
    """Incremental rendering with a tokenizer's chat template (cached per tokenizer and tool list)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        base = _render(tokenizer, _PROBE, generation_prompt=False)
        head = _render(tokenizer, _PROBE[:1], generation_prompt=True)
        _check_prefix(head + "x", base, "an assistant message after the generation prompt")
        self.base = base
        self.closing = base[len(head) + 1 :]
        """What the template writes after an assistant message's content (e.g. ``<|im_end|>\\n``)."""

    def messages(self, messages: list[dict[str, Any]]) -> str:
        """The text the template adds for ``messages`` after an assistant turn, with the generation prompt."""
        text = _render(self.tokenizer, [*_PROBE, *messages], generation_prompt=True)
        _check_prefix(
            self.base, text, f"{[m.get('role') for m in messages]} messages after an assistant turn"
        )
        return text[len(self.base) :]

    def close(self, response_ids: list[int]) -> str:
        """The rest of the assistant turn's closing text after ``response_ids`` (the template's end of turn,
        minus the end-of-turn token the model sampled itself, if it did)."""
        if response_ids:
            last = self.tokenizer.decode(response_ids[-1:], skip_special_tokens=False)
            if last and self.closing.startswith(last):
                return self.closing[len(last) :]
        return self.closing


@functools.lru_cache(maxsize=16)
def _delta_for(tokenizer: Any) -> ChatDelta:
    return ChatDelta(tokenizer)


@dataclass
class Turn:
    """One assistant turn: its sampled tokens are ``tokens[start:end]`` of the trajectory."""

    start: int
    end: int
    text: str
    finish_reason: str
    reward: float | None = None
    """A per-turn reward (step-level credit), if the workflow gives one."""
    info: dict[str, Any] = field(default_factory=dict)


class Trajectory:
    """A conversation as the exact token sequence the model saw and produced (see the module docstring).

    Args:
        tokenizer: the rollout model's tokenizer (its chat template renders the chat).
        messages: the opening chat (system / user messages).
        tools: tool specs in the OpenAI format (``ToolBox.specs()``), rendered by the template.
        max_tokens: token budget of the whole conversation (None: unbounded).
    """

    def __init__(
        self,
        tokenizer: Any,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        max_tokens: int | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.delta = _delta_for(tokenizer)
        self.messages: list[dict[str, Any]] = [dict(m) for m in messages]
        text = tokenizer.apply_chat_template(
            self.messages, tools=tools or None, tokenize=False, add_generation_prompt=True
        )
        self.tokens: list[int] = self._encode(text)
        self.prompt_length = len(self.tokens)
        self.mask: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.turns: list[Turn] = []
        self.max_tokens = max_tokens
        self.status: Status = "ok"
        self.reason = ""
        self.run_id = new_id("run-")
        if max_tokens is not None and self.prompt_length >= max_tokens:
            self.end(
                "truncated", f"the opening prompt has {self.prompt_length} tokens, max_tokens={max_tokens}"
            )

    # ------------------------------------------------------------------ building
    @property
    def ended(self) -> bool:
        """Whether :meth:`end` was called with a status other than ``ok`` (the episode cannot go on)."""
        return self.status != "ok"

    def room(self) -> int:
        """Tokens the next turn may sample within the budget (a large number when unbounded)."""
        return 1 << 30 if self.max_tokens is None else self.max_tokens - len(self.tokens)

    def add_completion(self, completion: Completion, version: int | None = None) -> Turn:
        """Append one sampled turn exactly as sampled (mask 1, its logprobs and versions)."""
        ids = list(completion.response_ids)
        if len(completion.logprobs) != len(ids):
            raise ValueError(
                f"a completion has {len(ids)} tokens but {len(completion.logprobs)} logprobs; the rollout "
                "engine must return one logprob per sampled token"
            )
        start = len(self.tokens)
        self.tokens += ids
        self.mask += [1] * len(ids)
        self.logprobs += list(completion.logprobs)
        sampled = completion.policy_version if completion.policy_version is not None else version
        self.versions += list(
            completion.token_versions or [sampled if sampled is not None else -1] * len(ids)
        )
        self.messages.append({"role": "assistant", "content": completion.text})
        turn = Turn(start, len(self.tokens), completion.text, completion.finish_reason)
        self.turns.append(turn)
        return turn

    def add_messages(self, messages: list[dict[str, Any]]) -> bool:
        """Close the assistant's turn and append ``messages`` (mask 0) and the generation prompt.

        Returns False — and ends the trajectory as ``truncated`` without appending — when they do not
        fit the token budget with at least one token left to sample."""
        if not self.turns:
            raise ValueError("add_messages() follows an assistant turn; add the opening chat to Trajectory()")
        last = self.tokens[self.turns[-1].start : self.turns[-1].end]
        ids = self._encode(self.delta.close(last) + self.delta.messages(messages))
        if self.max_tokens is not None and len(self.tokens) + len(ids) >= self.max_tokens:
            self.end(
                "truncated", f"an observation of {len(ids)} tokens does not fit max_tokens={self.max_tokens}"
            )
            return False
        version = self.versions[-1] if self.versions else -1
        self.tokens += ids
        self.mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [version] * len(ids)
        self.messages += [dict(m) for m in messages]
        return True

    def end(self, status: Status, reason: str = "") -> None:
        """Record how the episode ended (the first non-ok status wins)."""
        if status not in STATUSES:
            raise ValueError(f"status={status!r}; expected one of {STATUSES}")
        if self.status == "ok":
            self.status, self.reason = status, reason

    # ------------------------------------------------------------------ experiences
    def experience(
        self, reward: float | None, parts: dict[str, float] | None = None, temperature: float = 1.0
    ) -> Experience:
        """The whole conversation as one experience: response = every token after the opening prompt up
        to the end of the last turn, observation tokens masked out (concatenated form)."""
        end = self.turns[-1].end if self.turns else self.prompt_length
        n = end - self.prompt_length
        exp = Experience(
            tokens=self.tokens[:end],
            prompt_length=self.prompt_length,
            action_mask=self.mask[:n],
            logprobs=self.logprobs[:n],
            reward=reward,
            run_id=self.run_id,
            status=self.status,
            info=self._info(parts, temperature),
        )
        self._versions_info(exp, self.versions[:n])
        return exp

    def turn_experiences(
        self, reward: float | None, parts: dict[str, float] | None = None, temperature: float = 1.0
    ) -> list[Experience]:
        """One experience per turn (step-wise form): turn ``t``'s prompt is everything before it. Its
        reward is the turn's own (:attr:`Turn.reward`) when given, else the episode's ``reward``;
        ``info`` carries ``step_reward``, ``episode_return`` and ``last_step`` as step-wise workflows do."""
        out = []
        for t, turn in enumerate(self.turns):
            lo, hi = turn.start - self.prompt_length, turn.end - self.prompt_length
            step_reward = turn.reward if turn.reward is not None else reward
            exp = Experience(
                tokens=self.tokens[: turn.end],
                prompt_length=turn.start,
                action_mask=[1] * (turn.end - turn.start),
                logprobs=self.logprobs[lo:hi],
                reward=step_reward,
                run_id=self.run_id,
                step=t,
                status=self.status,
                info={**self._info(parts, temperature), **turn.info},
            )
            exp.info.update(
                step_reward=step_reward,
                episode_return=reward,
                last_step=t == len(self.turns) - 1,
                response=turn.text,
                finish_reason=turn.finish_reason,
            )
            self._versions_info(exp, self.versions[lo:hi])
            out.append(exp)
        return out

    def _info(self, parts: dict[str, float] | None, temperature: float) -> dict[str, Any]:
        last = self.turns[-1] if self.turns else None
        return {
            "response": last.text if last else "",
            "finish_reason": last.finish_reason if last else "",
            "reward_parts": dict(parts or {}),
            "temperature": temperature,
            "status_reason": self.reason,
            "turns": len(self.turns),
            "turn_rewards": [t.reward for t in self.turns],
        }

    @staticmethod
    def _versions_info(exp: Experience, versions: list[int]) -> None:
        known = [v for v in versions if v >= 0]
        if known and min(known) != max(known):
            exp.info["token_versions"] = versions

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if text else []


def _render(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def _check_prefix(before: str, after: str, what: str) -> None:
    if not after.startswith(before):
        raise ValueError(
            f"the chat template does not render {what} as a continuation of the conversation before it; "
            "token-in token-out multi-turn needs a prefix-consistent template (e.g. ChatML / Qwen2.5)"
        )
