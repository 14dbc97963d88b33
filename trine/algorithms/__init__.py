"""Advantages, losses, KL, entropy and aggregation as pure functions; algorithm presets.

A library of pure math under the trainer, which imports it directly. ``ADVANTAGES`` and ``LOSSES`` are
the explicit tables of built-ins looked up by name; an :class:`Algorithm` record names one of each,
resolved by :func:`resolve_advantage` / :func:`resolve_loss`.
"""

from trine.algorithms.advantages import (
    asymre_advantages,
    dr_grpo_advantages,
    group_index,
    grpo_advantages,
    opmd_advantages,
    remax_advantages,
    rloo_advantages,
)
from trine.algorithms.advantages_multistep import gigpo_advantages, step_wise_grpo_advantages
from trine.algorithms.advantages_token import (
    gae,
    gae_advantages,
    outcome_token_rewards,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
)
from trine.algorithms.aggregation import (
    AGG_MODES,
    aggregate,
    masked_mean,
    split_normalizer,
    step_normalizer,
)
from trine.algorithms.inputs import ADVANTAGE_INPUTS, LOSS_INPUTS, check_args, needed_inputs
from trine.algorithms.kl import (
    KL_ESTIMATORS,
    adaptive_kl_coef,
    entropy_bonus,
    entropy_from_logits,
    kl_in_reward,
    kl_penalty,
)
from trine.algorithms.losses import (
    cispo_loss,
    gspo_loss,
    pg_loss,
    ppo_clip_loss,
    sapo_loss,
    sft_loss,
)
from trine.algorithms.losses_extra import distill_loss, mix_loss, value_loss
from trine.algorithms.losses_offpolicy import (
    dpo_loss,
    opmd_kimi_loss,
    opmd_loss,
    opmd_pairwise_loss,
    sequence_logps,
)
from trine.algorithms.presets import (
    EXPLORER_FIELDS,
    PRESETS,
    AdvantageFn,
    Algorithm,
    LossFn,
    resolve_advantage,
    resolve_loss,
)
from trine.algorithms.rollout_correction import CORRECTION_SUMS, correction_metrics, rollout_correction

ADVANTAGES = {
    "grpo": grpo_advantages,
    "dr_grpo": dr_grpo_advantages,
    "rloo": rloo_advantages,
    "reinforce_pp": reinforce_pp_advantages,
    "reinforce_pp_baseline": reinforce_pp_baseline_advantages,
    "remax": remax_advantages,
    "gae": gae_advantages,
    "opmd": opmd_advantages,
    "asymre": asymre_advantages,
    "step_wise_grpo": step_wise_grpo_advantages,
    "gigpo": gigpo_advantages,
}

LOSSES = {
    "ppo_clip": ppo_clip_loss,
    "pg": pg_loss,
    "gspo": gspo_loss,
    "cispo": cispo_loss,
    "sapo": sapo_loss,
    "opmd": opmd_loss,
    "opmd_kimi": opmd_kimi_loss,
    "opmd_pairwise": opmd_pairwise_loss,
    "sft": sft_loss,
    "dpo": dpo_loss,
    "mix": mix_loss,
    "distill": distill_loss,
    "value": value_loss,
}

__all__ = [
    "CORRECTION_SUMS",
    "correction_metrics",
    "rollout_correction",
    "ADVANTAGES",
    "ADVANTAGE_INPUTS",
    "AGG_MODES",
    "AdvantageFn",
    "Algorithm",
    "EXPLORER_FIELDS",
    "KL_ESTIMATORS",
    "LOSSES",
    "LOSS_INPUTS",
    "LossFn",
    "PRESETS",
    "adaptive_kl_coef",
    "aggregate",
    "asymre_advantages",
    "check_args",
    "cispo_loss",
    "distill_loss",
    "dpo_loss",
    "dr_grpo_advantages",
    "entropy_bonus",
    "entropy_from_logits",
    "gae",
    "gae_advantages",
    "gigpo_advantages",
    "group_index",
    "grpo_advantages",
    "gspo_loss",
    "kl_in_reward",
    "kl_penalty",
    "masked_mean",
    "mix_loss",
    "needed_inputs",
    "opmd_advantages",
    "opmd_kimi_loss",
    "opmd_loss",
    "opmd_pairwise_loss",
    "outcome_token_rewards",
    "pg_loss",
    "ppo_clip_loss",
    "reinforce_pp_advantages",
    "reinforce_pp_baseline_advantages",
    "remax_advantages",
    "resolve_advantage",
    "resolve_loss",
    "rloo_advantages",
    "sapo_loss",
    "sequence_logps",
    "sft_loss",
    "split_normalizer",
    "step_normalizer",
    "step_wise_grpo_advantages",
    "value_loss",
]
