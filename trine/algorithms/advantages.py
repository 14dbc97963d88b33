"""Advantage estimators: pure functions from rewards (and group ids) to advantages.

Every function takes tensors and plain numbers and returns ``(advantages, stats)`` where ``stats``
is a dict of detached floats. Outcome-level estimators return one advantage per sample (shape
``[B]``); the trainer broadcasts it over the response tokens with ``action_mask``.
"""

from __future__ import annotations

import torch
from torch import Tensor


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


def grpo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    std_normalize: bool = True,
    eps: float = 1e-6,
) -> tuple[Tensor, dict[str, float]]:
    """Group-relative advantages (GRPO).

    ``A_i = (r_i - mean(r_group)) / (std(r_group) + eps)`` with the unbiased std of the group
    (``std_normalize=False`` gives ``A_i = r_i - mean``, the Dr. GRPO variant). A group of one sample
    has no baseline and gets advantage 0.

    Paper: Shao et al., "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open
    Language Models", arXiv 2402.03300, §4.1.2 (outcome supervision).

    Args:
        rewards: ``[B]`` scalar reward per sample.
        group_ids: ``[B]`` dense integer group index (see :func:`group_index`).
    """
    count, mean, std = group_stats(rewards, group_ids)
    adv = rewards.to(torch.float64) - mean
    if std_normalize:
        adv = adv / (std + eps)
    adv = torch.where(count > 1, adv, torch.zeros_like(adv)).to(torch.float32)
    zero_var = ((std == 0) & (count > 1)).to(torch.float32)
    stats = {
        "advantages_mean": float(adv.mean()) if adv.numel() else 0.0,
        "advantages_abs_mean": float(adv.abs().mean()) if adv.numel() else 0.0,
        "zero_std_fraction": float(zero_var.mean()) if adv.numel() else 0.0,
    }
    return adv, stats
