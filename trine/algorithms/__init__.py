"""Advantages, losses, KL, entropy and aggregation as pure functions; algorithm presets.

``ADVANTAGES`` and ``LOSSES`` are the explicit tables of built-ins looked up by name.
"""

from trine.algorithms.advantages import group_index, grpo_advantages
from trine.algorithms.aggregation import AGG_MODES, aggregate, masked_mean, step_normalizer
from trine.algorithms.kl import KL_ESTIMATORS, entropy_from_logits, kl_penalty
from trine.algorithms.losses import ppo_clip_loss, sft_loss
from trine.algorithms.presets import PRESETS, Algorithm

ADVANTAGES = {
    "grpo": grpo_advantages,
}

LOSSES = {
    "ppo_clip": ppo_clip_loss,
    "sft": sft_loss,
}

__all__ = [
    "ADVANTAGES",
    "AGG_MODES",
    "Algorithm",
    "KL_ESTIMATORS",
    "LOSSES",
    "PRESETS",
    "aggregate",
    "entropy_from_logits",
    "group_index",
    "grpo_advantages",
    "kl_penalty",
    "masked_mean",
    "ppo_clip_loss",
    "sft_loss",
    "step_normalizer",
]
