"""Pure algorithm math against hand-computed values: advantages, PPO/SFT losses, KL, entropy, aggregation."""

from __future__ import annotations

import math

import pytest
import torch

from trine.algorithms import (
    ADVANTAGES,
    AGG_MODES,
    LOSSES,
    PRESETS,
    aggregate,
    entropy_from_logits,
    group_index,
    grpo_advantages,
    kl_penalty,
    masked_mean,
    ppo_clip_loss,
    resolve_advantage,
    resolve_loss,
    sft_loss,
    step_normalizer,
)

# ---------------------------------------------------------------------------------------- GRPO


def test_grpo_two_groups_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 3.0, 1.0])
    groups = group_index(["a", "a", "a", "a", "b", "b"])
    assert groups.tolist() == [0, 0, 0, 0, 1, 1]
    adv, stats = grpo_advantages(rewards, groups)
    # group a: mean 0.5, unbiased std sqrt(1/3); group b: mean 2, unbiased std sqrt(2)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    b = 1.0 / (math.sqrt(2) + 1e-6)
    assert adv.tolist() == pytest.approx([a, -a, -a, a, b, -b], abs=1e-6)
    assert a == pytest.approx(0.8660, abs=1e-4)
    assert stats["zero_std_fraction"] == 0.0
    assert stats["advantages_abs_mean"] == pytest.approx((4 * a + 2 * b) / 6, abs=1e-6)


def test_grpo_advantages_sum_to_zero_per_group():
    gen = torch.Generator().manual_seed(0)
    rewards = torch.rand(40, generator=gen)
    ids = torch.randint(0, 7, (40,), generator=gen).tolist()
    groups = group_index(ids)
    adv, _ = grpo_advantages(rewards, groups)
    for g in set(groups.tolist()):
        members = groups == g
        assert float(adv[members].sum()) == pytest.approx(0.0, abs=1e-5)
        if int(members.sum()) > 1:  # normalised: unbiased std of the advantages is ~1
            assert float(adv[members].std()) == pytest.approx(1.0, abs=1e-3)


def test_grpo_singleton_and_constant_groups_get_zero():
    rewards = torch.tensor([5.0, 1.0, 1.0, 2.0])
    groups = torch.tensor([0, 1, 1, 2])
    adv, stats = grpo_advantages(rewards, groups)
    assert adv.tolist() == [0.0, 0.0, 0.0, 0.0]
    assert stats["zero_std_fraction"] == pytest.approx(0.5)  # the two members of the constant group


def test_grpo_without_std_normalisation():
    adv, _ = grpo_advantages(
        torch.tensor([1.0, 0.0, 0.0, 1.0, 4.0]), torch.tensor([0, 0, 0, 0, 1]), std_normalize=False
    )
    assert adv.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.0])


def test_builtin_tables_and_presets_resolve():
    assert ADVANTAGES["grpo"] is grpo_advantages
    assert LOSSES["ppo_clip"] is ppo_clip_loss and LOSSES["sft"] is sft_loss
    grpo = PRESETS["grpo"]
    assert resolve_advantage(grpo) is grpo_advantages and resolve_loss(grpo) is ppo_clip_loss
    assert not grpo.needs_ref
    tuned = grpo.with_overrides(loss_args={"clip_high": 0.28}, kl_coef=0.1, entropy_coef=None)
    assert tuned.loss_args == {"clip_low": 0.2, "clip_high": 0.28} and tuned.needs_ref
    assert resolve_advantage(PRESETS["sft"]) is None
    with pytest.raises(ValueError, match="unknown algorithm field"):
        grpo.with_overrides(clip=0.1)


# ---------------------------------------------------------------------------------------- PPO


