"""Advantage estimators against hand-computed values (the arithmetic is in the comments)."""

from __future__ import annotations

import math

import pytest
import torch

from trine.algorithms import (
    ADVANTAGE_INPUTS,
    ADVANTAGES,
    PRESETS,
    asymre_advantages,
    check_args,
    dr_grpo_advantages,
    gae,
    gae_advantages,
    gigpo_advantages,
    grpo_advantages,
    needed_inputs,
    opmd_advantages,
    reinforce_pp_advantages,
    reinforce_pp_baseline_advantages,
    remax_advantages,
    rloo_advantages,
    step_wise_grpo_advantages,
)
from trine.algorithms.advantages_token import returns_to_go

# ---------------------------------------------------------------------------------- outcome level


def test_grpo_batch_std_scope_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    adv, _ = grpo_advantages(rewards, groups, std_scope="batch")
    # batch mean 1; squared deviations 0+1+1+0+4+0 = 6; unbiased var 6/5 = 1.2
    s = math.sqrt(1.2) + 1e-6
    # group means 0.5 and 2 are still subtracted per group
    assert adv.tolist() == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 1 / s, -1 / s], abs=1e-6)
    for g in (0, 1):
        assert float(adv[groups == g].sum()) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="std_scope"):
        grpo_advantages(rewards, groups, std_scope="global")


def test_grpo_eps_option():
    adv, _ = grpo_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), eps=1.0)
    # mean 0.5, unbiased std sqrt(0.5) = 0.70711; A = 0.5 / (0.70711 + 1)
    assert adv.tolist() == pytest.approx([0.5 / 1.707107, -0.5 / 1.707107], abs=1e-5)


def test_dr_grpo_is_mean_centred_without_std():
    adv, _ = dr_grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 4.0]), torch.tensor([0, 0, 0, 0, 1]))
    assert adv.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.0])  # group mean 0.5; singleton 0


def test_rloo_hand_computed_and_leave_one_out_invariant():
    adv, _ = rloo_advantages(torch.tensor([1.0, 2.0, 6.0, 5.0]), torch.tensor([0, 0, 0, 1]))
    # 1 - (2+6)/2 = -3;  2 - (1+6)/2 = -1.5;  6 - (1+2)/2 = 4.5;  singleton -> 0
    assert adv.tolist() == pytest.approx([-3.0, -1.5, 4.5, 0.0])
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(30, generator=gen)
    groups = torch.randint(0, 5, (30,), generator=gen)
    adv, _ = rloo_advantages(rewards, groups)
    for i in range(30):
        others = [float(rewards[j]) for j in range(30) if j != i and groups[j] == groups[i]]
        expected = float(rewards[i]) - sum(others) / len(others) if others else 0.0
        assert float(adv[i]) == pytest.approx(expected, abs=1e-5)


def test_remax_subtracts_the_greedy_reward():
    adv, stats = remax_advantages(
        torch.tensor([1.0, 0.5, 0.0]), torch.tensor([0, 0, 1]), baseline_rewards=torch.tensor([0.5, 0.5, 1.0])
    )
    assert adv.tolist() == pytest.approx([0.5, 0.0, -1.0])
    assert stats["baseline_reward_mean"] == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="baseline_rewards"):
        remax_advantages(torch.tensor([1.0]), torch.tensor([0]))


def test_opmd_mean_and_logmeanexp_baselines():
    rewards, groups = torch.tensor([0.0, 1.0, 7.0]), torch.tensor([0, 0, 1])
    mean_adv, _ = opmd_advantages(rewards, groups)
    assert mean_adv.tolist() == pytest.approx([-0.5, 0.5, 0.0])
    lme, _ = opmd_advantages(rewards, groups, baseline="logmeanexp", tau=1.0)
    b = math.log((math.exp(0) + math.exp(1)) / 2)  # = log(1.85914) = 0.62011
    assert lme.tolist() == pytest.approx([-b, 1 - b, 0.0], abs=1e-6)
    lme_half, _ = opmd_advantages(rewards, groups, baseline="logmeanexp", tau=0.5)
    b = 0.5 * math.log((math.exp(0) + math.exp(2)) / 2)  # = 0.5 * log(4.19453) = 0.71689
    assert lme_half.tolist() == pytest.approx([-b, 1 - b, 0.0], abs=1e-6)
    # large rewards / small tau must not overflow (max-shifted logsumexp)
    big, _ = opmd_advantages(
        torch.tensor([1000.0, 1000.0]), torch.tensor([0, 0]), baseline="logmeanexp", tau=0.01
    )
    assert big.tolist() == pytest.approx([0.0, 0.0], abs=1e-6)
    with pytest.raises(ValueError, match="logmeanexp"):
        opmd_advantages(rewards, groups, baseline="max")


