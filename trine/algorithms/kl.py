"""KL estimators, KL-coefficient control, KL-in-reward shaping, entropy and the entropy bonus."""

from __future__ import annotations

import torch
from torch import Tensor

from trine.algorithms.aggregation import aggregate, masked_mean
from trine.config.algorithm import KL_ESTIMATORS


def kl_penalty(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    estimator: str = "k3",
    clamp: float = 10.0,
    input_clamp: float = 20.0,
) -> Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from sampled-token logprobs.

    With ``x = log π_ref(a) - log π_θ(a)`` (a sampled from π_θ):
    - ``k1``: ``-x``                     (unbiased, high variance)
    - ``k2``: ``x² / 2``                 (biased, low variance)
    - ``k3`` / ``low_var_kl``: ``eˣ - x - 1`` (unbiased, non-negative)
    - ``abs``: ``|x|``;  ``mse``: ``x²/2`` (alias of k2 as in verl)

    k3 clamping: only ``exp`` can overflow, so ``x`` is first clamped to ``[-input_clamp, input_clamp]``
    (default ±20: ``e²⁰ ≈ 4.9e8`` is finite in float32 and bf16, so its backward never multiplies 0 by
    inf), then the *value* is clamped to ``[-clamp, clamp]`` (default ±10) to bound one token's penalty.
    The value clamp is the one that binds: ``eˣ - x - 1`` reaches 10 at ``x ≈ 2.61`` and ``x ≈ -11.0``, so
    the estimate and its gradient ``∂k3/∂logπ_θ = 1 - eˣ`` are exact for every ``x`` in that range
    (e.g. ``x = -10.5`` gives ``9.50003`` with gradient ``≈ 1``), and tokens beyond it get the constant
    ``clamp`` with zero gradient. This is verl's ``low_var_kl`` (input ±20, output ±10). k1, k2 and abs
    have no ``exp`` and are returned unclamped.

    Estimators from J. Schulman, "Approximating KL Divergence" (2020); k3 as used in GRPO,
    arXiv 2402.03300 eq. (4).
    """
    x = ref_logprobs - logprobs
    if estimator == "k1":
        return -x
    if estimator in ("k2", "mse"):
        return 0.5 * x.square()
    if estimator in ("k3", "low_var_kl"):
        x = x.clamp(-input_clamp, input_clamp)
        return (torch.exp(x) - x - 1).clamp(-clamp, clamp)
    if estimator == "abs":
        return x.abs()
    raise ValueError(f"unknown KL estimator {estimator!r}; expected one of {KL_ESTIMATORS}")


def entropy_from_logits(logits: Tensor, chunk_size: int = 1024) -> Tensor:
    """Per-position entropy ``H = logsumexp(z) - Σ softmax(z)·z`` of ``logits [..., V]``.

    Computed in chunks of ``chunk_size`` positions so the float32 softmax never materialises for
    the whole batch at once.
    """
    flat = logits.reshape(-1, logits.shape[-1])
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
    for start in range(0, flat.shape[0], chunk_size):
        z = flat[start : start + chunk_size].float()
        lse = torch.logsumexp(z, dim=-1)
        out[start : start + chunk_size] = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
    return out.reshape(logits.shape[:-1])


def entropy_bonus(
    entropy: Tensor,
    action_mask: Tensor,
    coef: float,
    normalizer: float,
    agg_mode: str = "token-mean",
) -> tuple[Tensor, dict[str, float]]:
    """Entropy bonus as a loss term: ``-coef · agg(H_t)`` (add it to the policy loss).

    ``entropy`` is the per-token ``[B, T]`` entropy from :func:`entropy_from_logits` *with* gradient;
    aggregated like the policy loss with the same step ``normalizer`` so micro-batches stay exact.
    (Entropy regularization as in Mnih et al., "Asynchronous Methods for Deep RL", arXiv 1602.01783,
    and the PPO objective, arXiv 1707.06347 eq. 9.)

    Stats: ``entropy`` (mean over this micro-batch's action tokens).
    """
    term = -coef * aggregate(entropy, action_mask, agg_mode, normalizer)
    with torch.no_grad():
        stats = {"entropy": float(masked_mean(entropy, action_mask))}
    return term, stats


def adaptive_kl_coef(
    current_coef: float, observed_kl: float, target_kl: float, horizon: float, n_steps: int
) -> float:
    """Adaptive KL controller: the next KL coefficient.

    ``e = clip(KL / KL_target - 1, -0.2, 0.2)``, ``β ← β · (1 + e · n_steps / horizon)``, where
    ``n_steps`` is the number of samples (or steps) since the last update. Paper: Ziegler et al.,
    "Fine-Tuning Language Models from Human Preferences", arXiv 1909.08593, §2.2.
    """
    if target_kl <= 0 or horizon <= 0:
        raise ValueError(f"adaptive KL needs target_kl > 0 and horizon > 0, got {target_kl}, {horizon}")
    error = min(max(observed_kl / target_kl - 1.0, -0.2), 0.2)
    return float(current_coef * (1.0 + error * n_steps / horizon))


def kl_in_reward(
    rewards: Tensor, kl: Tensor, coef: float, action_mask: Tensor
) -> tuple[Tensor, dict[str, float]]:
    """KL as a reward penalty (instead of a loss term).

    - ``rewards [B, T]`` (token rewards): ``r_t - β · kl_t`` on action tokens (0 elsewhere).
    - ``rewards [B]`` (outcome rewards): ``r - β · Σ_t m_t kl_t``.

    ``kl`` is a per-token estimate such as ``kl_penalty(old_logprobs, ref_logprobs, "k1")`` computed
    without gradient. Paper: Ziegler et al., arXiv 1909.08593 eq. (2); Ouyang et al., arXiv 2203.02155.

    Stats: ``kl_in_reward`` (mean per-token KL), ``kl_coef``.
    """
    mask = action_mask.to(torch.float64)
    kl64 = kl.detach().to(torch.float64) * mask
    if rewards.dim() == 1:
        shaped = rewards.to(torch.float64) - coef * kl64.sum(-1)
    else:
        shaped = (rewards.to(torch.float64) - coef * kl64) * mask
    stats = {"kl_in_reward": float(masked_mean(kl64, mask)), "kl_coef": float(coef)}
    return shaped.to(torch.float32), stats
