"""The shared-prompt forward: same logprobs, entropy and gradients as the per-sample forward; the planner."""

from __future__ import annotations

import pytest
import torch

from trine.algorithms import entropy_from_logits
from trine.models.batching import collate, forward_logprobs
from trine.models.shared_prompt import plan_shared_micro_batches, unsupported_reason
from trine.types import Experience

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _rows() -> list[Experience]:
    """Two groups sharing their prompts (responses of different lengths, one empty), a group whose rows'
    prompts differ (each runs its own), a two-token prompt (a one-token prefix), mixed temperatures and
    a row sampled with top-k (its truncation is replayed)."""
    gen = torch.Generator().manual_seed(0)

    def ids(n: int) -> list[int]:
        return torch.randint(3, 200, (n,), generator=gen).tolist()

    a, b = ids(9), ids(4)
    specs = [
        (a, 6, "a", {}), (a, 2, "a", {"temperature": 0.7}), (a, 11, "a", {}), (a, 0, "a", {}),
        (b, 3, "b", {"top_k": 5}), (b, 1, "b", {}),
        (ids(6), 4, "c", {}), (ids(3), 5, "c", {}), (ids(2), 2, "d", {}),
    ]  # fmt: skip
    out = []
    for prompt, n, group, info in specs:
        mask = [1] * n
        if n > 3:
            mask[1] = 0  # an observation token inside the response
        out.append(Experience(prompt + ids(n), len(prompt), mask, reward=0.0, group_id=group, info=info))
    return out


