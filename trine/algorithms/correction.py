"""Rollout correction: importance weights between the trainer's and the rollout engine's logprobs.

A fast rollout engine (vLLM, bf16 kernels, another attention implementation) samples from a policy
``π_rollout`` that differs slightly from the same weights under the trainer's numerics ``π_old``
(the trainer recomputes ``old_logprobs`` with ``trainer.recompute_logprobs: true``). The policy
gradient is an expectation under ``π_old`` but the samples come from ``π_rollout``, so each token is
re-weighted by ``ρ_t = π_old(y_t) / π_rollout(y_t)``.

- **Truncated importance sampling (TIS)**, Yao et al. 2025, "Your Efficient RL Framework Secretly
  Brings You Off-Policy RL Training": ``w_t = min(ρ_t, C)`` per token (``level: token``) or
  ``w = min(Π_t ρ_t, C)`` per sequence (``level: sequence``); the cap ``C`` bounds the variance.
  The weight multiplies the token's policy-gradient term (Trine scales the advantages by it, which
  for the clipped PPO / GRPO objectives is the same since ``w >= 0``).
- **Masked importance sampling (MIS)**, the sequence-level rejection of Liu et al. 2025 ("When Speed
  Kills Stability"): a sequence whose per-token geometric-mean ratio ``exp(mean_t log ρ_t)`` lies
  outside ``[1/M, M]`` is dropped from the loss — an extreme mismatch (a numerics blow-up, a stale
  kernel) costs that sample only.

The mismatch itself is reported as ``rollout_kl``, the k3 estimate of ``KL(π_rollout ‖ π_old)``
per token, ``E[ρ - 1 - log ρ]`` (Schulman 2020, "Approximating KL divergence").
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Level = Literal["off", "token", "sequence"]

CORRECTION_SUMS = ("tokens", "rows", "kl_sum", "abs_diff_sum", "weight_sum", "capped", "masked")
"""The sums :func:`rollout_correction` returns (they add up over micro-batches and trainer ranks)."""


def rollout_correction(
    old_logprobs: Tensor,
    rollout_logprobs: Tensor,
    action_mask: Tensor,
    *,
    level: Level = "token",
    cap: float = 2.0,
    mask_threshold: float | None = None,
) -> tuple[Tensor, Tensor, dict[str, float]]:
    """Importance weights ``[B, R]``, a keep mask ``[B, 1]`` (1 = the sequence stays in the loss) and sums
    for the metrics, from ``[B, R]`` logprobs of the trainer (``old``) and the engine (``rollout``).

    ``level``: ``token`` (``w_t = min(ρ_t, cap)``), ``sequence`` (``w = min(Π_t ρ_t, cap)`` on every
    token of the row) or ``off`` (weights 1: only masking and metrics). ``mask_threshold`` ``M > 1``
    drops rows whose geometric-mean ratio is outside ``[1/M, M]``; None keeps every row.

    The stats are *sums* (so micro-batches add up): ``tokens``, ``rows``, ``kl_sum`` (k3 per token),
    ``abs_diff_sum`` (``|log ρ_t|``), ``weight_sum`` (weights before the cap, per token), ``capped``
    (tokens whose weight hit the cap) and ``masked`` (rows dropped).
    """
    mask = action_mask.float()
    log_ratio = (old_logprobs.float() - rollout_logprobs.float()) * mask
    tokens = mask.sum(-1)
    live = tokens > 0
    if level == "token":
        raw = log_ratio.clamp(max=30.0).exp()
    elif level == "sequence":
        raw = log_ratio.sum(-1, keepdim=True).clamp(max=30.0).exp().expand_as(log_ratio)
    else:
        raw = torch.ones_like(log_ratio)
    weights = raw.clamp(max=cap) if level != "off" else raw
    keep = torch.ones_like(tokens)
    if mask_threshold is not None:
        mean_log = log_ratio.sum(-1) / tokens.clamp(min=1)
        bound = float(torch.log(torch.tensor(mask_threshold)))
        keep = ((mean_log.abs() <= bound) | ~live).float()
    k3 = torch.expm1(log_ratio.clamp(max=30.0)) - log_ratio
    stats = {
        "tokens": float(mask.sum()),
        "rows": float(live.sum()),
        "kl_sum": float((k3 * mask).sum()),
        "abs_diff_sum": float((log_ratio.abs() * mask).sum()),
        "weight_sum": float((raw * mask).sum()),
        "capped": float(((raw > cap) & (mask > 0)).sum()) if level != "off" else 0.0,
        "masked": float(((keep == 0) & live).sum()),
    }
    return (weights * mask).detach(), keep.unsqueeze(-1).detach(), stats


def correction_metrics(sums: dict[str, float]) -> dict[str, float]:
    """The step's metrics from summed :func:`rollout_correction` stats: ``rollout_kl`` and
    ``rollout_logprob_diff`` per token, ``rollout_is_weight`` (mean weight before the cap),
    ``rollout_is_capped_frac`` (of tokens) and ``rollout_masked_frac`` (of sequences)."""
    tokens, rows = max(sums.get("tokens", 0.0), 1.0), max(sums.get("rows", 0.0), 1.0)
    return {
        "rollout_kl": sums.get("kl_sum", 0.0) / tokens,
        "rollout_logprob_diff": sums.get("abs_diff_sum", 0.0) / tokens,
        "rollout_is_weight": sums.get("weight_sum", 0.0) / tokens,
        "rollout_is_capped_frac": sums.get("capped", 0.0) / tokens,
        "rollout_masked_frac": sums.get("masked", 0.0) / rows,
    }
