"""Outcome-level advantage estimators: pure functions from rewards (and group ids) to advantages.

Every function takes tensors and plain numbers and returns ``(advantages, stats)`` where ``stats``
is a dict of detached floats. The estimators here return one advantage per sample (shape ``[B]``);
the trainer broadcasts it over the response tokens with ``action_mask``. Token-level estimators
(REINFORCE++, GAE) live in :mod:`trine.algorithms.advantages_token`, multi-step ones (step-wise
GRPO, GiGPO) in :mod:`trine.algorithms.advantages_multistep`.

Conventions shared by all group estimators: ``group_ids`` is a dense ``[B]`` long tensor (see
:func:`group_index`); a group of one sample has no baseline and gets advantage 0. Every function
accepts (and ignores) extra keyword inputs it does not use, so the trainer may pass a superset.
"""

from __future__ import annotations

import torch
from torch import Tensor

STD_SCOPES = ("group", "batch")
OPMD_BASELINES = ("mean", "logmeanexp")


def group_index(group_ids: list[str] | list[int]) -> Tensor:
    """Map arbitrary group ids to dense integer indices ``0..G-1`` (first-seen order)."""
    seen: dict = {}
    return torch.tensor([seen.setdefault(g, len(seen)) for g in group_ids], dtype=torch.long)


