"""Policy-gradient losses: pure functions of per-token tensors.

Shapes: ``logprobs``, ``old_logprobs``, ``action_mask`` are ``[B, T]`` over response tokens;
``advantages`` is ``[B, T]`` (or ``[B]``, broadcast over tokens). Every loss returns
``(loss, stats)``: a scalar aggregated with :func:`~trine.algorithms.aggregation.aggregate` under the
step-level ``normalizer`` (so micro-batch losses sum to the full-step loss), and a dict of
detached floats that are means over this micro-batch's action tokens. Every loss accepts (and
ignores) extra keyword inputs it does not use, so the trainer may pass a superset.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trine.algorithms.aggregation import aggregate, masked_mean


def per_token(advantages: Tensor, like: Tensor) -> Tensor:
    """``[B]`` advantages broadcast to ``like``'s ``[B, T]`` shape (``[B, T]`` passes through)."""
    return advantages.unsqueeze(-1).expand_as(like) if advantages.dim() == 1 else advantages


def _need_advantages(name: str, advantages: Tensor | None) -> Tensor:
    if advantages is None:
        raise ValueError(f"the {name} loss needs advantages; give the algorithm an advantage function.")
    return advantages


def ratio_stats(ratio: Tensor, log_ratio: Tensor, action_mask: Tensor) -> dict[str, float]:
    """``approx_kl`` (``E[(ρ-1) - log ρ]``, k3 estimate of KL(old‖new)) and ``ratio_mean``."""
    with torch.no_grad():
        return {
            "approx_kl": float(masked_mean((ratio - 1) - log_ratio, action_mask)),
            "ratio_mean": float(masked_mean(ratio, action_mask)),
        }


