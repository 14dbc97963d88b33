"""The optimizer both the policy and the critic use: AdamW, fused into one kernel where possible."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def adamw(params: Iterable[torch.Tensor], **kwargs: Any) -> torch.optim.AdamW:
    """``torch.optim.AdamW(params, fused=True, **kwargs)``, or the unfused AdamW where torch has no
    fused kernel for these tensors (e.g. an unusual device or dtype).

    The fused kernel updates every parameter in one pass instead of a dozen small ops per tensor:
    on the 2-core CPU machine a step over tiny-5m's 5M parameters took 2.4 ms instead of 10.9 ms
    (benchmarks/RESULTS.md). The update rule is the same (Loshchilov & Hutter, arXiv 1711.05101);
    the state dict has the same layout, so checkpoints load either way.
    """
    params = list(params)
    try:
        return torch.optim.AdamW(params, fused=True, **kwargs)
    except (RuntimeError, TypeError):  # no fused implementation for these tensors
        return torch.optim.AdamW(params, **kwargs)