def test_asymre_shifted_baseline():
    adv, _ = asymre_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0]), torch.tensor([0, 0, 0, 0, 1]))
    # baseline = mean 0.5 + shift (-0.1) = 0.4; singleton -> 0
    assert adv.tolist() == pytest.approx([0.6, -0.4, -0.4, 0.6, 0.0])


# ---------------------------------------------------------------------------------- token level


def test_reinforce_pp_returns_and_whitening_hand_computed():
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 1.0]])  # row 1 has an observation token
    adv, stats = reinforce_pp_advantages(
        torch.tensor([1.0, 2.0]), torch.tensor([0, 1]), action_mask=mask, gamma=0.5
    )
    # outcome on the last action token; return-to-go with γ=0.5 over action tokens only:
    # row 0: [-, 0.25, 0.5, 1];  row 1: [0.5, 1, (obs), 2]
    returns = [0.25, 0.5, 1.0, 0.5, 1.0, 2.0]
    mean = sum(returns) / 6  # 0.875
    var = sum((g - mean) ** 2 for g in returns) / 5  # 1.96875 / 5 = 0.39375
    white = [(g - mean) / math.sqrt(var + 1e-8) for g in returns]
    assert adv[0].tolist() == pytest.approx([0.0, *white[:3]], abs=1e-5)
    assert adv[1].tolist() == pytest.approx([white[3], white[4], 0.0, white[5]], abs=1e-5)
    assert stats["returns_mean"] == pytest.approx(0.875)
    assert stats["advantages_mean"] == pytest.approx(0.0, abs=1e-6)


def test_returns_to_go_credits_observation_rewards_to_the_previous_action():
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    g = returns_to_go(torch.tensor([[0.0, 3.0, 1.0]]), mask, gamma=0.5)
    # t2: 1;  t1 (obs): 0, carries 3;  t0: 0 + 3 + 0.5 * 1 = 3.5
    assert g.tolist() == [[3.5, 0.0, 1.0]]


def test_reinforce_pp_baseline_subtracts_group_mean_then_whitens():
    mask = torch.ones(3, 2)
    adv, _ = reinforce_pp_baseline_advantages(
        torch.tensor([1.0, 0.0, 0.5]), torch.tensor([0, 0, 1]), action_mask=mask
    )
    # r - group mean: [0.5, -0.5, 0 (singleton)] on every token (γ=1) -> tokens mean 0,
    # unbiased var (4 * 0.25) / 5 = 0.2
    s = math.sqrt(0.2 + 1e-8)
    assert adv.flatten().tolist() == pytest.approx([0.5 / s] * 2 + [-0.5 / s] * 2 + [0.0, 0.0], abs=1e-5)
    with pytest.raises(ValueError, match="action_mask"):
        reinforce_pp_baseline_advantages(torch.tensor([1.0]), torch.tensor([0]))


def test_gae_hand_computed_with_an_observation_token():
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 1.0, 9.0, 2.0]])  # the observation's value is ignored
    rewards = torch.tensor([[0.0, 0.0, 0.3, 1.0]])  # 0.3 arrives on the observation token
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    # t3: δ = 1 + 0.9*0 - 2 = -1;                A3 = -1
    # t1: δ = 0 + 0.3 + 0.9*2 - 1 = 1.1;        A1 = 1.1 + 0.72*(-1) = 0.38
    # t0: δ = 0 + 0.9*1 - 0.5 = 0.4;            A0 = 0.4 + 0.72*0.38 = 0.6736
    assert adv.tolist()[0] == pytest.approx([0.6736, 0.38, 0.0, -1.0], abs=1e-6)
    assert ret.tolist()[0] == pytest.approx([1.1736, 1.38, 0.0, 1.0], abs=1e-6)
    raw, stats = gae_advantages(
        torch.zeros(1), torch.tensor([0]), action_mask=mask, values=values, token_rewards=rewards,
        gamma=0.9, lam=0.8, whiten=False,
    )  # fmt: skip
    assert raw.tolist() == adv.tolist()
    assert stats["returns_mean"] == pytest.approx((1.1736 + 1.38 + 1.0) / 3, abs=1e-6)


