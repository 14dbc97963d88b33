"""Loss aggregation: reduce a ``[B, T]`` per-token loss to a scalar, exactly across micro-batches.

A training step is often split into micro-batches whose gradients are accumulated. To make the
accumulated gradient identical to that of one big batch, every mode divides by a *step-level*
normalizer computed over the whole step (all micro-batches), never per micro-batch.
:func:`step_normalizer` computes it from the step's masks; each micro-batch then calls
:func:`aggregate` with it and the results are simply summed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trine.config.algorithm import AGG_MODES


def step_normalizer(masks: list[Tensor], mode: str, *, max_response_length: int | None = None) -> float:
    """The divisor for ``mode`` over all micro-batch masks of one step.

    - ``token-mean``: number of action tokens in the step (DAPO's token-level loss).
    - ``seq-mean-token-sum`` / ``seq-mean-token-mean``: number of sequences in the step.
    - ``seq-mean-token-sum-norm``: number of sequences × ``max_response_length`` (Dr. GRPO's
      constant normalizer, arXiv 2503.20783).
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown loss aggregation {mode!r}; expected one of {AGG_MODES}")
    if mode == "token-mean":
        total = sum(float(m.sum()) for m in masks)
    else:
        total = float(sum(m.shape[0] for m in masks))
        if mode == "seq-mean-token-sum-norm":
            if not max_response_length:
                raise ValueError(
                    "seq-mean-token-sum-norm needs max_response_length (the sampling max_tokens)"
                )
            total *= max_response_length
    return max(total, 1.0)


def split_normalizer(
    masks: list[Tensor],
    is_expert: list[Tensor],
    mode: str,
    *,
    max_response_length: int | None = None,
) -> tuple[float, float]:
    """Step normalizers of the non-expert rows and of the expert rows, for ``mix_loss``.

    ``masks[k]`` is micro-batch ``k``'s ``[B_k, T_k]`` action mask and ``is_expert[k]`` its ``[B_k]``
    bool row flags. Returns ``(normalizer, expert_normalizer)``: :func:`step_normalizer` over each
    kind of row alone (1.0 when a kind is absent).
    """
    if len(masks) != len(is_expert):
        raise ValueError(
            f"got {len(masks)} masks but {len(is_expert)} is_expert flags; give one per micro-batch"
        )
    flags = [e.to(torch.bool).to(m.device) for m, e in zip(masks, is_expert)]
    policy = [m[~e] for m, e in zip(masks, flags)]
    expert = [m[e] for m, e in zip(masks, flags)]
    return (
        step_normalizer(policy, mode, max_response_length=max_response_length),
        step_normalizer(expert, mode, max_response_length=max_response_length),
    )


def aggregate(loss: Tensor, mask: Tensor, mode: str, normalizer: float) -> Tensor:
    """Aggregate per-token ``loss`` ``[B, T]`` under ``mask`` for one micro-batch.

    - ``token-mean``:              ``sum_{i,t} m_it l_it / N``
    - ``seq-mean-token-sum``:      ``sum_i (sum_t m_it l_it) / N``
    - ``seq-mean-token-mean``:     ``sum_i (sum_t m_it l_it / sum_t m_it) / N``
    - ``seq-mean-token-sum-norm``: ``sum_{i,t} m_it l_it / N``  (N = sequences × max length)

    where ``N`` is the step-level ``normalizer`` from :func:`step_normalizer`. Summing this over the
    micro-batches of a step gives exactly the full-batch value.
    """
    mask = mask.to(loss.dtype)
    if mode == "seq-mean-token-mean":
        per_seq = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        return per_seq.sum() / normalizer
    if mode in AGG_MODES:
        return (loss * mask).sum() / normalizer
    raise ValueError(f"unknown loss aggregation {mode!r}; expected one of {AGG_MODES}")


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` where ``mask`` is 1 (0 if the mask is empty)."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1)


def masked_sum(values: Tensor, mask: Tensor) -> Tensor:
    return (values * mask.to(values.dtype)).sum()


def zeros_like_scalar(ref: Tensor) -> Tensor:
    return torch.zeros((), dtype=ref.dtype, device=ref.device)