def ppo_clip_per_token(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    log_ratio_clamp: float = 20.0,
    dual_clip_c: float | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Per-token PPO-clip loss ``[B, T]`` plus the tensors its stats are made of (see ppo_clip_loss)."""
    if dual_clip_c is not None and dual_clip_c <= 1.0:
        raise ValueError(f"dual_clip_c must be > 1 (typically 3), got {dual_clip_c}; or None to disable")
    adv = per_token(advantages, logprobs)
    log_ratio = (logprobs - old_logprobs).clamp(-log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    parts = {"ratio": ratio, "log_ratio": log_ratio, "clip_taken": clipped < unclipped}
    if dual_clip_c is not None:
        bound = -dual_clip_c * adv  # = c·|A| where A < 0
        dual_taken = (adv < 0) & (loss > bound)
        loss = torch.where(dual_taken, bound, loss)
        parts["dual_taken"] = dual_taken
    return loss, parts


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
    dual_clip_c: float | None = None,
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate with separate lower/upper clip ranges and optional dual clip.

    ``ρ_t = exp(logπ_θ(a_t) - logπ_old(a_t))``,
    ``L_t = -min(ρ_t A_t, clip(ρ_t, 1 - ε_low, 1 + ε_high) A_t)``; with ``dual_clip_c = c > 1``,
    for ``A_t < 0`` additionally ``L_t ← min(L_t, c·|A_t|)`` (no gradient past the bound).

    Symmetric clipping is Schulman et al., "Proximal Policy Optimization Algorithms",
    arXiv 1707.06347; the decoupled ``ε_high > ε_low`` ("clip-higher") is from DAPO, arXiv 2503.14476;
    dual clip from Ye et al., "Mastering Complex Control in MOBA Games with Deep RL", arXiv 1912.09729.
    ``log_ratio_clamp`` bounds the log-ratio before ``exp`` for numerical safety.

    Stats: ``clipfrac`` (fraction of tokens where the clipped branch was taken), ``approx_kl``
    (``E[(ρ - 1) - log ρ]``, Schulman's k3 estimate of KL(old‖new)), ``ratio_mean``, and
    ``dual_clipfrac`` when dual clip is on.
    """
    advantages = _need_advantages("ppo_clip", advantages)
    loss_t, parts = ppo_clip_per_token(
        logprobs,
        old_logprobs,
        advantages,
        clip_low=clip_low,
        clip_high=clip_high,
        log_ratio_clamp=log_ratio_clamp,
        dual_clip_c=dual_clip_c,
    )
    loss = aggregate(loss_t, action_mask, agg_mode, normalizer)
    stats = ratio_stats(parts["ratio"], parts["log_ratio"], action_mask)
    stats["clipfrac"] = float(masked_mean(parts["clip_taken"].to(logprobs.dtype), action_mask))
    if "dual_taken" in parts:
        stats["dual_clipfrac"] = float(masked_mean(parts["dual_taken"].to(logprobs.dtype), action_mask))
    return loss, stats


def pg_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    normalizer: float,
    agg_mode: str = "token-mean",
    log_ratio_clamp: float = 20.0,
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """Importance-weighted policy gradient without clipping: ``L_t = -ρ_t A_t``.

    On-policy (``ρ = 1``) its gradient is REINFORCE's ``-A_t ∇logπ_θ(a_t)``. Williams, "Simple
    statistical gradient-following algorithms for connectionist RL" (1992); importance weighting as
    in Degris et al., "Off-Policy Actor-Critic", arXiv 1205.4839.
    """
    advantages = _need_advantages("pg", advantages)
    log_ratio = (logprobs - old_logprobs).clamp(-log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    loss = aggregate(-ratio * per_token(advantages, logprobs), action_mask, agg_mode, normalizer)
    return loss, ratio_stats(ratio, log_ratio, action_mask)


def gspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    normalizer: float,
    agg_mode: str = "seq-mean-token-mean",
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    log_ratio_clamp: float = 20.0,
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """Group Sequence Policy Optimization (token form, "GSPO-token").

    Sequence ratio ``s_i = exp( (1/|y_i|) Σ_t m_t (logπ_θ - logπ_old) )``; per token
    ``s_it = sg(s_i) · π_θ(y_t) / sg(π_θ(y_t))`` (value ``s_i``, gradient ``s_i ∇logπ_θ(y_t)``),
    ``L_t = -min(s_it A_t, clip(s_it, 1 - ε_low, 1 + ε_high) A_t)``. With ``[B]`` advantages and
    ``seq-mean-token-mean`` aggregation (the paper's) this is exactly sequence-level GSPO; when every
    response is a single token it equals :func:`ppo_clip_loss`.

    Paper: Zheng et al., "Group Sequence Policy Optimization", arXiv 2507.18071 (clip ranges
    3e-4 / 4e-4 there).
    """
    advantages = _need_advantages("gspo", advantages)
    mask = action_mask.to(logprobs.dtype)
    token_log_ratio = logprobs - old_logprobs
    seq_log_ratio = (token_log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    seq_log_ratio = seq_log_ratio.clamp(-log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(logprobs - logprobs.detach() + seq_log_ratio.detach().unsqueeze(-1))
    adv = per_token(advantages, logprobs)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    loss = aggregate(-torch.minimum(unclipped, clipped), action_mask, agg_mode, normalizer)
    with torch.no_grad():
        has_tokens = mask.sum(-1) > 0
        stats = ratio_stats(torch.exp(token_log_ratio), token_log_ratio, action_mask)
        stats["clipfrac"] = float(masked_mean((clipped < unclipped).to(mask.dtype), action_mask))
        seq_ratio = torch.exp(seq_log_ratio)[has_tokens]
        stats["seq_ratio_mean"] = float(seq_ratio.mean()) if seq_ratio.numel() else 1.0
    return loss, stats


def cispo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    normalizer: float,
    agg_mode: str = "token-mean",
    clip_low: float = 1.0,
    clip_high: float = 0.28,
    log_ratio_clamp: float = 20.0,
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """CISPO: clipped importance-sampling weight (stop-gradient) times the REINFORCE term.

    ``L_t = -sg(clip(ρ_t, 1 - ε_low, 1 + ε_high)) · A_t · logπ_θ(a_t)``: every token keeps a gradient
    (none is clipped away as in PPO); only the IS weight is truncated. The default ``ε_low = 1``
    means no lower bound, as in the paper. Paper: MiniMax, "MiniMax-M1: Scaling Test-Time Compute
    Efficiently with Lightning Attention", arXiv 2506.13585, Eq. (4)-(5).

    Stats: ``clipfrac`` (fraction of tokens whose weight was truncated), ``approx_kl``, ``ratio_mean``.
    """
    advantages = _need_advantages("cispo", advantages)
    log_ratio = (logprobs - old_logprobs).clamp(-log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high).detach()
    loss_t = -weight * per_token(advantages, logprobs) * logprobs
    loss = aggregate(loss_t, action_mask, agg_mode, normalizer)
    stats = ratio_stats(ratio, log_ratio, action_mask)
    truncated = (ratio.detach() != weight).to(logprobs.dtype)
    stats["clipfrac"] = float(masked_mean(truncated, action_mask))
    return loss, stats


def sapo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    normalizer: float,
    agg_mode: str = "token-mean",
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    log_ratio_clamp: float = 20.0,
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """Soft Adaptive Policy Optimization: a smooth sigmoid gate instead of the hard clip.

    ``f(ρ) = σ(τ (ρ - 1)) · 4/τ`` with ``τ = τ_pos`` where ``A_t > 0`` and ``τ_neg`` otherwise;
    ``L_t = -f(ρ_t) A_t``. Its gradient weight ``4 σ(1 - σ) · ρ`` is 1 on-policy (``ρ = 1``) and decays
    smoothly off-policy; ``τ_neg > τ_pos`` damps negative-advantage updates faster. Formula and
    defaults as documented for SAPO in Trinity-RFT, ms-swift and AReaL.

    Paper: Gao et al., "Soft Adaptive Policy Optimization", arXiv 2511.20347.

    Stats: ``soft_gate_mean`` (mean of ``4σ(1-σ)``, 1 when on-policy), ``approx_kl``, ``ratio_mean``.
    """
    advantages = _need_advantages("sapo", advantages)
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"sapo temperatures must be > 0, got tau_pos={tau_pos}, tau_neg={tau_neg}")
    log_ratio = (logprobs - old_logprobs).clamp(-log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    adv = per_token(advantages, logprobs)
    tau = torch.where(adv > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss = aggregate(-gate * (4.0 / tau) * adv, action_mask, agg_mode, normalizer)
    stats = ratio_stats(ratio, log_ratio, action_mask)
    with torch.no_grad():
        stats["soft_gate_mean"] = float(masked_mean(4.0 * gate * (1.0 - gate), action_mask))
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