def test_gae_with_gamma_lambda_one_is_monte_carlo_minus_value():
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    values = torch.tensor([[0.0, 0.2, 0.4, 0.6]])
    adv, _ = gae_advantages(
        torch.tensor([1.0]), torch.tensor([0]), action_mask=mask, values=values, whiten=False
    )
    # outcome 1 on the last token; A_t = G_t - V_t = 1 - V_t
    assert adv.tolist()[0] == pytest.approx([0.0, 0.8, 0.6, 0.4], abs=1e-6)
    with pytest.raises(ValueError, match="values"):
        gae_advantages(torch.tensor([1.0]), torch.tensor([0]), action_mask=mask)


# ---------------------------------------------------------------------------------- multi-step


def test_step_wise_grpo_uses_each_runs_last_step_reward():
    # group 0: run 0 (steps 0,1,2; last reward 1), run 1 (steps 0,1; last 0), run 2 (step 0; 1)
    # group 1: one run -> 0. Run ids restart per group; rows are shuffled.
    rows = [  # (group, run, step, reward)
        (0, 1, 1, 0.0), (0, 0, 2, 1.0), (1, 0, 0, 5.0), (0, 0, 0, 0.7), (0, 2, 0, 1.0),
        (0, 1, 0, 0.9), (0, 0, 1, 0.0),
    ]  # fmt: skip
    g, r, s, rew = (torch.tensor(c) for c in zip(*rows))
    adv, stats = step_wise_grpo_advantages(rew.float(), g, run_ids=r, step_ids=s)
    # run rewards [1, 0, 1]: mean 2/3, unbiased var (1/9 + 4/9 + 1/9)/2 = 1/3
    hi = (1 / 3) / (math.sqrt(1 / 3) + 1e-6)  # 0.57735
    lo = (-2 / 3) / (math.sqrt(1 / 3) + 1e-6)  # -1.1547
    assert adv.tolist() == pytest.approx([lo, hi, 0.0, hi, hi, lo, hi], abs=1e-5)
    assert stats["runs"] == 4.0
    with pytest.raises(ValueError, match="run_ids"):
        step_wise_grpo_advantages(rew.float(), g)
    dup = s.clone()
    dup[0] = 0  # run 1 of group 0 now has step 0 twice
    with pytest.raises(ValueError, match="unique per run"):
        gigpo_advantages(rew.float(), g, run_ids=r, step_ids=dup, state_ids=s)
    dup = s.clone()
    dup[5] = 1  # run 1 of group 0 now has its last step (1) twice: which reward is the run's?
    with pytest.raises(ValueError, match="run_id 1 of group 0"):
        step_wise_grpo_advantages(rew.float(), g, run_ids=r, step_ids=dup)


def _gigpo_rows():
    # group 0, three runs, states X=10, Y=11, Z=12, V=13, W=14 (ids need not be dense):
    #   run A: X(r0) -> Y(r0) -> Z(r1)     episode return 1
    #   run B: X(r0) -> Y(r0) -> V(r0)     episode return 0
    #   run C: X(r0) -> W(r1)              episode return 1
    # group 1 (same state X, must not share anchors with group 0): runs X(r1) and X(r0)
    return [  # (group, run, step, state, reward)
        (0, 0, 0, 10, 0.0), (0, 0, 1, 11, 0.0), (0, 0, 2, 12, 1.0),
        (0, 1, 0, 10, 0.0), (0, 1, 1, 11, 0.0), (0, 1, 2, 13, 0.0),
        (0, 2, 0, 10, 0.0), (0, 2, 1, 14, 1.0),
        (1, 0, 0, 10, 1.0), (1, 1, 0, 10, 0.0),
    ]  # fmt: skip


