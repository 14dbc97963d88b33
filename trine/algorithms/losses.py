"""Policy losses: pure functions of per-token tensors.

Shapes: ``logprobs``, ``old_logprobs``, ``action_mask`` are ``[B, T]`` over response tokens;
``advantages`` is ``[B, T]`` (or ``[B]``, broadcast over tokens). Every loss returns
``(loss, stats)``: a scalar aggregated with :func:`~trine.algorithms.aggregation.aggregate` under the
step-level ``normalizer`` (so micro-batch losses sum to the full-step loss), and a dict of
detached floats that are means over this micro-batch's action tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trine.algorithms.aggregation import aggregate, masked_mean


def _per_token(advantages: Tensor, like: Tensor) -> Tensor:
    return advantages.unsqueeze(-1).expand_as(like) if advantages.dim() == 1 else advantages


def ppo_clip_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    normalizer: float,
    agg_mode: str = "token-mean",
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    log_ratio_clamp: float = 20.0,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate with separate lower/upper clip ranges.

    ``ρ_t = exp(logπ_θ(a_t) - logπ_old(a_t))``,
    ``L_t = -min(ρ_t A_t, clip(ρ_t, 1 - ε_low, 1 + ε_high) A_t)``.

    Symmetric clipping is Schulman et al., "Proximal Policy Optimization Algorithms",
    arXiv 1707.06347; the decoupled ``ε_high > ε_low`` ("clip-higher") is from DAPO, arXiv 2503.14476.
    ``log_ratio_clamp`` bounds the log-ratio before ``exp`` for numerical safety.

    Stats: ``clipfrac`` (fraction of tokens where the clipped branch was taken), ``approx_kl``
    (``E[(ρ - 1) - log ρ]``, Schulman's k3 estimate of KL(old‖new)), ``ratio_mean``.
    """
    adv = _per_token(advantages, logprobs)
    log_ratio = (logprobs - old_logprobs).clamp(-log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    loss = aggregate(per_token, action_mask, agg_mode, normalizer)
    with torch.no_grad():
        clip_taken = (clipped < unclipped).to(logprobs.dtype)
        stats = {
            "clipfrac": float(masked_mean(clip_taken, action_mask)),
            "approx_kl": float(masked_mean((ratio - 1) - log_ratio, action_mask)),
            "ratio_mean": float(masked_mean(ratio, action_mask)),
        }
    return loss, stats


def sft_loss(
    logprobs: Tensor,
    action_mask: Tensor,
    *,
    normalizer: float,
    agg_mode: str = "token-mean",
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """Supervised fine-tuning: negative log-likelihood of the target tokens.

    ``L = -Σ_t m_t log π_θ(y_t | x, y_<t) / N``, aggregated with the step normalizer ``N``.
    (Standard maximum-likelihood fine-tuning, e.g. Ouyang et al., arXiv 2203.02155, §3.5.)
    """
    loss = aggregate(-logprobs, action_mask, agg_mode, normalizer)
    with torch.no_grad():
        stats = {"nll": float(masked_mean(-logprobs, action_mask))}
    return loss, stats
