"""Token-level advantage estimators: REINFORCE++ (with and without group baseline) and GAE.

These return advantages of shape ``[B, T]`` aligned with ``action_mask`` (0 outside action tokens).
Rows are responses (right-aligned, left padding); tokens with ``action_mask`` 0 inside a row are
observations/tool output: they are skipped by the discounting (``γ`` and ``λ`` count action tokens
only) and get advantage 0. A reward sitting on a non-action token is credited, undiscounted, to
the action token before it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trine.algorithms.advantages import advantage_stats, group_stats


def outcome_token_rewards(rewards: Tensor, action_mask: Tensor) -> Tensor:
    """Place each row's scalar reward on its last action token: ``[B] -> [B, T]``.

    Rows without any action token get all zeros.
    """
    mask = action_mask > 0
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, torch.full_like(positions, -1)).max(dim=-1).values
    out = torch.zeros(mask.shape, dtype=torch.float64, device=mask.device)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = rewards.to(device=mask.device, dtype=torch.float64)[rows]
    return out


def returns_to_go(token_rewards: Tensor, action_mask: Tensor, gamma: float = 1.0) -> Tensor:
    """Discounted return-to-go over action tokens: ``G_t = r_t + γ · G_{t'}``.

    ``t'`` is the next action token of the row (``G = 0`` after the last one). Non-action tokens get
    ``G = 0``; a reward on one is credited, undiscounted, to the action token before it.
    """
    mask = action_mask > 0
    rewards = token_rewards.to(torch.float64)
    out = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=torch.float64, device=rewards.device)
    carried = torch.zeros_like(running)  # rewards on non-action tokens after this point
    for t in reversed(range(rewards.shape[-1])):
        m = mask[:, t]
        running = torch.where(m, rewards[:, t] + carried + gamma * running, running)
        carried = torch.where(m, torch.zeros_like(carried), carried + rewards[:, t])
        out[:, t] = torch.where(m, running, torch.zeros_like(running))
    return out


def masked_whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """``(x - mean) / sqrt(var + eps)`` with mean and unbiased variance over the masked entries.

    Entries outside ``mask`` are set to 0.
    """
    m = mask.to(torch.float64)
    x = values.to(torch.float64)
    n = m.sum()
    mean = (x * m).sum() / n.clamp(min=1)
    var = ((x - mean).square() * m).sum() / (n - 1).clamp(min=1)
    return (x - mean) * torch.rsqrt(var + eps) * m


def _token_rewards(rewards: Tensor, action_mask: Tensor, token_rewards: Tensor | None) -> Tensor:
    if token_rewards is None:
        return outcome_token_rewards(rewards, action_mask)
    if token_rewards.shape != action_mask.shape:
        raise ValueError(
            f"token_rewards has shape {tuple(token_rewards.shape)} but action_mask has "
            f"{tuple(action_mask.shape)}; give one reward per response token (same [B, T])."
        )
    return token_rewards.to(torch.float64)


def _need_mask(name: str, action_mask: Tensor | None) -> Tensor:
    if action_mask is None:
        raise ValueError(
            f"{name} is token-level and needs action_mask ([B, T]); pass it to the advantage fn."
        )
    return action_mask


def reinforce_pp_advantages(
    rewards: Tensor,
    group_ids: Tensor | None = None,
    *,
    action_mask: Tensor | None = None,
    token_rewards: Tensor | None = None,
    gamma: float = 1.0,
    eps: float = 1e-8,
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """REINFORCE++: discounted return-to-go per action token, whitened over the whole batch.

    ``G_t = Σ_{k≥t} γ^{k-t} r_k`` (over action tokens), ``A_t = (G_t - mean(G)) / sqrt(var(G) + eps)``
    with mean/var over all action tokens of the batch. Without ``token_rewards`` the outcome reward
    is placed on each row's last action token (a KL penalty, if any, should already be folded into
    ``token_rewards`` with :func:`~trine.algorithms.kl.kl_in_reward`).

    Paper: Hu, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language Models",
    arXiv 2501.03262.
    """
    mask = _need_mask("reinforce_pp", action_mask)
    returns = returns_to_go(_token_rewards(rewards, mask, token_rewards), mask, gamma)
    adv = masked_whiten(returns, mask, eps).to(torch.float32)
    stats = advantage_stats(adv, mask)
    stats["returns_mean"] = _masked_mean(returns, mask)
    return adv, stats


def reinforce_pp_baseline_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    action_mask: Tensor | None = None,
    token_rewards: Tensor | None = None,
    gamma: float = 1.0,
    eps: float = 1e-8,
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """REINFORCE++-baseline: subtract the group mean return, then REINFORCE++ (returns + whitening).

    Each sample's total reward ``R_i = Σ_t r_it`` (= ``rewards`` without ``token_rewards``) gets the
    baseline ``mean_{j in group} R_j`` subtracted at its last action token (singletons: baseline
    ``R_i``), then ``G_t`` is the discounted return-to-go and advantages are whitened over all
    action tokens of the batch. With ``γ = 1`` every action token of row ``i`` has
    ``G = R_i - mean``.

    Paper: Hu, arXiv 2501.03262 (v3+, "REINFORCE++-baseline").
    """
    mask = _need_mask("reinforce_pp_baseline", action_mask)
    shaped = _token_rewards(rewards, mask, token_rewards)
    totals = shaped.sum(-1)
    _, mean, _ = group_stats(totals, group_ids)
    shaped = shaped - outcome_token_rewards(mean, mask)
    returns = returns_to_go(shaped, mask, gamma)
    adv = masked_whiten(returns, mask, eps).to(torch.float32)
    stats = advantage_stats(adv, mask)
    stats["returns_mean"] = _masked_mean(returns, mask)
    return adv, stats


def gae(
    token_rewards: Tensor, values: Tensor, action_mask: Tensor, gamma: float = 1.0, lam: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation over the action tokens of each row.

    ``δ_t = r_t + γ V_{t'} - V_t`` (``t'`` the next action token, ``V = 0`` after the last),
    ``A_t = δ_t + γλ A_{t'}``, ``returns_t = A_t + V_t`` (the critic's regression target).
    Non-action tokens are skipped and get 0 in both outputs; a reward on one is credited,
    undiscounted, to the action token before it (added to its ``δ``).

    Paper: Schulman et al., "High-Dimensional Continuous Control Using Generalized Advantage
    Estimation", arXiv 1506.02438.

    Returns:
        ``(advantages [B, T], returns [B, T])``, float32, unwhitened.
    """
    mask = action_mask > 0
    rewards = token_rewards.to(torch.float64)
    v = values.detach().to(torch.float64)
    adv = torch.zeros_like(rewards)
    next_value = torch.zeros(rewards.shape[0], dtype=torch.float64, device=rewards.device)
    next_adv = torch.zeros_like(next_value)
    carried = torch.zeros_like(next_value)  # rewards seen on non-action tokens after this point
    for t in reversed(range(rewards.shape[-1])):
        m = mask[:, t]
        delta = rewards[:, t] + carried + gamma * next_value - v[:, t]
        current = delta + gamma * lam * next_adv
        adv[:, t] = torch.where(m, current, torch.zeros_like(current))
        next_adv = torch.where(m, current, next_adv)
        next_value = torch.where(m, v[:, t], next_value)
        carried = torch.where(m, torch.zeros_like(carried), carried + rewards[:, t])
    returns = (adv + v) * mask
    return adv.to(torch.float32), returns.to(torch.float32)


