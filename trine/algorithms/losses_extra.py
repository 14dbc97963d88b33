"""Losses beyond plain policy gradient: RL + expert SFT mix, on-policy distillation, critic loss.

Same conventions as :mod:`trine.algorithms.losses`: ``[B, T]`` per-token tensors, aggregation with
the step-level normalizer, ``(loss, stats)`` out, unused keyword inputs ignored.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trine.algorithms.aggregation import aggregate, masked_mean
from trine.algorithms.losses import ppo_clip_per_token, ratio_stats


def mix_loss(
    logprobs: Tensor,
    old_logprobs: Tensor | None,
    advantages: Tensor | None,
    action_mask: Tensor,
    *,
    is_expert: Tensor | None = None,
    normalizer: float,
    expert_normalizer: float | None = None,
    agg_mode: str = "token-mean",
    mu: float = 0.1,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    log_ratio_clamp: float = 20.0,
    dual_clip_c: float | None = None,
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """``(1-μ) · PPO-clip on policy rows + μ · SFT NLL on expert rows``.

    ``L = (1-μ) · agg(ℓ^PPO, m ⊙ ¬e, N_rl) + μ · agg(-logπ_θ, m ⊙ e, N_exp)`` where ``e`` is
    ``is_expert`` per row. **Normalizer split:** each part is normalized over its own rows of the
    whole step: ``normalizer`` must be the step normalizer of the non-expert rows and
    ``expert_normalizer`` that of the expert rows — compute both with
    :func:`~trine.algorithms.aggregation.split_normalizer`. Summed over micro-batches this is exact.
    If ``expert_normalizer`` is None both parts divide by ``normalizer`` (then give the normalizer
    of the whole step; each part then weighs by its share of the step's tokens/rows).

    Expert rows' advantages and old logprobs are ignored. Paper: Trinity-RFT's MIX algorithm
    (arXiv 2505.17826), in the spirit of LUFFY, Yan et al., arXiv 2504.14945.

    Stats: the PPO stats over policy tokens, ``expert_nll``, ``expert_fraction`` (of rows).
    """
    if is_expert is None:
        raise ValueError("mix needs is_expert ([B] bool per row) in the loss inputs.")
    if not 0.0 <= mu <= 1.0:
        raise ValueError(f"mix mu must be in [0, 1], got {mu}")
    expert = is_expert.to(torch.bool).unsqueeze(-1)
    mask = action_mask.to(logprobs.dtype)
    rl_mask = mask * (~expert).to(mask.dtype)
    sft_mask = mask * expert.to(mask.dtype)
    adv = torch.zeros_like(logprobs) if advantages is None else advantages
    if adv.dim() == 1:
        adv = adv.unsqueeze(-1).expand_as(logprobs)
    adv = torch.where(expert, torch.zeros_like(adv), adv)  # no NaN leaks from expert rows
    old = logprobs.detach() if old_logprobs is None else torch.where(expert, logprobs.detach(), old_logprobs)
    rl_t, parts = ppo_clip_per_token(
        logprobs,
        old,
        adv,
        clip_low=clip_low,
        clip_high=clip_high,
        log_ratio_clamp=log_ratio_clamp,
        dual_clip_c=dual_clip_c,
    )
    rl = aggregate(rl_t, rl_mask, agg_mode, normalizer)
    sft = aggregate(
        -logprobs, sft_mask, agg_mode, normalizer if expert_normalizer is None else expert_normalizer
    )
    loss = (1.0 - mu) * rl + mu * sft
    stats = ratio_stats(parts["ratio"], parts["log_ratio"], rl_mask)
    with torch.no_grad():
        stats["clipfrac"] = float(masked_mean(parts["clip_taken"].to(mask.dtype), rl_mask))
        stats["expert_nll"] = float(masked_mean(-logprobs, sft_mask))
        stats["expert_fraction"] = float(expert.float().mean()) if expert.numel() else 0.0
    return loss, stats


def distill_loss(
    logprobs: Tensor,
    teacher_logprobs: Tensor | None,
    action_mask: Tensor,
    *,
    old_logprobs: Tensor | None = None,
    normalizer: float,
    agg_mode: str = "token-mean",
    log_ratio_clamp: float = 20.0,
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """On-policy distillation: minimize the per-token reverse KL to a teacher on student samples.

    ``k_t = logπ_θ(a_t) - logπ_T(a_t)`` (sampled estimate of KL(π_θ ‖ π_T) at token t),
    ``L_t = ρ_t · sg(k_t)`` with ``ρ_t = exp(logπ_θ - logπ_old)`` (1 on-policy). Its value is the KL
    estimate; its gradient ``k_t ∇logπ_θ(a_t)`` is the policy gradient with per-token reward
    ``-k_t`` (differentiating ``k_t`` directly would give ``∇logπ_θ``, whose expectation is 0).

    Papers: Agarwal et al., "On-Policy Distillation of Language Models (GKD)", arXiv 2306.13649;
    Gu et al., "MiniLLM", arXiv 2306.08543; Thinking Machines, "On-Policy Distillation" (2025).

    Stats: ``reverse_kl`` (mean ``k_t`` over action tokens), ``ratio_mean``, ``approx_kl``.
    """
    if teacher_logprobs is None:
        raise ValueError("distill needs teacher_logprobs ([B, T]); configure a teacher model.")
    old = logprobs.detach() if old_logprobs is None else old_logprobs
    log_ratio = (logprobs - old).clamp(-log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    kl = (logprobs - teacher_logprobs).detach()
    loss = aggregate(ratio * kl, action_mask, agg_mode, normalizer)
    stats = ratio_stats(ratio, log_ratio, action_mask)
    stats["reverse_kl"] = float(masked_mean(kl, action_mask))
    return loss, stats


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    action_mask: Tensor,
    *,
    normalizer: float,
    agg_mode: str = "token-mean",
    clip_eps: float | None = 0.2,
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """Clipped critic loss: ``L_t = ½ max((V_t - R_t)², (clip(V_t, V_old ± ε) - R_t)²)``.

    ``clip_eps=None`` gives the plain ``½ (V_t - R_t)²``. ``returns`` are the GAE targets
    (:func:`~trine.algorithms.advantages_token.gae`). Value clipping as in the PPO reference
    implementation (Schulman et al., arXiv 1707.06347; discussed in Engstrom et al., arXiv 2005.12729).

    Stats: ``vf_clipfrac`` (fraction where the clipped term was larger), ``value_mean``,
    ``vf_error`` (mean ``(V - R)²``).
    """
    returns = returns.detach()
    unclipped = (values - returns).square()
    loss_t = unclipped
    clipped_larger = torch.zeros_like(unclipped, dtype=torch.bool)
    if clip_eps is not None:
        v_clip = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
        clipped = (v_clip - returns).square()
        loss_t = torch.maximum(unclipped, clipped)
        clipped_larger = clipped > unclipped
    loss = aggregate(0.5 * loss_t, action_mask, agg_mode, normalizer)
    with torch.no_grad():
        stats = {
            "vf_clipfrac": float(masked_mean(clipped_larger.to(values.dtype), action_mask)),
            "value_mean": float(masked_mean(values, action_mask)),
            "vf_error": float(masked_mean(unclipped, action_mask)),
        }
    return loss, stats