def test_gigpo_hand_built_trajectories_with_repeated_states():
    rows = _gigpo_rows()
    perm = [7, 2, 9, 0, 5, 3, 8, 1, 6, 4]  # order must not matter
    g, r, s, st, rew = (torch.tensor([row[k] for row in (rows[i] for i in perm)]) for k in range(5))
    adv, stats = gigpo_advantages(
        rew.float(), g, run_ids=r, step_ids=s, state_ids=st, omega=0.5, gamma=0.5, norm="none"
    )
    # episode level (norm none): group 0 returns [1, 0, 1], mean 2/3 -> A^E = [1/3, -2/3, 1/3]
    #                            group 1 returns [1, 0] -> [0.5, -0.5]
    # discounted step returns (γ=0.5): A: [0.25, 0.5, 1]  B: [0, 0, 0]  C: [0.5, 1]
    # anchors in group 0: X = {A0 .25, B0 0, C0 .5} mean .25 -> [0, -.25, .25]
    #                     Y = {A1 .5, B1 0} mean .25 -> [.25, -.25];  Z, V, W singletons -> 0
    # anchor (group 1, X) = {1, 0} -> [.5, -.5]
    # A = A^E + 0.5 * A^S
    expected_by_row = [
        1 / 3 + 0.0, 1 / 3 + 0.125, 1 / 3 + 0.0,  # run A (Z is a singleton anchor -> 0)
        -2 / 3 - 0.125, -2 / 3 - 0.125, -2 / 3 + 0.0,  # run B (V singleton)
        1 / 3 + 0.125, 1 / 3 + 0.0,  # run C (W singleton)
        0.5 + 0.25, -0.5 - 0.25,  # group 1
    ]  # fmt: skip
    assert adv.tolist() == pytest.approx([expected_by_row[i] for i in perm], abs=1e-6)
    assert stats["anchor_groups"] == 6.0  # X, Y, Z, V, W in group 0 + X in group 1
    assert stats["singleton_anchor_fraction"] == pytest.approx(3 / 10)


def test_gigpo_std_normalization_and_omega_zero_is_episode_grpo():
    rows = _gigpo_rows()
    g, r, s, st, rew = (torch.tensor([row[k] for row in rows]) for k in range(5))
    kw = {"run_ids": r, "step_ids": s, "state_ids": st, "gamma": 0.5}
    adv, _ = gigpo_advantages(rew.float(), g, omega=1.0, **kw)
    eps = 1e-6
    e_hi = (1 / 3) / (math.sqrt(1 / 3) + eps)  # episode group 0: std sqrt(1/3)
    # anchor Y = {0.5, 0}: mean .25, unbiased std sqrt(2 * .0625) = 0.353553 -> ±0.25/0.353553
    y = 0.25 / (math.sqrt(0.125) + eps)
    # anchor X = {.25, 0, .5}: mean .25, std .25 -> [0, -1, 1]
    x = 0.25 / (0.25 + eps)
    assert float(adv[0]) == pytest.approx(e_hi + 0.0, abs=1e-5)  # A at X: deviation 0
    assert float(adv[1]) == pytest.approx(e_hi + y, abs=1e-5)  # A at Y
    assert float(adv[6]) == pytest.approx(e_hi + x, abs=1e-5)  # C at X
    episode_only, _ = gigpo_advantages(rew.float(), g, omega=0.0, **kw)
    per_run, _ = grpo_advantages(torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0]), torch.tensor([0, 0, 0, 1, 1]))
    expected = [per_run[i] for i in (0, 0, 0, 1, 1, 1, 2, 2, 3, 4)]
    assert episode_only.tolist() == pytest.approx([float(v) for v in expected], abs=1e-6)
    with pytest.raises(ValueError, match="state_ids"):
        gigpo_advantages(rew.float(), g, run_ids=r, step_ids=s)
    with pytest.raises(ValueError, match="norm"):
        gigpo_advantages(rew.float(), g, norm="rloo", **kw)