def test_ppo_clip_loss_hand_computed_with_zero_gradient_on_clipped_tokens():
    old = torch.zeros(1, 5)
    log_ratio = torch.tensor([[0.5, -0.5, 0.1, 0.5, 0.3]])
    logprobs = (old + log_ratio).requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 2.0, -1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])  # last token is masked out
    loss, stats = ppo_clip_loss(logprobs, old, adv, mask, normalizer=4.0)
    r = [math.exp(x) for x in log_ratio[0].tolist()]
    per_token = [
        -1.2 * 1.0,  # ratio 1.65 > 1.2 with A > 0: clipped
        0.8,  # ratio 0.61 < 0.8 with A < 0: clipped, -min(-0.61, -0.8)
        -r[2] * 2.0,  # inside the trust region
        r[3] * 1.0,  # ratio above 1.2 but A < 0: the unclipped (pessimistic) branch
    ]
    assert loss.item() == pytest.approx(sum(per_token) / 4, abs=1e-6)
    assert stats["clipfrac"] == pytest.approx(0.5)
    assert stats["ratio_mean"] == pytest.approx(sum(r[:4]) / 4, abs=1e-6)
    approx_kl = sum((x - 1) - math.log(x) for x in r[:4]) / 4
    assert stats["approx_kl"] == pytest.approx(approx_kl, abs=1e-6)
    loss.backward()
    grad = logprobs.grad[0].tolist()
    # d/dlogp of -ratio*A is -ratio*A; clipped and masked tokens get no gradient
    assert grad == pytest.approx([0.0, 0.0, -r[2] * 2.0 / 4, r[3] / 4, 0.0], abs=1e-6)


def test_ppo_separate_clip_low_and_clip_high():
    old = torch.zeros(1, 2)
    logprobs = torch.log(torch.tensor([[1.25, 0.75]])).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0]).view(1, 2)
    mask = torch.ones(1, 2)
    sym, sym_stats = ppo_clip_loss(logprobs, old, adv, mask, normalizer=2.0)
    assert sym.item() == pytest.approx((-1.2 + 0.8) / 2, abs=1e-6)
    assert sym_stats["clipfrac"] == 1.0
    high, high_stats = ppo_clip_loss(logprobs, old, adv, mask, normalizer=2.0, clip_low=0.2, clip_high=0.28)
    assert high.item() == pytest.approx((-1.25 + 0.8) / 2, abs=1e-6)  # 1.25 < 1.28: not clipped
    assert high_stats["clipfrac"] == 0.5
    low, _ = ppo_clip_loss(logprobs, old, adv, mask, normalizer=2.0, clip_low=0.3, clip_high=0.2)
    assert low.item() == pytest.approx((-1.2 + 0.75) / 2, abs=1e-6)  # 0.75 > 0.7: not clipped


def test_ppo_sequence_advantages_broadcast_over_tokens():
    gen = torch.Generator().manual_seed(1)
    lp, old = torch.randn(3, 4, generator=gen) * 0.1, torch.randn(3, 4, generator=gen) * 0.1
    mask = torch.ones(3, 4)
    seq_adv = torch.tensor([1.0, -2.0, 0.5])
    a, _ = ppo_clip_loss(lp, old, seq_adv, mask, normalizer=12.0)
    b, _ = ppo_clip_loss(lp, old, seq_adv[:, None].expand(3, 4), mask, normalizer=12.0)
    assert float(a) == pytest.approx(float(b))


def test_sft_loss_is_mean_nll_over_target_tokens():
    logprobs = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -4.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    loss, stats = sft_loss(logprobs, mask, normalizer=step_normalizer([mask], "token-mean"))
    assert float(loss) == pytest.approx((1 + 2 + 3 + 0.5 + 4) / 5)
    assert stats["nll"] == pytest.approx(2.1)


# ---------------------------------------------------------------------------------------- KL, entropy


def test_kl_estimators_hand_computed():
    logprobs = torch.tensor([-1.0, -2.0, -0.5])
    ref = torch.tensor([-1.5, -1.0, -0.5])
    x = [-0.5, 1.0, 0.0]  # ref - logprobs
    assert kl_penalty(logprobs, ref, "k1").tolist() == pytest.approx([0.5, -1.0, 0.0])
    assert kl_penalty(logprobs, ref, "k2").tolist() == pytest.approx([v * v / 2 for v in x])
    k3 = [math.exp(v) - v - 1 for v in x]
    assert kl_penalty(logprobs, ref, "k3").tolist() == pytest.approx(k3, abs=1e-6)
    assert kl_penalty(logprobs, ref, "low_var_kl").tolist() == pytest.approx(k3, abs=1e-6)
    assert kl_penalty(logprobs, ref, "abs").tolist() == pytest.approx([0.5, 1.0, 0.0])
    assert min(kl_penalty(torch.randn(100), torch.randn(100), "k3").tolist()) >= 0.0
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(logprobs, ref, "k4")


