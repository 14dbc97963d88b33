"""The batch inputs advantage and loss functions read, built from a step's experiences.

Per-sample inputs are ``[B]`` tensors in the step's order; per-token inputs are ``[B, R]`` tensors
right-aligned like the micro-batches (``R`` = the step's longest response), so a micro-batch takes
``x[rows][:, -R_mb:]``. Where the values come from:

| input | source |
|---|---|
| ``rewards`` | ``Experience.reward`` |
| ``group_ids`` | ``Experience.group_id`` (dense ids; an empty id is its own group) |
| ``run_ids`` / ``step_ids`` | ``(group_id, run_id)`` pairs / ``Experience.step`` (multi-step workflows) |
| ``state_ids`` | ``info["env_state_hash"]`` (dense ids; a step without one is its own state) |
| ``baseline_rewards`` | ``info["baseline_reward"]`` (e.g. ReMax's greedy rollout) |
| ``is_expert`` | ``kind == "sft"`` or ``info["expert"]`` (MIX) |
| ``action_mask`` | ``Experience.action_mask`` |
| ``token_rewards`` | ``Experience.token_rewards`` — the full per-token rewards (a workflow that sets them
  includes its outcome); rows without them get their ``reward`` on the last token. Only passed when
  some experience of the step has token rewards, so outcome-only steps use each function's own rule |
| ``teacher_logprobs`` | ``info["teacher_logprobs"]`` (on-policy distillation) |
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from trine.types import Experience

SAMPLE_INPUTS = ("rewards", "group_ids", "run_ids", "step_ids", "state_ids", "baseline_rewards", "is_expert")
TOKEN_INPUTS = ("action_mask", "token_rewards", "teacher_logprobs")


def dense_ids(keys: list[Any]) -> Tensor:
    """Dense integer ids ``0..G-1`` of ``keys`` in first-seen order."""
    seen: dict[Any, int] = {}
    return torch.tensor([seen.setdefault(k, len(seen)) for k in keys], dtype=torch.long)


def sample_inputs(exps: list[Experience], names: tuple[str, ...] = SAMPLE_INPUTS) -> dict[str, Tensor]:
    """The per-sample inputs in ``names`` (``[B]`` tensors)."""
    makers = {
        "rewards": lambda: torch.tensor([float(e.reward or 0.0) for e in exps], dtype=torch.float32),
        "group_ids": lambda: dense_ids([e.group_id or e.id for e in exps]),
        "run_ids": lambda: dense_ids([(e.group_id, e.run_id or e.id) for e in exps]),
        "step_ids": lambda: torch.tensor([e.step for e in exps], dtype=torch.long),
        "state_ids": lambda: dense_ids(
            [e.info.get("env_state_hash", ("own", i)) for i, e in enumerate(exps)]
        ),
        "baseline_rewards": lambda: torch.tensor([float(e.info.get("baseline_reward", 0.0)) for e in exps]),
        "is_expert": lambda: torch.tensor([e.kind == "sft" or bool(e.info.get("expert")) for e in exps]),
    }
    return {name: makers[name]() for name in names if name in makers}


def token_inputs(
    exps: list[Experience], names: tuple[str, ...], width: int | None = None
) -> dict[str, Tensor]:
    """The per-token inputs in ``names`` as right-aligned ``[B, width]`` tensors."""
    width = width or max(e.response_length for e in exps)
    sources = {
        "action_mask": lambda e: e.action_mask,
        "token_rewards": lambda e: e.token_rewards or _outcome_on_last_action(e),
        "teacher_logprobs": lambda e: _teacher(e),
    }
    out = {}
    for name in names:
        if name == "token_rewards" and not any(e.token_rewards for e in exps):
            continue
        if name in sources:
            out[name] = right_align([sources[name](e) for e in exps], width)
    return out


def right_align(values: list[list[float]], width: int) -> Tensor:
    """Right-align per-response-token lists into a ``[B, width]`` float tensor (zeros on the left)."""
    out = torch.zeros((len(values), width), dtype=torch.float32)
    for i, v in enumerate(values):
        if v:
            out[i, width - len(v) :] = torch.as_tensor(v, dtype=torch.float32)
    return out


def _outcome_on_last_action(e: Experience) -> list[float]:
    values = [0.0] * e.response_length
    actions = [i for i, m in enumerate(e.action_mask) if m]
    if actions:
        values[actions[-1]] = float(e.reward or 0.0)
    return values


def _teacher(e: Experience) -> list[float]:
    values = e.info.get("teacher_logprobs")
    if values is None or len(values) != e.response_length:
        raise ValueError(
            f"experience {e.id} has no teacher_logprobs for its {e.response_length} response tokens; "
            "on-policy distillation needs explorer.teacher set so the explorer scores samples with the teacher."
        )
    return values


def slice_rows(value: Tensor, rows: list[int], width: int) -> Tensor:
    """A micro-batch's share of a step-level input: its rows, and for ``[B, R]`` its last ``width`` columns."""
    picked = value[rows]
    return picked[:, -width:] if picked.dim() == 2 else picked