def group_stats(values: Tensor, index: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample group count, mean and unbiased std of ``values`` over groups given by ``index``.

    Singletons get std 0. Vectorised with ``index_add`` (no Python loop over groups).
    """
    num_groups = int(index.max().item()) + 1 if index.numel() else 0
    values = values.to(torch.float64)
    count = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, torch.ones_like(values))
    total = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, values)
    mean = total / count
    sq = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, (values - mean[index]) ** 2)
    var = torch.where(count > 1, sq / (count - 1).clamp(min=1), torch.zeros_like(sq))
    return count[index], mean[index], var.sqrt()[index]


def group_logmeanexp(values: Tensor, index: Tensor, tau: float) -> Tensor:
    """Per-sample ``τ · log( mean_{j in group} exp(v_j / τ) )``, computed stably (max-shifted)."""
    num_groups = int(index.max().item()) + 1 if index.numel() else 0
    x = values.to(torch.float64) / tau
    top = torch.full((num_groups,), -torch.inf, dtype=torch.float64).scatter_reduce(0, index, x, "amax")
    sums = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, torch.exp(x - top[index]))
    count = torch.zeros(num_groups, dtype=torch.float64).index_add_(0, index, torch.ones_like(x))
    return (tau * (top + torch.log(sums) - torch.log(count)))[index]


def advantage_stats(adv: Tensor, mask: Tensor | None = None) -> dict[str, float]:
    """``advantages_mean`` / ``advantages_abs_mean`` over samples (or over masked tokens)."""
    adv = adv.detach().to(torch.float64)
    if mask is None:
        weight = torch.ones_like(adv)
    else:
        weight = mask.to(torch.float64).expand_as(adv)
    n = float(weight.sum())
    if n == 0:
        return {"advantages_mean": 0.0, "advantages_abs_mean": 0.0}
    return {
        "advantages_mean": float((adv * weight).sum() / n),
        "advantages_abs_mean": float((adv.abs() * weight).sum() / n),
    }


def grpo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    std_normalize: bool = True,
    std_scope: str = "group",
    eps: float = 1e-6,
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """Group-relative advantages (GRPO).

    ``A_i = (r_i - mean(r_group)) / (std + eps)`` where ``std`` is the unbiased std of the sample's
    group (``std_scope="group"``, GRPO) or of all rewards of the batch (``std_scope="batch"``: group
    mean, batch std, the "Lite PPO" recipe of Liu et al., arXiv 2508.08221). ``std_normalize=False``
    gives ``A_i = r_i - mean`` (Dr. GRPO). A group of one sample gets advantage 0.

    Paper: Shao et al., "DeepSeekMath", arXiv 2402.03300, §4.1.2 (outcome supervision).

    Args:
        rewards: ``[B]`` scalar reward per sample.
        group_ids: ``[B]`` dense integer group index (see :func:`group_index`).
    """
    if std_scope not in STD_SCOPES:
        raise ValueError(f"unknown std_scope {std_scope!r}; expected one of {STD_SCOPES}")
    count, mean, group_std = group_stats(rewards, group_ids)
    r = rewards.to(torch.float64)
    adv = r - mean
    if std_normalize:
        std = group_std
        if std_scope == "batch":
            std = r.std() if r.numel() > 1 else torch.zeros((), dtype=torch.float64)
        adv = adv / (std + eps)
    adv = torch.where(count > 1, adv, torch.zeros_like(adv)).to(torch.float32)
    zero_var = ((group_std == 0) & (count > 1)).to(torch.float32)
    stats = advantage_stats(adv)
    stats["zero_std_fraction"] = float(zero_var.mean()) if adv.numel() else 0.0
    return adv, stats


def dr_grpo_advantages(rewards: Tensor, group_ids: Tensor, **_: object) -> tuple[Tensor, dict[str, float]]:
    """Dr. GRPO advantages: ``A_i = r_i - mean(r_group)`` (no std division).

    Removes GRPO's question-level difficulty bias; pair it with the length-unbiased
    ``seq-mean-token-sum-norm`` aggregation. Paper: Liu et al., "Understanding R1-Zero-Like
    Training: A Critical Perspective", arXiv 2503.20783.
    """
    return grpo_advantages(rewards, group_ids, std_normalize=False)


def rloo_advantages(rewards: Tensor, group_ids: Tensor, **_: object) -> tuple[Tensor, dict[str, float]]:
    """REINFORCE leave-one-out: ``A_i = r_i - (1/(n-1)) Σ_{j≠i} r_j`` (= ``n/(n-1) · (r_i - mean)``).

    Paper: Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization for Learning
    from Human Feedback in LLMs", arXiv 2402.14740 (after Kool et al., 2019).
    """
    count, mean, _ = group_stats(rewards, group_ids)
    r = rewards.to(torch.float64)
    others = (mean * count - r) / (count - 1).clamp(min=1)
    adv = torch.where(count > 1, r - others, torch.zeros_like(r)).to(torch.float32)
    return adv, advantage_stats(adv)


def remax_advantages(
    rewards: Tensor,
    group_ids: Tensor | None = None,
    *,
    baseline_rewards: Tensor | None = None,
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """ReMax: ``A_i = r_i - r(greedy_i)``, the reward of the greedy response to the same prompt.

    Paper: Li et al., "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for
    Aligning Large Language Models", arXiv 2310.10505.

    Args:
        baseline_rewards: ``[B]`` the greedy-decoding reward for each sample's prompt.
    """
    if baseline_rewards is None:
        raise ValueError(
            "remax needs baseline_rewards ([B] reward of the greedy response per sample); "
            "record it in the workflow and pass it to the advantage function."
        )
    adv = (rewards.to(torch.float64) - baseline_rewards.to(torch.float64)).to(torch.float32)
    stats = advantage_stats(adv)
    stats["baseline_reward_mean"] = float(baseline_rewards.float().mean()) if adv.numel() else 0.0
    return adv, stats


def opmd_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    baseline: str = "mean",
    tau: float = 1.0,
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """Online policy mirror descent advantages: ``A_i = r_i - b(group)``.

    - ``baseline="mean"``: ``b = mean_j r_j`` (Trinity-RFT's simple OPMD, report v2 App. A.3).
    - ``baseline="logmeanexp"``: ``b = τ · log( (1/K) Σ_j exp(r_j / τ) )`` = ``τ log Ẑ``, Kimi k1.5's
      estimate of the partition function (arXiv 2501.12599 §2.3.2; Trinity-RFT report App. A.1).
      Use it with ``opmd_kimi_loss`` and the same ``τ``.

    Singleton groups get 0 (both baselines equal ``r_i`` there).
    """
    if baseline not in OPMD_BASELINES:
        raise ValueError(f"unknown opmd baseline {baseline!r}; expected one of {OPMD_BASELINES}")
    if tau <= 0:
        raise ValueError(f"opmd tau must be > 0, got {tau}")
    count, mean, _ = group_stats(rewards, group_ids)
    base = mean if baseline == "mean" else group_logmeanexp(rewards, group_ids, tau)
    r = rewards.to(torch.float64)
    adv = torch.where(count > 1, r - base, torch.zeros_like(r)).to(torch.float32)
    return adv, advantage_stats(adv)


def asymre_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    baseline_shift: float = -0.1,
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """Asymmetric REINFORCE: ``A_i = r_i - (mean(r_group) + δ)`` with a shifted baseline ``δ``.

    ``δ < 0`` (the default) puts more weight on positive samples, which the paper shows keeps
    off-policy REINFORCE stable. Singleton groups get 0. Paper: Arnal et al., "Asymmetric REINFORCE
    for off-Policy Reinforcement Learning: Balancing positive and negative rewards", arXiv 2506.20520.
    """
    count, mean, _ = group_stats(rewards, group_ids)
    r = rewards.to(torch.float64)
    adv = torch.where(count > 1, r - (mean + baseline_shift), torch.zeros_like(r)).to(torch.float32)
    return adv, advantage_stats(adv)