def test_length_balance_makes_each_run_one_episode():
    rows = _gigpo_rows()
    g, r, s, st, rew = (torch.tensor([row[k] for row in rows]) for k in range(5))
    # group 0 run lengths [3, 3, 2] (mean 8/3) -> weights [8/9, 8/9, 4/3]; group 1 [1, 1] -> [1, 1]
    kw = {"run_ids": r, "step_ids": s, "state_ids": st, "gamma": 0.5, "norm": "none"}
    plain, _ = gigpo_advantages(rew.float(), g, omega=0.0, **kw)
    balanced, _ = gigpo_advantages(rew.float(), g, omega=0.0, length_balance=True, **kw)
    weight = [8 / 9] * 6 + [4 / 3] * 2 + [1.0, 1.0]
    assert balanced.tolist() == pytest.approx([float(a) * w for a, w in zip(plain, weight)], abs=1e-6)
    # A^E = [1/3, -2/3, 1/3] broadcast: steps sum to 3(1/3) + 3(-2/3) + 2(1/3) = -1/3 in group 0;
    # balanced they sum to 0, like GRPO's advantages of one group
    assert float(plain[:8].sum()) == pytest.approx(-1 / 3, abs=1e-6)
    assert float(balanced[:8].sum()) == pytest.approx(0.0, abs=1e-6)
    # the step-level (anchor) part is left as it is
    with_steps, _ = gigpo_advantages(rew.float(), g, omega=0.5, length_balance=True, **kw)
    step_part, _ = gigpo_advantages(rew.float(), g, omega=0.5, **kw)
    assert (with_steps - balanced).tolist() == pytest.approx((step_part - plain).tolist(), abs=1e-6)
    # step-wise GRPO: run rewards [1, 0, 1] (last steps), A = ±(1/3, -2/3)/std, same weights
    sw_plain, _ = step_wise_grpo_advantages(rew.float(), g, run_ids=r, step_ids=s)
    sw, _ = step_wise_grpo_advantages(rew.float(), g, run_ids=r, step_ids=s, length_balance=True)
    assert sw.tolist() == pytest.approx([float(a) * w for a, w in zip(sw_plain, weight)], abs=1e-6)
    assert float(sw[:8].sum()) == pytest.approx(0.0, abs=1e-5)


# ---------------------------------------------------------------------------------- registry


def test_every_advantage_is_registered_and_declares_its_inputs():
    expected = {
        "grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "remax", "gae",
        "opmd", "asymre", "step_wise_grpo", "gigpo",
    }  # fmt: skip
    assert set(ADVANTAGES) == expected
    assert needed_inputs(ADVANTAGES["gigpo"], ADVANTAGE_INPUTS) == (
        "rewards", "group_ids", "run_ids", "step_ids", "state_ids",
    )  # fmt: skip
    assert "values" in needed_inputs(ADVANTAGES["gae"], ADVANTAGE_INPUTS)
    assert "baseline_rewards" in needed_inputs(ADVANTAGES["remax"], ADVANTAGE_INPUTS)
    # every built-in tolerates the inputs it does not use (the trainer may pass a superset)
    adv, _ = ADVANTAGES["rloo"](torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), run_ids=torch.tensor([0, 1]))
    assert adv.tolist() == [1.0, -1.0]
    check_args(ADVANTAGES["grpo"], {"std_scope": "batch"}, ADVANTAGE_INPUTS, "algorithm.advantage_args")
    with pytest.raises(ValueError, match="std_normalise"):
        check_args(ADVANTAGES["grpo"], {"std_normalise": False}, ADVANTAGE_INPUTS, "algorithm.advantage_args")
    with pytest.raises(ValueError, match="batch input"):
        check_args(ADVANTAGES["gae"], {"values": 1}, ADVANTAGE_INPUTS, "algorithm.advantage_args")
    grpo = PRESETS["grpo"]
    assert grpo.advantage_inputs == ("rewards", "group_ids")
    grpo.with_overrides(advantage_args={"std_scope": "batch"}).check_args()
    with pytest.raises(ValueError, match="clip_hi"):
        grpo.with_overrides(loss_args={"clip_hi": 0.3}).check_args()
