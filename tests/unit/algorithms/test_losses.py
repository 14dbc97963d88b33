"""Policy/value/preference losses, entropy bonus and KL control against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from trine.algorithms import (
    AGG_MODES,
    LOSS_INPUTS,
    LOSSES,
    adaptive_kl_coef,
    cispo_loss,
    distill_loss,
    dpo_loss,
    entropy_bonus,
    entropy_from_logits,
    gspo_loss,
    kl_in_reward,
    mix_loss,
    needed_inputs,
    opmd_advantages,
    opmd_kimi_loss,
    opmd_loss,
    opmd_pairwise_loss,
    pg_loss,
    ppo_clip_loss,
    sapo_loss,
    sequence_logps,
    split_normalizer,
    step_normalizer,
    value_loss,
)
from trine.algorithms.losses import ppo_clip_per_token


def _leaf(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).requires_grad_(True)


# ---------------------------------------------------------------------------------- PPO dual clip


def test_dual_clip_hand_computed():
    old = torch.zeros(1, 3)
    logprobs = _leaf([[math.log(3.0), math.log(1.5), math.log(3.0)]])
    adv = torch.tensor([[-1.0, -1.0, 1.0]])
    mask = torch.ones(1, 3)
    loss, stats = ppo_clip_loss(logprobs, old, adv, mask, normalizer=3.0, dual_clip_c=2.0)
    # t0: ρ=3, A=-1: PPO gives -min(-3, -1.2) = 3 > c|A| = 2 -> 2 (no gradient)
    # t1: ρ=1.5, A=-1: PPO gives 1.5 <= 2 -> 1.5 (gradient ρ·1/3 = 0.5)
    # t2: ρ=3, A=+1: clipped to 1.2 -> -1.2 (no gradient), dual clip ignores A > 0
    assert loss.item() == pytest.approx((2.0 + 1.5 - 1.2) / 3, abs=1e-6)
    assert stats["dual_clipfrac"] == pytest.approx(1 / 3)
    loss.backward()
    assert logprobs.grad[0].tolist() == pytest.approx([0.0, 0.5, 0.0], abs=1e-6)
    plain, _ = ppo_clip_loss(logprobs, old, adv, mask, normalizer=3.0)
    assert plain.item() == pytest.approx((3.0 + 1.5 - 1.2) / 3, abs=1e-6)
    with pytest.raises(ValueError, match="dual_clip_c"):
        ppo_clip_loss(logprobs, old, adv, mask, normalizer=3.0, dual_clip_c=0.5)


def test_dual_clip_bounds_every_negative_advantage_token():
    gen = torch.Generator().manual_seed(0)
    logprobs = torch.randn(8, 16, generator=gen)
    old = torch.randn(8, 16, generator=gen)
    adv = torch.randn(8, 16, generator=gen) * 3
    per_tok, _ = ppo_clip_per_token(logprobs, old, adv, dual_clip_c=3.0)
    neg = adv < 0
    assert bool((per_tok[neg] <= 3.0 * adv[neg].abs() + 1e-6).all())
    plain, _ = ppo_clip_per_token(logprobs, old, adv)
    assert bool((plain[neg] > 3.0 * adv[neg].abs()).any())  # the bound is active somewhere
    torch.testing.assert_close(per_tok[~neg], plain[~neg])


# ---------------------------------------------------------------------------------- GSPO


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_gspo_equals_ppo_clip_when_every_response_is_one_token(mode):
    gen = torch.Generator().manual_seed(1)
    rows = 6
    mask = torch.zeros(rows, 3)
    mask[:, 2] = 1.0  # right-aligned: one action token per row, two padding positions
    base = torch.randn(rows, 3, generator=gen) * 0.3
    old = torch.randn(rows, 3, generator=gen) * 0.3
    adv = torch.randn(rows, generator=gen)
    norm = step_normalizer([mask], mode)
    kw = {"normalizer": norm, "agg_mode": mode, "clip_low": 0.2, "clip_high": 0.28}
    a, b = base.clone().requires_grad_(True), base.clone().requires_grad_(True)
    gspo, g_stats = gspo_loss(a, old, adv, mask, **kw)
    ppo, p_stats = ppo_clip_loss(b, old, adv, mask, **kw)
    gspo.backward()
    ppo.backward()
    assert gspo.item() == pytest.approx(ppo.item(), abs=1e-6)
    torch.testing.assert_close(a.grad, b.grad)
    assert g_stats["clipfrac"] == pytest.approx(p_stats["clipfrac"])
    assert float(a.grad.abs().sum()) > 0


def test_gspo_sequence_ratio_hand_computed():
    old = torch.zeros(2, 2)
    logprobs = _leaf([[0.1, 0.3], [-0.1, 0.0]])
    mask = torch.ones(2, 2)
    adv = torch.tensor([1.0, 1.0])
    loss, stats = gspo_loss(logprobs, old, adv, mask, normalizer=2.0, clip_low=0.2, clip_high=0.2)
    # row 0: s = exp(mean(0.1, 0.3)) = exp(0.2) = 1.2214 > 1.2, A > 0 -> clipped: -1.2 per token
    # row 1: s = exp(-0.05) = 0.951229 -> -0.951229 per token; seq-mean-token-mean over 2 rows
    assert loss.item() == pytest.approx((-1.2 - math.exp(-0.05)) / 2, abs=1e-6)
    assert stats["clipfrac"] == pytest.approx(0.5)
    assert stats["seq_ratio_mean"] == pytest.approx((math.exp(0.2) + math.exp(-0.05)) / 2, abs=1e-6)
    loss.backward()
    # row 1 token gradient: -s·A / (|y|=2) / N=2
    g = -math.exp(-0.05) / 4
    assert logprobs.grad.tolist() == [[0.0, 0.0], pytest.approx([g, g], abs=1e-6)]


# ---------------------------------------------------------------------------------- CISPO, SAPO, PG


def test_cispo_hand_computed():
    logprobs = _leaf([[-1.0, -2.0, -0.5]])
    ratios = torch.tensor([[1.5, 0.5, 1.0]])
    old = logprobs.detach() - ratios.log()
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    loss, stats = cispo_loss(logprobs, old, adv, torch.ones(1, 3), normalizer=3.0)
    # weights clip(ρ, 1-1, 1+0.28) = [1.28, 0.5, 1.0]; L_t = -w·A·logp = [1.28, 1.0, -0.5]
    assert loss.item() == pytest.approx((1.28 + 1.0 - 0.5) / 3, abs=1e-5)
    assert stats["clipfrac"] == pytest.approx(1 / 3)
    loss.backward()
    # gradient -w·A/N: every token keeps a gradient, the truncated one with weight 1.28
    assert logprobs.grad[0].tolist() == pytest.approx([-1.28 / 3, -0.5 / 3, 1.0 / 3], abs=1e-5)


def test_sapo_soft_gate_hand_computed():
    old = torch.zeros(1, 3)
    logprobs = _leaf([[0.0, 0.0, 0.5]])
    adv = torch.tensor([[1.0, -1.0, 1.0]])
    loss, stats = sapo_loss(logprobs, old, adv, torch.ones(1, 3), normalizer=3.0)
    # f(ρ) = σ(τ(ρ-1))·4/τ.  t0: ρ=1, τ=1: f=2 -> -2.   t1: ρ=1, τ_neg=1.05: f = 2/1.05 -> +1.904762
    # t2: ρ=e^0.5=1.648721, τ=1: σ(0.648721) = 0.656715 -> f = 2.626861 -> -2.626861
    rho = math.exp(0.5)
    sig = 1 / (1 + math.exp(-(rho - 1)))
    assert loss.item() == pytest.approx((-2.0 + 2 / 1.05 - 4 * sig) / 3, abs=1e-5)
    loss.backward()
    # dL/dlogp = -A · 4σ(1-σ) · ρ / N: 1 on-policy (plain PG), decayed off-policy
    assert logprobs.grad[0].tolist() == pytest.approx(
        [-1 / 3, 1 / 3, -4 * sig * (1 - sig) * rho / 3], abs=1e-5
    )
    assert stats["soft_gate_mean"] == pytest.approx((1 + 1 + 4 * sig * (1 - sig)) / 3, abs=1e-5)
    with pytest.raises(ValueError, match="tau"):
        sapo_loss(logprobs, old, adv, torch.ones(1, 3), normalizer=3.0, tau_neg=0.0)


def test_pg_loss_is_minus_ratio_times_advantage():
    logprobs = _leaf([[math.log(2.0), 0.0]])
    loss, stats = pg_loss(
        logprobs, torch.zeros(1, 2), torch.tensor([[1.0, -3.0]]), torch.ones(1, 2), normalizer=2.0
    )
    assert loss.item() == pytest.approx((-2.0 + 3.0) / 2, abs=1e-6)  # -ρA: -2·1 and -1·(-3)
    assert stats["ratio_mean"] == pytest.approx(1.5)
    loss.backward()
    assert logprobs.grad[0].tolist() == pytest.approx([-1.0, 1.5], abs=1e-6)  # -ρA/N


# ---------------------------------------------------------------------------------- OPMD


def test_opmd_simple_loss_scaled_by_one_over_one_plus_tau():
    logprobs = _leaf([[-1.0, 0.0], [-2.0, -3.0]])
    mask = torch.tensor([[1.0, 0.0], [1.0, 0.0]])
    loss, _ = opmd_loss(logprobs, torch.tensor([1.0, -1.0]), mask, normalizer=2.0, tau=1.0)
    # -A·logp/(1+τ): row 0: -(1)(-1)/2 = 0.5, row 1: -(-1)(-2)/2 = -1 -> (0.5 - 1)/2
    assert loss.item() == pytest.approx(-0.25)


def test_opmd_kimi_squared_residual_hand_computed():
    rewards, groups = torch.tensor([1.0, 0.0]), torch.tensor([0, 0])
    adv, _ = opmd_advantages(rewards, groups, baseline="logmeanexp", tau=1.0)
    b = math.log((math.e + 1) / 2)  # τ log Ẑ = 0.620115
    old = torch.zeros(2, 2)
    logprobs = _leaf([[0.1, 0.2], [0.0, -0.1]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    loss, stats = opmd_kimi_loss(logprobs, old, adv, mask, normalizer=2.0, tau=1.0)
    # residual_i = (r_i - τ log Ẑ) - τ Σ_t (logp - old):  0.379885 - 0.3 and -0.620115 + 0.1
    res = [(1 - b) - 0.3, (0 - b) + 0.1]
    assert loss.item() == pytest.approx((res[0] ** 2 + res[1] ** 2) / 2, abs=1e-6)
    assert stats["consistency_residual_abs"] == pytest.approx((abs(res[0]) + abs(res[1])) / 2, abs=1e-6)
    loss.backward()
    # d/dlogp_t of res_i²/N = 2·res_i·(-τ)/2 = -res_i on each action token of row i
    assert logprobs.grad.tolist() == [
        pytest.approx([-res[0], -res[0]], abs=1e-6),
        pytest.approx([0.0, -res[1]], abs=1e-6),
    ]


def test_opmd_pairwise_value_and_gradient_match_the_report():
    rewards = torch.tensor([1.0, 0.0, 0.0, 5.0])
    groups = torch.tensor([0, 0, 0, 1])  # the last row is alone: no pair, no gradient
    ref = torch.tensor([[-1.0], [-2.0], [-0.5], [-1.0]])
    logprobs = ref.clone().requires_grad_(True)  # θ = θ_ref: a_i = r_i
    mask = torch.ones(4, 1)
    tau = 1.0
    loss, stats = opmd_pairwise_loss(
        logprobs, mask, rewards=rewards, group_ids=groups, ref_logprobs=ref, normalizer=4.0, tau=tau
    )
    # Σ_{i<j} (a_i - a_j)² = (1-0)² + (1-0)² + 0 = 2;  / (1+τ)² = 0.5;  / N = 4 rows
    assert loss.item() == pytest.approx(0.5 / 4)
    assert stats["opmd_pairs"] == 3.0
    loss.backward()
    # report A.3: ∇ = -2τ/(1+τ)² Σ_i K (r_i - r̄) ∇logπ_i, K = 3, r̄ = 1/3; divided by N = 4
    k, rbar = 3, 1 / 3
    expected = [-2 * tau / (1 + tau) ** 2 * k * (r - rbar) / 4 for r in (1.0, 0.0, 0.0)] + [0.0]
    assert logprobs.grad[:, 0].tolist() == pytest.approx(expected, abs=1e-6)
    with pytest.raises(ValueError, match="rewards and group_ids"):
        opmd_pairwise_loss(logprobs, mask, normalizer=4.0, ref_logprobs=ref)


# ---------------------------------------------------------------------------------- DPO


def test_dpo_hand_computed():
    chosen, rejected = torch.tensor([-1.0, -2.0]), torch.tensor([-3.0, -1.0])
    ref_c, ref_r = torch.tensor([-2.0, -1.5]), torch.tensor([-2.0, -1.5])
    loss, stats = dpo_loss(chosen, rejected, ref_c, ref_r, beta=0.5)
    # pair 0: chosen reward 0.5·1 = 0.5, rejected 0.5·(-1) = -0.5, z = 1 -> -log σ(1) = 0.313262
    # pair 1: chosen 0.5·(-0.5) = -0.25, rejected 0.5·0.5 = 0.25, z = -0.5 -> -log σ(-0.5) = 0.974077
    l0, l1 = math.log1p(math.exp(-1.0)), math.log1p(math.exp(0.5))
    assert loss.item() == pytest.approx((l0 + l1) / 2, abs=1e-6)
    assert stats["reward_margin"] == pytest.approx((1.0 - 0.5) / 2)
    assert stats["reward_accuracy"] == 0.5
    assert stats["chosen_reward"] == pytest.approx(0.125)
    smooth, _ = dpo_loss(chosen, rejected, ref_c, ref_r, beta=0.5, label_smoothing=0.1, normalizer=4.0)
    # -(0.9) log σ(z) - 0.1 log σ(-z), summed over pairs and divided by the step's 4 pairs
    s0 = 0.9 * l0 + 0.1 * math.log1p(math.exp(1.0))
    s1 = 0.9 * l1 + 0.1 * math.log1p(math.exp(-0.5))
    assert smooth.item() == pytest.approx((s0 + s1) / 4, abs=1e-6)
    lp = torch.tensor([[0.0, -1.0, -2.0]])
    assert sequence_logps(lp, torch.tensor([[0.0, 1.0, 1.0]])).tolist() == [-3.0]


# ---------------------------------------------------------------------------------- MIX, distill, value


def test_mix_loss_hand_computed():
    logprobs = torch.tensor([[-0.5, -0.5], [-1.0, -3.0], [-0.7, -0.2]])
    old = logprobs.clone()  # ρ = 1
    adv = torch.tensor([1.0, float("nan"), -1.0])  # the expert row's advantage must not leak
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 1.0]])
    expert = torch.tensor([False, True, False])
    n_rl, n_exp = split_normalizer([mask], [expert], "token-mean")
    assert (n_rl, n_exp) == (3.0, 2.0)
    loss, stats = mix_loss(
        logprobs, old, adv, mask, is_expert=expert, normalizer=n_rl, expert_normalizer=n_exp, mu=0.25
    )
    # RL tokens: -A·ρ = [-1, -1, +1] / 3 = -1/3;  SFT: (1 + 3) / 2 = 2
    # 0.75·(-1/3) + 0.25·2 = 0.25
    assert loss.item() == pytest.approx(0.25, abs=1e-6)
    assert stats["expert_nll"] == pytest.approx(2.0)
    assert stats["expert_fraction"] == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="is_expert"):
        mix_loss(logprobs, old, adv, mask, normalizer=3.0)


def test_distill_value_is_reverse_kl_and_gradient_is_policy_gradient():
    logprobs = _leaf([[-1.0, -2.0]])
    teacher = torch.tensor([[-1.5, -1.0]])
    loss, stats = distill_loss(
        logprobs, teacher, torch.ones(1, 2), old_logprobs=logprobs.detach(), normalizer=2.0
    )
    # k = logp - teacher = [0.5, -1.0]; value mean(k) = -0.25; gradient k/N (weight of ∇logπ)
    assert loss.item() == pytest.approx(-0.25)
    assert stats["reverse_kl"] == pytest.approx(-0.25)
    loss.backward()
    assert logprobs.grad[0].tolist() == pytest.approx([0.25, -0.5])
    with pytest.raises(ValueError, match="teacher_logprobs"):
        distill_loss(logprobs, None, torch.ones(1, 2), normalizer=2.0)


def test_value_loss_clipped_hand_computed():
    values = _leaf([[1.0, 2.0]])
    old = torch.tensor([[0.5, 2.0]])
    returns = torch.tensor([[2.0, 1.0]])
    loss, stats = value_loss(values, old, returns, torch.ones(1, 2), normalizer=2.0, clip_eps=0.2)
    # t0: (1-2)² = 1; clipped V = 0.5 + clip(0.5, ±0.2) = 0.7 -> (0.7-2)² = 1.69 -> max 1.69
    # t1: (2-1)² = 1 both ways.  0.5·(1.69 + 1) / 2
    assert loss.item() == pytest.approx(0.5 * (1.69 + 1.0) / 2, abs=1e-6)
    assert stats["vf_clipfrac"] == 0.5
    assert stats["vf_error"] == pytest.approx(1.0)
    loss.backward()
    # t0: the clipped branch is flat in V -> 0;  t1: (V - R)/N = 0.5
    assert values.grad[0].tolist() == pytest.approx([0.0, 0.5], abs=1e-6)
    plain, _ = value_loss(values, old, returns, torch.ones(1, 2), normalizer=2.0, clip_eps=None)
    assert plain.item() == pytest.approx(0.5 * (1.0 + 1.0) / 2)


# ---------------------------------------------------------------------------------- entropy, KL


def test_entropy_bonus_hand_computed():
    entropy = _leaf([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    term, stats = entropy_bonus(entropy, mask, 0.01, 3.0, "token-mean")
    assert term.item() == pytest.approx(-0.01 * (1 + 2 + 4) / 3)
    assert stats["entropy"] == pytest.approx(7 / 3)
    term.backward()
    assert entropy.grad.tolist() == [pytest.approx([-0.01 / 3] * 2), pytest.approx([0.0, -0.01 / 3])]


def test_chunked_entropy_carries_the_gradient_the_bonus_needs():
    logits = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(2))
    a, b = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    mask = torch.ones(2, 5)
    term, _ = entropy_bonus(entropy_from_logits(a, chunk_size=3), mask, 0.1, 10.0)
    term.backward()
    expected, _ = entropy_bonus(torch.distributions.Categorical(logits=b).entropy(), mask, 0.1, 10.0)
    expected.backward()
    torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5)


def test_adaptive_kl_coef_ziegler_controller():
    # e = clip(0.2/0.1 - 1, ±0.2) = 0.2;  β·(1 + 0.2·256/10000) = 0.1·1.00512
    assert adaptive_kl_coef(0.1, 0.2, 0.1, 10000, 256) == pytest.approx(0.100512)
    # e = clip(0.05/0.1 - 1) = -0.2 (from -0.5)
    assert adaptive_kl_coef(0.1, 0.05, 0.1, 10000, 256) == pytest.approx(0.099488)
    assert adaptive_kl_coef(0.1, 0.1, 0.1, 10000, 256) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="target_kl"):
        adaptive_kl_coef(0.1, 0.1, 0.0, 10000, 256)


def test_kl_in_reward_outcome_and_token_level():
    kl = torch.tensor([[0.1, 0.2], [0.3, 0.4]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    shaped, stats = kl_in_reward(torch.tensor([1.0, 0.0]), kl, 0.5, mask)
    # r - β Σ_t m kl: 1 - 0.5·0.3 = 0.85;  0 - 0.5·0.4 = -0.2
    assert shaped.tolist() == pytest.approx([0.85, -0.2])
    assert stats["kl_in_reward"] == pytest.approx((0.1 + 0.2 + 0.4) / 3)
    tokens, _ = kl_in_reward(torch.tensor([[0.0, 1.0], [0.0, 0.0]]), kl, 0.5, mask)
    assert tokens.tolist() == [pytest.approx([-0.05, 0.9]), pytest.approx([0.0, -0.2])]


# ---------------------------------------------------------------------------------- micro-batch exactness


def _rows(lengths: list[int]) -> torch.Tensor:
    width = max(lengths)
    mask = torch.zeros(len(lengths), width)
    for i, n in enumerate(lengths):
        mask[i, width - n :] = 1.0
    return mask


def _loss_over(name, plan, mode, lp, old, adv, mask, lengths, expert):
    """Sum of the loss over micro-batches (rows ``plan``, trimmed to their longest response)."""
    batches = [(rows, max(lengths[i] for i in rows)) for rows in plan]
    masks = [mask[rows][:, -w:] for rows, w in batches]
    norm = step_normalizer(masks, mode, max_response_length=8)
    n_rl, n_exp = split_normalizer(masks, [expert[rows] for rows, _ in batches], mode, max_response_length=8)
    total = 0.0
    for (rows, w), m in zip(batches, masks):
        sl = (lp[rows][:, -w:], old[rows][:, -w:], adv[rows], m)
        if name == "mix":
            loss, _ = mix_loss(
                *sl, is_expert=expert[rows], normalizer=n_rl, expert_normalizer=n_exp, agg_mode=mode
            )
        else:
            loss, _ = LOSSES[name](*sl, normalizer=norm, agg_mode=mode)
        total = total + loss
    return total


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("name", ["gspo", "cispo", "sapo", "opmd_kimi", "mix"])
def test_new_losses_are_exact_across_micro_batch_splits(name, mode):
    gen = torch.Generator().manual_seed(7)
    lengths = [7, 1, 4, 6, 2, 5, 3]
    mask = _rows(lengths)
    mask[0, 2] = 0.0  # an observation token inside a response
    rows, width = mask.shape
    base = torch.randn(rows, width, generator=gen) * 0.2
    old = base + torch.randn(rows, width, generator=gen) * 0.1
    adv = torch.randn(rows, generator=gen)
    expert = torch.tensor([False, True, False, False, True, False, False])
    full = base.clone().requires_grad_(True)
    ref = _loss_over(name, [list(range(rows))], mode, full, old, adv, mask, lengths, expert)
    ref.backward()
    split = base.clone().requires_grad_(True)
    total = _loss_over(name, [[0, 3], [5, 2, 6], [4, 1]], mode, split, old, adv, mask, lengths, expert)
    total.backward()
    assert float(total.detach()) == pytest.approx(float(ref.detach()), abs=1e-6)
    torch.testing.assert_close(split.grad, full.grad, atol=1e-6, rtol=1e-6)
    assert float(full.grad.abs().sum()) > 0


# ---------------------------------------------------------------------------------- registry


def test_every_loss_is_registered_and_declares_its_inputs():
    expected = {
        "ppo_clip", "pg", "gspo", "cispo", "sapo", "opmd", "opmd_kimi", "opmd_pairwise",
        "sft", "dpo", "mix", "distill", "value",
    }  # fmt: skip
    assert set(LOSSES) == expected
    assert "is_expert" in needed_inputs(LOSSES["mix"], LOSS_INPUTS)
    assert "teacher_logprobs" in needed_inputs(LOSSES["distill"], LOSS_INPUTS)
    assert {"rewards", "group_ids", "ref_logprobs"} <= set(
        needed_inputs(LOSSES["opmd_pairwise"], LOSS_INPUTS)
    )
    assert {"values", "old_values", "returns"} <= set(needed_inputs(LOSSES["value"], LOSS_INPUTS))
    # the trainer's standard call (plus inputs a loss does not use) works for every policy loss
    lp, mask = torch.zeros(2, 3), torch.ones(2, 3)
    call = {"logprobs": lp, "old_logprobs": lp, "advantages": torch.tensor([1.0, -1.0]), "action_mask": mask,
            "normalizer": 6.0, "agg_mode": "token-mean", "ref_logprobs": lp, "teacher_logprobs": lp,
            "rewards": torch.tensor([1.0, 0.0]), "group_ids": torch.tensor([0, 0]),
            "is_expert": torch.tensor([False, True])}  # fmt: skip
    for name in expected - {"dpo", "value"}:
        loss, stats = LOSSES[name](**call)
        assert loss.dim() == 0 and all(isinstance(v, float) for v in stats.values()), name
