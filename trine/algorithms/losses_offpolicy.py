"""Off-policy and preference losses: the three OPMD variants and DPO.

OPMD (online policy mirror descent) follows Appendix A of the Trinity-RFT report (arXiv 2505.17826).
The Kimi and pairwise variants are *sequence-level* losses ``l_i``; to keep micro-batch
accumulation exact they are broadcast to every action token of their row and reduced with
:func:`~trine.algorithms.aggregation.aggregate` under the step normalizer. With
``seq-mean-token-mean`` (the recommended mode for them) the result is ``Σ_i l_i / N_seq``; with
``token-mean`` it is the token-weighted average ``Σ_i |y_i| l_i / N_tok``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from trine.algorithms.aggregation import aggregate, masked_mean
from trine.algorithms.losses import per_token


def sequence_logps(logprobs: Tensor, action_mask: Tensor) -> Tensor:
    """``Σ_t m_t logprobs_t`` per row: the log-probability of each response (``[B, T] -> [B]``)."""
    return (logprobs * action_mask.to(logprobs.dtype)).sum(-1)


def sequence_advantages(advantages: Tensor, action_mask: Tensor) -> Tensor:
    """``[B]`` advantages as given, or the per-row mean over action tokens of ``[B, T]`` ones."""
    if advantages.dim() == 1:
        return advantages
    mask = action_mask.to(advantages.dtype)
    return (advantages * mask).sum(-1) / mask.sum(-1).clamp(min=1)


def _broadcast(seq_loss: Tensor, like: Tensor) -> Tensor:
    return seq_loss.unsqueeze(-1).expand_as(like)


def opmd_loss(
    logprobs: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    normalizer: float,
    agg_mode: str = "token-mean",
    tau: float = 1.0,
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """OPMD, "embarrassingly simple" variant: ``L_t = -A_t · logπ_θ(a_t) / (1 + τ)``.

    With ``A = r - mean(r_group)`` (``opmd`` advantages, ``baseline="mean"``) this is the policy
    gradient with a group-mean baseline, scaled by ``1/(1+τ)``; it is derived as one mirror-descent
    step that is valid off-policy. Trinity-RFT report, arXiv 2505.17826, App. A.3.
    """
    if tau < 0:
        raise ValueError(f"opmd tau must be >= 0, got {tau}")
    adv = per_token(advantages, logprobs)
    loss = aggregate(-adv * logprobs / (1.0 + tau), action_mask, agg_mode, normalizer)
    with torch.no_grad():
        stats = {"nll": float(masked_mean(-logprobs, action_mask))}
    return loss, stats


def opmd_kimi_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    action_mask: Tensor,
    *,
    normalizer: float,
    agg_mode: str = "seq-mean-token-mean",
    tau: float = 1.0,
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """Kimi k1.5's OPMD: squared consistency residual per response.

    ``l_i = ( r_i - τ log Ẑ - τ (logπ_θ(y_i) - logπ_old(y_i)) )²`` with
    ``τ log Ẑ = τ log mean_j exp(r_j / τ)`` over the group. ``advantages`` must be
    ``r_i - τ log Ẑ``: the ``opmd`` advantage with ``baseline="logmeanexp"`` and the same ``τ``
    (so the group never needs to sit in one micro-batch). ``logπ(y)`` is the sum over action tokens.

    Paper: Kimi Team, "Kimi k1.5: Scaling Reinforcement Learning with LLMs", arXiv 2501.12599,
    §2.3.2; Trinity-RFT report, arXiv 2505.17826, App. A.1.
    """
    if tau <= 0:
        raise ValueError(f"opmd_kimi tau must be > 0, got {tau}")
    seq_log_ratio = sequence_logps(logprobs - old_logprobs, action_mask)
    residual = sequence_advantages(advantages, action_mask) - tau * seq_log_ratio
    loss = aggregate(_broadcast(residual.square(), logprobs), action_mask, agg_mode, normalizer)
    with torch.no_grad():
        stats = {"consistency_residual_abs": float(residual.abs().mean()) if residual.numel() else 0.0}
    return loss, stats


def opmd_pairwise_loss(
    logprobs: Tensor,
    action_mask: Tensor,
    *,
    rewards: Tensor | None = None,
    group_ids: Tensor | None = None,
    old_logprobs: Tensor | None = None,
    ref_logprobs: Tensor | None = None,
    normalizer: float,
    agg_mode: str = "seq-mean-token-mean",
    tau: float = 1.0,
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """Pairwise OPMD: ``Σ_{i<j, same group} (a_i - a_j)² / (1+τ)²`` with
    ``a_i = r_i - τ (logπ_θ(y_i) - logπ_ref(y_i))``.

    ``π_ref`` is ``ref_logprobs`` when given, else the behaviour policy ``old_logprobs``. Each pair's
    loss is split half-half between its two rows (``l_i = ½ Σ_{j≠i} (a_i - a_j)² / (1+τ)²``), then
    aggregated. Only pairs inside this micro-batch are seen: the trainer must keep each group in one
    micro-batch. The ``1/(1+τ)²`` scale is App. A.3's; at ``θ = θ_ref`` the gradient is
    ``-2τ/(1+τ)² Σ_i K (r_i - r̄) ∇logπ(y_i)``.

    Trinity-RFT report, arXiv 2505.17826, App. A.2 (= contrastive policy gradient for K=2).
    """
    if rewards is None or group_ids is None:
        raise ValueError("opmd_pairwise needs rewards and group_ids ([B]) in the loss inputs.")
    ref = ref_logprobs if ref_logprobs is not None else old_logprobs
    if ref is None:
        raise ValueError("opmd_pairwise needs ref_logprobs or old_logprobs ([B, T]).")
    a = rewards.to(logprobs.dtype) - tau * sequence_logps(logprobs - ref, action_mask)
    same = group_ids.unsqueeze(0) == group_ids.unsqueeze(1)
    diff = (a.unsqueeze(1) - a.unsqueeze(0)).square() * same.to(a.dtype)
    seq_loss = 0.5 * diff.sum(-1) / (1.0 + tau) ** 2
    loss = aggregate(_broadcast(seq_loss, logprobs), action_mask, agg_mode, normalizer)
    with torch.no_grad():
        pairs = float((same.sum() - same.shape[0]) / 2)
        stats = {"opmd_pairs": pairs}
    return loss, stats


def dpo_loss(
    chosen_logps: Tensor,
    rejected_logps: Tensor,
    ref_chosen_logps: Tensor,
    ref_rejected_logps: Tensor,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
    normalizer: float | None = None,
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """Direct Preference Optimization on sequence log-probabilities (sums over response tokens).

    ``z = β[(logπ(y_w) - logπ_ref(y_w)) - (logπ(y_l) - logπ_ref(y_l))]``,
    ``l = -(1-ε) log σ(z) - ε log σ(-z)`` (``ε`` = ``label_smoothing``, conservative DPO).
    The loss is ``Σ l / normalizer`` (give the number of pairs in the whole step for exact
    micro-batch accumulation) or the mean over pairs when ``normalizer`` is None.

    Paper: Rafailov et al., "Direct Preference Optimization", arXiv 2305.18290.

    Stats: ``reward_margin`` (mean of ``β`` log-ratio margin), ``reward_accuracy`` (fraction with
    chosen reward > rejected reward), ``chosen_reward``, ``rejected_reward``.
    """
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"dpo label_smoothing must be in [0, 0.5), got {label_smoothing}")
    chosen_reward = beta * (chosen_logps - ref_chosen_logps)
    rejected_reward = beta * (rejected_logps - ref_rejected_logps)
    z = chosen_reward - rejected_reward
    losses = -(1.0 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)
    loss = losses.sum() / normalizer if normalizer is not None else losses.mean()
    with torch.no_grad():
        stats = {
            "reward_margin": float(z.mean()),
            "reward_accuracy": float((chosen_reward > rejected_reward).float().mean()),
            "chosen_reward": float(chosen_reward.mean()),
            "rejected_reward": float(rejected_reward.mean()),
        }
    return loss, stats
