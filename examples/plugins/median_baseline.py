"""A new algorithm from a user file: run it with
``trine run CONFIG --plugin examples/plugins/median_baseline.py stages.1.algorithm.name=median_pg``."""

import torch

from trine import Algorithm, register


@register("advantage", "median_baseline")
def median_baseline(rewards, group_ids, *, scale=1.0, **_):
    """``A_i = scale · (r_i − median of r over i's group)`` — a baseline robust to outlier rewards."""
    advantages = torch.zeros_like(rewards)
    for group in group_ids.unique():
        rows = group_ids == group
        advantages[rows] = scale * (rewards[rows] - rewards[rows].median())
    return advantages, {"advantages_abs_mean": float(advantages.abs().mean())}


register("algorithm", "median_pg")(
    Algorithm(
        name="median_pg",
        advantage="median_baseline",
        loss="ppo_clip",
        advantage_args={"scale": 1.0},
        loss_args={"clip_low": 0.2, "clip_high": 0.28},
        paper="an example, not a paper",
    )
)