def test_k3_beyond_log_ratio_10_has_exact_value_and_gradient():
    # x = ref - logp = -10.5: k3 = e^-10.5 + 10.5 - 1 = 9.5000275, dk3/dlogp = 1 - e^-10.5 = 0.9999725.
    # Clamping the *input* at ±10 gave e^-10 + 9 = 9.0000454 with gradient 0.
    # x = +3: e^3 - 4 = 16.09 > 10, so the value is clamped to 10 and the gradient is 0.
    # x = -30: beyond the ±20 input clamp; e^-20 + 19 > 10, value clamped to 10, gradient 0.
    # x = +100: e^100 overflows float32 without the input clamp; value 10, gradient 0 (not NaN).
    logprobs = torch.tensor([0.0, -3.0, 0.0, -100.0], requires_grad=True)
    ref = torch.tensor([-10.5, 0.0, -30.0, 0.0])
    for estimator in ("k3", "low_var_kl"):
        kl = kl_penalty(logprobs, ref, estimator)
        (grad,) = torch.autograd.grad(kl.sum(), logprobs)
        assert kl.tolist() == pytest.approx([9.5000275, 10.0, 10.0, 10.0], abs=1e-5)
        assert grad.tolist() == pytest.approx([0.9999725, 0.0, 0.0, 0.0], abs=1e-6)


def test_entropy_matches_torch_distributions_with_chunking():
    logits = torch.randn(2, 7, 33, generator=torch.Generator().manual_seed(0)) * 3
    expected = torch.distributions.Categorical(logits=logits).entropy()
    for chunk in (3, 5, 1024):  # 14 positions: chunks smaller than, not dividing, and above
        got = entropy_from_logits(logits, chunk_size=chunk)
        assert got.shape == (2, 7)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    uniform = entropy_from_logits(torch.zeros(4, 16))
    torch.testing.assert_close(uniform, torch.full((4,), math.log(16)))


# ---------------------------------------------------------------------------------------- aggregation


def test_aggregate_modes_hand_computed():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    expected = {
        "token-mean": (3 + 15) / 5,
        "seq-mean-token-sum": (3 + 15) / 2,
        "seq-mean-token-mean": (1.5 + 5) / 2,
        "seq-mean-token-sum-norm": (3 + 15) / (2 * 4),
    }
    for mode, value in expected.items():
        norm = step_normalizer([mask], mode, max_response_length=4)
        assert float(aggregate(loss, mask, mode, norm)) == pytest.approx(value), mode
    assert float(masked_mean(loss, mask)) == pytest.approx(18 / 5)
    with pytest.raises(ValueError, match="max_response_length"):
        step_normalizer([mask], "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="token-mean"):
        step_normalizer([mask], "sum")


def _split(loss: torch.Tensor, mask: torch.Tensor, lengths: list[int], plan: list[list[int]]):
    """Micro-batches as the trainer builds them: a subset of rows, trimmed to its longest response."""
    out = []
    for rows in plan:
        width = max(lengths[i] for i in rows)
        out.append((loss[rows][:, -width:], mask[rows][:, -width:]))
    return out


@pytest.mark.parametrize("mode", AGG_MODES)
def test_micro_batch_gradients_sum_to_the_full_batch_gradient(mode):
    gen = torch.Generator().manual_seed(3)
    lengths = [7, 1, 4, 6, 2, 5, 3]
    rows, width = len(lengths), max(lengths)
    mask = torch.zeros(rows, width)
    for i, n in enumerate(lengths):  # right-aligned responses; some tokens inside are observations
        mask[i, width - n :] = 1.0
    mask[0, 2] = 0.0
    mask[3, 3] = 0.0
    values = torch.randn(rows, width, generator=gen)

    full = values.clone().requires_grad_(True)
    norm_full = step_normalizer([mask], mode, max_response_length=8)
    aggregate(full * full, mask, mode, norm_full).backward()

    split = values.clone().requires_grad_(True)
    for plan in ([[0], [1], [2], [3], [4], [5], [6]], [[0, 3], [5, 2, 6], [4, 1]]):
        if split.grad is not None:
            split.grad = None
        batches = _split(split * split, mask, lengths, plan)
        norm = step_normalizer([m for _, m in batches], mode, max_response_length=8)
        assert norm == norm_full
        total = sum(aggregate(loss, m, mode, norm) for loss, m in batches)
        total.backward()
        torch.testing.assert_close(split.grad, full.grad, atol=1e-6, rtol=1e-6)
        assert float(full.grad.abs().sum()) > 0