def _forward(model, exps: list[Experience], shared: bool):
    """Logprobs, entropy, action mask and the gradient of ``Σ mask × (logprobs + 0.1 entropy)``."""
    model.zero_grad(set_to_none=True)
    batch = collate(exps, list(range(len(exps))), 0, "cpu", shared_prompt=shared)
    assert (batch.shared is not None) == shared
    logprobs, entropy = forward_logprobs(model, batch, entropy_fn=entropy_from_logits, entropy_grad=True)
    ((logprobs + 0.1 * entropy) * batch.action_mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return logprobs.detach(), entropy.detach(), batch.action_mask, grads


def test_shared_prompt_forward_matches_the_per_sample_forward(model):
    exps = _rows()
    model.train()
    try:
        lp, ent, mask, grads = _forward(model, exps, shared=False)
        lp_s, ent_s, mask_s, grads_s = _forward(model, exps, shared=True)
    finally:
        model.eval()
    torch.testing.assert_close(mask_s, mask)
    assert mask.sum() > 20 and max(float(g.abs().max()) for g in grads.values()) > 1e-1
    torch.testing.assert_close(lp_s * mask, lp * mask, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_s * mask, ent * mask, atol=1e-5, rtol=0)
    for name, g in grads.items():  # the gradient reaches every weight, through the prompts' activations too
        torch.testing.assert_close(grads_s[name], g, atol=1e-5, rtol=1e-4, msg=name)
    batch = collate(exps, list(range(len(exps))), 0, "cpu", shared_prompt=True)
    layout = batch.shared
    assert layout is not None and layout.prefix_ids.shape[0] == 5  # a, b, the two of c, d: each once
    assert layout.forward_tokens < batch.padded_tokens
    # trainer/padding_fraction describes the forward that runs: each prompt's tokens once, then the segments
    real, run = batch.forward_tokens
    prompts = {tuple(e.tokens[: e.prompt_length]) for e in exps}
    segments = sum(e.response_length for e in exps)  # [last prompt token, response[:-1]]; empty: none
    assert (real, run) == (sum(len(p) - 1 for p in prompts) + segments, layout.forward_tokens)
    per_sample = collate(exps, list(range(len(exps))), 0, "cpu")
    assert per_sample.forward_tokens == (per_sample.num_tokens, per_sample.padded_tokens)


def test_shared_prompt_forward_without_gradients(model):
    exps = _rows()
    rows = list(range(len(exps)))
    batch = collate(exps, rows, 0, "cpu")
    with torch.no_grad():
        per_sample, _ = forward_logprobs(model, batch)
        shared, _ = forward_logprobs(model, collate(exps, rows, 0, "cpu", shared_prompt=True))
    mask = batch.action_mask  # the columns before a row's response are no target on either path
    torch.testing.assert_close(shared * mask, per_sample * mask, atol=1e-5, rtol=0)


def test_plan_keeps_each_prompt_together_within_the_budget():
    prompts = ["p", "q", "p", "q", "r", "p", "q", "p"]
    prompt_lengths = [10 if k == "p" else 30 if k == "q" else 5 for k in prompts]
    responses = [4, 8, 6, 2, 20, 5, 8, 1]
    plan, cost = plan_shared_micro_batches(prompts, prompt_lengths, responses, token_budget=10**6)
    assert len(plan) == 1 and sorted(plan[0]) == list(range(8))
    assert cost == 3 * 29 + 8 * 20 + 2 * 128  # one micro-batch: 3 prompts x P_max-1, 8 rows x R
    plan, cost = plan_shared_micro_batches(prompts, prompt_lengths, responses, token_budget=120)
    assert len(plan) > 1 and sorted(i for mb in plan for i in mb) == list(range(8))
    for mb in plan:  # no more rows than a per-sample micro-batch: B x L_max within the budget
        assert len(mb) * max(prompt_lengths[i] + responses[i] for i in mb) <= 120 or len(mb) == 1
    # a group too big for the budget alone is cut into chunks, longest rows first
    plan, _ = plan_shared_micro_batches(["p"] * 4, [11] * 4, [5, 9, 3, 7], token_budget=40)
    assert plan == [[1, 3], [0, 2]]


def test_plan_buckets_a_few_long_responses_apart_unless_prompts_are_long():
    prompts = ["p"] * 8 + ["q"] * 8
    responses = [30] + [2] * 7 + [30] + [2] * 7  # one long answer per group among short ones
    plan, cost = plan_shared_micro_batches(prompts, [12] * 16, responses, token_budget=8192)
    assert plan == [[0, 8], [1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15]]  # each prompt runs twice
    assert cost == (2 * 11 + 2 * 30) + (2 * 11 + 14 * 2) + 4 * 128  # < 2 * 11 + 16 * 30 + 2 * 128
    plan, cost = plan_shared_micro_batches(prompts, [2000] * 16, responses, token_budget=10**6)
    assert plan == [list(range(16))]  # long prompts: each runs once, the short answers padded
    assert cost == 2 * 1999 + 16 * 30 + 2 * 128


def test_models_that_cannot_run_it_say_why(model):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    assert unsupported_reason(model) is None
    sizes = dict(
        vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1,
    )  # fmt: skip
    sliding = Qwen2Config(**sizes, use_sliding_window=True, sliding_window=4, max_window_layers=0)
    assert "sliding-window" in unsupported_reason(Qwen2ForCausalLM(sliding))
    plain = Qwen2ForCausalLM(Qwen2Config(**sizes))
    assert unsupported_reason(plain) is None
    enable = getattr(plain, "activation_checkpointing_enable", None) or plain.gradient_checkpointing_enable
    enable()  # transformers 5 renamed it
    assert unsupported_reason(plain) == "gradient checkpointing is on"
    assert "no Hugging Face config" in unsupported_reason(torch.nn.Linear(2, 2))


def test_a_whole_micro_batch_shares_its_prompts_only_where_that_runs_fewer_tokens():
    from trine.models.shared_prompt import shared_pays

    long_prompt = list(range(3, 400))
    assert shared_pays([long_prompt] * 2, [5, 3])  # a DPO pair after a long prompt: 396 + 10 + 256 < 804 + 128
    assert not shared_pays([[5, 6, 7], [5, 6, 7]], [2, 4])  # a short prompt: the second forward costs more
    assert not shared_pays([long_prompt, long_prompt[1:]], [5, 3], mode="auto")  # nothing shared
    assert shared_pays([[5, 6, 7], [5, 6, 7]], [2, 4], mode=True)
    assert not shared_pays([[5], [5]], [2, 4], mode=True)  # a one-token prompt has no prefix to run
    assert not shared_pays([long_prompt] * 2, [5, 3], mode=False)
