"""Advantages, losses, KL, entropy and aggregation as pure functions; algorithm presets.

A library of pure math under the trainer, which imports it directly. ``ADVANTAGES`` and ``LOSSES`` are
the explicit tables of built-ins looked up by name; an :class:`Algorithm` record names one of each,
resolved by :func:`resolve_advantage` / :func:`resolve_loss`.

Importing the package is free: the tables are :class:`~trine.registry.Table` objects of import paths and every
other name is imported on first use (module ``__getattr__``), so checking a config's algorithm (``trine
validate``) does not import torch.
"""

from __future__ import annotations

from trine.registry import Table, lazy_exports

ADVANTAGES = Table(
    {
        "grpo": "trine.algorithms.advantages:grpo_advantages",
        "dr_grpo": "trine.algorithms.advantages:dr_grpo_advantages",
        "rloo": "trine.algorithms.advantages:rloo_advantages",
        "reinforce_pp": "trine.algorithms.advantages_token:reinforce_pp_advantages",
        "reinforce_pp_baseline": "trine.algorithms.advantages_token:reinforce_pp_baseline_advantages",
        "remax": "trine.algorithms.advantages:remax_advantages",
        "gae": "trine.algorithms.advantages_token:gae_advantages",
        "opmd": "trine.algorithms.advantages:opmd_advantages",
        "asymre": "trine.algorithms.advantages:asymre_advantages",
        "step_wise_grpo": "trine.algorithms.advantages_multistep:step_wise_grpo_advantages",
        "gigpo": "trine.algorithms.advantages_multistep:gigpo_advantages",
    }
)
"""Built-in advantage functions by name (registry kind ``advantage``)."""

LOSSES = Table(
    {
        "ppo_clip": "trine.algorithms.losses:ppo_clip_loss",
        "pg": "trine.algorithms.losses:pg_loss",
        "gspo": "trine.algorithms.losses:gspo_loss",
        "cispo": "trine.algorithms.losses:cispo_loss",
        "sapo": "trine.algorithms.losses:sapo_loss",
        "opmd": "trine.algorithms.losses_offpolicy:opmd_loss",
        "opmd_kimi": "trine.algorithms.losses_offpolicy:opmd_kimi_loss",
        "opmd_pairwise": "trine.algorithms.losses_offpolicy:opmd_pairwise_loss",
        "sft": "trine.algorithms.losses:sft_loss",
        "dpo": "trine.algorithms.losses_offpolicy:dpo_loss",
        "mix": "trine.algorithms.losses_extra:mix_loss",
        "distill": "trine.algorithms.losses_extra:distill_loss",
        "value": "trine.algorithms.losses_extra:value_loss",
    }
)
"""Built-in loss functions by name (registry kind ``loss``)."""

_EXPORTS = {
    "asymre_advantages": "trine.algorithms.advantages",
    "dr_grpo_advantages": "trine.algorithms.advantages",
    "group_index": "trine.algorithms.advantages",
    "grpo_advantages": "trine.algorithms.advantages",
    "opmd_advantages": "trine.algorithms.advantages",
    "remax_advantages": "trine.algorithms.advantages",
    "rloo_advantages": "trine.algorithms.advantages",
    "gigpo_advantages": "trine.algorithms.advantages_multistep",
    "step_wise_grpo_advantages": "trine.algorithms.advantages_multistep",
    "gae": "trine.algorithms.advantages_token",
    "gae_advantages": "trine.algorithms.advantages_token",
    "outcome_token_rewards": "trine.algorithms.advantages_token",
    "reinforce_pp_advantages": "trine.algorithms.advantages_token",
    "reinforce_pp_baseline_advantages": "trine.algorithms.advantages_token",
    "AGG_MODES": "trine.algorithms.aggregation",
    "aggregate": "trine.algorithms.aggregation",
    "masked_mean": "trine.algorithms.aggregation",
    "split_normalizer": "trine.algorithms.aggregation",
    "step_normalizer": "trine.algorithms.aggregation",
    "ADVANTAGE_INPUTS": "trine.algorithms.inputs",
    "LOSS_INPUTS": "trine.algorithms.inputs",
    "check_args": "trine.algorithms.inputs",
    "needed_inputs": "trine.algorithms.inputs",
    "KL_ESTIMATORS": "trine.algorithms.kl",
    "adaptive_kl_coef": "trine.algorithms.kl",
    "entropy_bonus": "trine.algorithms.kl",
    "entropy_from_logits": "trine.algorithms.kl",
    "kl_in_reward": "trine.algorithms.kl",
    "kl_penalty": "trine.algorithms.kl",
    "cispo_loss": "trine.algorithms.losses",
    "gspo_loss": "trine.algorithms.losses",
    "pg_loss": "trine.algorithms.losses",
    "ppo_clip_loss": "trine.algorithms.losses",
    "sapo_loss": "trine.algorithms.losses",
    "sft_loss": "trine.algorithms.losses",
    "distill_loss": "trine.algorithms.losses_extra",
    "mix_loss": "trine.algorithms.losses_extra",
    "value_loss": "trine.algorithms.losses_extra",
    "dpo_loss": "trine.algorithms.losses_offpolicy",
    "opmd_kimi_loss": "trine.algorithms.losses_offpolicy",
    "opmd_loss": "trine.algorithms.losses_offpolicy",
    "opmd_pairwise_loss": "trine.algorithms.losses_offpolicy",
    "sequence_logps": "trine.algorithms.losses_offpolicy",
    "AdvantageFn": "trine.algorithms.presets",
    "Algorithm": "trine.algorithms.presets",
    "EXPLORER_FIELDS": "trine.algorithms.presets",
    "LossFn": "trine.algorithms.presets",
    "PRESETS": "trine.algorithms.presets",
    "resolve_advantage": "trine.algorithms.presets",
    "resolve_loss": "trine.algorithms.presets",
    "CORRECTION_SUMS": "trine.algorithms.correction",
    "correction_metrics": "trine.algorithms.correction",
    "rollout_correction": "trine.algorithms.correction",
}

__all__ = ["ADVANTAGES", "LOSSES", *sorted(_EXPORTS)]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
