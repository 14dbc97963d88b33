"""Top-k / top-p truncation: the one definition the rollout engine samples with and the trainer replays.

When a rollout samples with top-k or top-p, the behaviour policy is not ``π = softmax(z / T)`` but π
truncated to a kept set ``K`` and renormalised::

    π_trunc(y) = π(y) / Σ_{v ∈ K} π(v)   for y ∈ K

The engine reports ``log π_trunc`` of each sampled token, and the trainer recomputes the same quantity
(:func:`truncated_logprobs`, called by :func:`trine.models.batching.forward_logprobs` for rows whose
``info`` carries ``top_k`` / ``top_p``), so the importance ratio compares like with like. Without the
replay every token would carry an off-policy bias of ``-log Σ_{v ∈ K} π(v)`` (the gap ``trine check``
reports).

``K``: top-k (k > 0) keeps the k most likely tokens; top-p (p < 1) then keeps, from the top-k set
renormalised, the most likely tokens while the probability mass *before* each is ``<= p`` (so the token
that crosses p is kept). This is the order vLLM and HF apply them in.
"""

from __future__ import annotations

import torch
from torch import Tensor


def kept_set(logp: Tensor, top_k: Tensor | int, top_p: Tensor | float) -> Tensor:
    """Boolean ``[..., V]``: which tokens top-k then top-p keep, per row of ``logp`` ``[..., V]``.

    ``top_k`` / ``top_p`` are scalars or per-row tensors shaped like ``logp[..., 0]`` (``k <= 0`` and
    ``p >= 1`` switch a row's truncation off). ``logp`` may be any logits of the distribution (the set
    depends only on their order and softmax).
    """
    vocab = logp.shape[-1]
    k = torch.as_tensor(top_k, device=logp.device).expand(logp.shape[:-1])
    p = torch.as_tensor(top_p, dtype=torch.float32, device=logp.device).expand(logp.shape[:-1])
    keep = torch.ones_like(logp, dtype=torch.bool)
    if bool((k > 0).any()):
        kk = torch.where(k > 0, k, vocab).clamp(max=vocab).long()
        kth = logp.sort(dim=-1, descending=True).values.gather(-1, (kk - 1).unsqueeze(-1))
        keep &= logp >= kth
    if bool((p < 1).any()):
        renorm = torch.log_softmax(logp.float().masked_fill(~keep, float("-inf")), dim=-1)
        ordered, order = renorm.sort(dim=-1, descending=True)
        probs = ordered.exp()
        inside = (probs.cumsum(-1) - probs) <= p.unsqueeze(-1)
        keep &= torch.zeros_like(keep).scatter(-1, order, inside) | (p >= 1).unsqueeze(-1)
    return keep


def truncated_logprobs(logits: Tensor, targets: Tensor, top_k: Tensor | int, top_p: Tensor | float) -> Tensor:
    """``log π_trunc(y)`` of each target under the temperature-scaled ``logits`` ``[..., V]``.

    ``log π_trunc(y) = z_y - logsumexp_{v ∈ K ∪ {y}} z_v``: the target is always counted in the
    normaliser, so a token that has left the kept set of the *current* policy (the trainer's weights
    moved since sampling) gets a finite logprob with a gradient instead of ``-inf``. For the token the
    engine sampled (always in ``K``) it is exactly the engine's truncated logprob. The kept set is a
    constant of the gradient (which tokens survive is not differentiated).
    """
    with torch.no_grad():
        keep = kept_set(logits.detach(), top_k, top_p)
        keep.scatter_(-1, targets.unsqueeze(-1), True)
    norm = torch.logsumexp(logits.masked_fill(~keep, float("-inf")), dim=-1)
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - norm