def gae_advantages(
    rewards: Tensor,
    group_ids: Tensor | None = None,
    *,
    action_mask: Tensor | None = None,
    values: Tensor | None = None,
    token_rewards: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
    eps: float = 1e-8,
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """PPO advantages from :func:`gae`, whitened over the batch's action tokens when ``whiten``.

    The outcome reward goes on the last action token unless ``token_rewards`` is given. The critic
    targets are ``gae(token_rewards, values, action_mask, gamma, lam)[1]`` (call :func:`gae` for them).

    Paper: Schulman et al., arXiv 1506.02438 (GAE) and arXiv 1707.06347 (PPO); as used for LMs in
    Ouyang et al., arXiv 2203.02155.
    """
    mask = _need_mask("gae", action_mask)
    if values is None:
        raise ValueError("gae needs values ([B, T] critic value per response token); enable the critic.")
    adv, returns = gae(_token_rewards(rewards, mask, token_rewards), values, mask, gamma, lam)
    if whiten:
        adv = masked_whiten(adv, mask, eps).to(torch.float32)
    stats = advantage_stats(adv, mask)
    stats["returns_mean"] = _masked_mean(returns, mask)
    stats["values_mean"] = _masked_mean(values, mask)
    return adv, stats


def _masked_mean(x: Tensor, mask: Tensor) -> float:
    m = mask.to(torch.float64)
    return float((x.detach().to(torch.float64) * m).sum() / m.sum().clamp(min=1))
