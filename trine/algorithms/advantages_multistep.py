"""Multi-step (agentic) advantage estimators: step-wise GRPO and GiGPO.

Here one sample is one *step* of a multi-turn trajectory ("run"). Inputs besides ``rewards`` (the
step's reward) and ``group_ids`` (the task group, dense):

- ``run_ids [B]`` long: which trajectory the step belongs to. May be unique in the batch or only
  within its group (``0..N-1`` per task group): runs are identified by ``(group_id, run_id)``.
- ``step_ids [B]`` long: the step's index within its run (need not be contiguous).
- ``state_ids [B]`` long: dense id of the environment state the step acted from (a hash of
  ``env_state_hash``), for GiGPO's anchor-state groups.

Every function returns ``([B] advantages, stats)``; the trainer broadcasts them over each step's
action tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from trine.algorithms.advantages import advantage_stats, group_stats, grpo_advantages

GIGPO_NORMS = ("std", "none")


def pair_index(a: Tensor, b: Tensor) -> Tensor:
    """Dense ids ``0..K-1`` of the distinct pairs ``(a_i, b_i)`` (in sorted pair order)."""
    if a.numel() == 0:
        return torch.zeros(0, dtype=torch.long)
    pairs = torch.stack([a.to(torch.long).cpu(), b.to(torch.long).cpu()], dim=1)
    return torch.unique(pairs, dim=0, return_inverse=True)[1]


def _require(name: str, **inputs: Tensor | None) -> None:
    missing = [k for k, v in inputs.items() if v is None]
    if missing:
        raise ValueError(
            f"{name} needs {missing} ([B] long per step); the step-wise workflow must record "
            "run/step (and env_state_hash for gigpo) and the trainer must pass them."
        )


def _run_table(group_ids: Tensor, run_ids: Tensor) -> tuple[Tensor, Tensor]:
    """Per-step dense run index and per-run dense group index."""
    run = pair_index(group_ids, run_ids)
    num_runs = int(run.max()) + 1 if run.numel() else 0
    run_group = torch.zeros(num_runs, dtype=torch.long).scatter_(0, run, group_ids.to(torch.long).cpu())
    return run, torch.unique(run_group, return_inverse=True)[1]


def length_balance_weights(run: Tensor, run_group: Tensor) -> Tensor:
    """Per-run weights ``w_i = mean_{j in group(i)} L_j / L_i`` (``L``: steps in the batch; float64).

    Broadcasting a run's episode advantage ``A_i`` to its ``L_i`` steps gives the run ``L_i`` votes
    in the loss: when failing runs are longer than successful ones (they wander until
    ``max_steps``), the group's step advantages sum to ``Σ_i L_i A_i < 0`` even though
    ``Σ_i A_i = 0``, and that net negative push moves probability onto tokens never sampled. Scaling
    by ``w_i`` makes every run count as one episode, ``Σ_i L_i w_i A_i = mean(L) Σ_i A_i = 0``, while
    keeping the average step weight at 1.
    """
    length = torch.bincount(run, minlength=len(run_group)).to(torch.float64)
    groups = int(run_group.max()) + 1 if run_group.numel() else 0
    total = torch.zeros(groups, dtype=torch.float64).index_add_(0, run_group, length)
    count = torch.bincount(run_group, minlength=groups).to(torch.float64)
    return (total / count)[run_group] / length


def step_wise_grpo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    run_ids: Tensor | None = None,
    step_ids: Tensor | None = None,
    std_normalize: bool = True,
    eps: float = 1e-6,
    length_balance: bool = False,
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """GRPO on each run's last-step reward, broadcast to every step of that run.

    ``R_i`` = reward of run ``i``'s step with the largest ``step_id``;
    ``A_i = (R_i - mean_{group}(R)) / (std_{group}(R) + eps)`` over the runs of a task group; every
    step of run ``i`` gets ``A_i`` (times ``mean_group(L) / L_i`` with ``length_balance``, see
    :func:`length_balance_weights`). (GRPO, arXiv 2402.03300, applied per trajectory as in
    Trinity-RFT's ``multi_step_grpo``, arXiv 2505.17826.)
    """
    _require("step_wise_grpo", run_ids=run_ids, step_ids=step_ids)
    run, run_group = _run_table(group_ids, run_ids)
    steps = step_ids.to(torch.long).cpu()
    last = torch.full((len(run_group),), -(2**62), dtype=torch.long).scatter_reduce(0, run, steps, "amax")
    is_last = steps == last[run]
    per_run = torch.zeros(len(run_group), dtype=torch.long).index_add_(
        0, run[is_last], torch.ones_like(run[is_last])
    )
    if bool((per_run != 1).any()):
        row = int(torch.nonzero(per_run[run] != 1)[0])
        raise ValueError(
            f"run_id {int(run_ids[row])} of group {int(group_ids[row])} has several steps with its last "
            "step_id; step ids must be unique per run"
        )
    run_reward = torch.zeros(len(run_group), dtype=torch.float64).index_add_(
        0, run[is_last], rewards.to(torch.float64).cpu()[is_last]
    )
    adv_run, stats = grpo_advantages(run_reward, run_group, std_normalize=std_normalize, eps=eps)
    if length_balance:
        adv_run = adv_run * length_balance_weights(run, run_group).to(adv_run.dtype)
    adv = adv_run[run].to(rewards.device)
    stats = {
        **advantage_stats(adv),
        "zero_std_fraction": stats["zero_std_fraction"],
        "runs": float(len(run_group)),
    }
    return adv, stats


def discounted_step_returns(rewards: Tensor, run: Tensor, step_ids: Tensor, gamma: float) -> Tensor:
    """``R_t = Σ_{k in run, s_k ≥ s_t} γ^(s_k - s_t) r_k`` for each step (float64, ``[B]``)."""
    r, runs, steps = (
        rewards.to(torch.float64).cpu().tolist(),
        run.tolist(),
        step_ids.to(torch.long).cpu().tolist(),
    )
    order = sorted(range(len(r)), key=lambda i: (runs[i], steps[i]))
    out = [0.0] * len(r)
    running, prev_run, prev_step = 0.0, None, None
    for i in reversed(order):
        if runs[i] != prev_run:
            running = 0.0
        elif steps[i] == prev_step:
            raise ValueError(f"step_id {steps[i]} appears twice in one run; step ids must be unique per run")
        else:
            running *= gamma ** (prev_step - steps[i])
        running += r[i]
        out[i] = running
        prev_run, prev_step = runs[i], steps[i]
    return torch.tensor(out, dtype=torch.float64)


def _relative(values: Tensor, index: Tensor, norm: str, eps: float) -> Tensor:
    """``(v - mean_group) / F_norm`` with ``F_norm = std + eps`` or 1; singleton groups give 0."""
    count, mean, std = group_stats(values, index)
    adv = values.to(torch.float64) - mean
    if norm == "std":
        adv = adv / (std + eps)
    return torch.where(count > 1, adv, torch.zeros_like(adv))


def gigpo_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    *,
    run_ids: Tensor | None = None,
    step_ids: Tensor | None = None,
    state_ids: Tensor | None = None,
    omega: float = 1.0,
    gamma: float = 1.0,
    norm: str = "std",
    eps: float = 1e-6,
    length_balance: bool = False,
    **_: object,
) -> tuple[Tensor, dict[str, float]]:
    """GiGPO: episode-level group advantage plus ω × step-level anchor-state advantage.

    - Episode level: ``R(τ_i) = Σ_t r_t^(i)`` per run; ``A^E_i = (R(τ_i) - mean) / F_norm`` over the
      runs of the same task group.
    - Step level: discounted returns ``R_t^(i) = Σ_{k≥t} γ^(k-t) r_k^(i)``; the anchor-state group of
      a step is all steps with the same ``group_id`` and ``state_id`` (across runs and times);
      ``A^S = (R_t^(i) - mean_anchor) / F_norm``. A singleton anchor group gets ``A^S = 0``.
    - ``A = A^E + ω · A^S`` for each step; ``F_norm`` is ``std + eps`` (``norm="std"``) or 1
      (``norm="none"``, RLOO-like scale).
    - ``length_balance=True`` scales ``A^E_i`` by ``mean_group(L) / L_i`` so each run counts as one
      episode (:func:`length_balance_weights`; not in the paper, which broadcasts ``A^E`` as is).

    Paper: Feng et al., "Group-in-Group Policy Optimization for LLM Agent Training",
    arXiv 2505.10978, Eq. (8).
    """
    _require("gigpo", run_ids=run_ids, step_ids=step_ids, state_ids=state_ids)
    if norm not in GIGPO_NORMS:
        raise ValueError(f"unknown gigpo norm {norm!r}; expected one of {GIGPO_NORMS}")
    run, run_group = _run_table(group_ids, run_ids)
    episode_return = torch.zeros(len(run_group), dtype=torch.float64).index_add_(
        0, run, rewards.to(torch.float64).cpu()
    )
    episode_adv = _relative(episode_return, run_group, norm, eps)
    if length_balance:
        episode_adv = episode_adv * length_balance_weights(run, run_group)
    episode_adv = episode_adv[run]
    step_returns = discounted_step_returns(rewards, run, step_ids, gamma)
    anchor = pair_index(group_ids, state_ids)
    step_adv = _relative(step_returns, anchor, norm, eps)
    adv = (episode_adv + omega * step_adv).to(torch.float32).to(rewards.device)
    anchor_size = torch.bincount(anchor)[anchor] if anchor.numel() else anchor
    stats = advantage_stats(adv)
    stats.update(
        {
            "episode_advantages_abs_mean": float(episode_adv.abs().mean()) if adv.numel() else 0.0,
            "step_advantages_abs_mean": float(step_adv.abs().mean()) if adv.numel() else 0.0,
            "anchor_groups": float(int(anchor.max()) + 1) if adv.numel() else 0.0,
            "singleton_anchor_fraction": float((anchor_size == 1).double().mean()) if adv.numel() else 0.0,
        }
    )
    return adv, stats
