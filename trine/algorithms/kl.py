"""KL estimators and entropy: pure per-token functions."""

from __future__ import annotations

import torch
from torch import Tensor

KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl", "abs", "mse")


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3", clamp: float = 10.0) -> Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from sampled-token logprobs.

    With ``x = log π_ref(a) - log π_θ(a)`` (a sampled from π_θ):
    - ``k1``: ``-x``                     (unbiased, high variance)
    - ``k2``: ``x² / 2``                 (biased, low variance)
    - ``k3`` / ``low_var_kl``: ``eˣ - x - 1`` (unbiased, non-negative), clamped to ``[-clamp, clamp]``
    - ``abs``: ``|x|``;  ``mse``: ``x²/2`` (alias of k2 as in verl)

    Estimators from J. Schulman, "Approximating KL Divergence" (2020); k3 as used in GRPO,
    arXiv 2402.03300 eq. (4).
    """
    x = ref_logprobs - logprobs
    if estimator == "k1":
        return -x
    if estimator in ("k2", "mse"):
        return 0.5 * x.square()
    if estimator in ("k3", "low_var_kl"):
        x = x.clamp(-clamp, clamp)
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
