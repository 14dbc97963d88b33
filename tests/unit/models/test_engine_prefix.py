"""HFEngine prefix KV reuse: continuations start from a finished sequence's KV and sample as from scratch."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.helpers import QUESTIONS, prompts
from trine.models.batching import collate, forward_logprobs
from trine.models.engine import HFEngine
from trine.models.prefix_cache import PrefixCache
from trine.types import Completion, Experience, SamplingParams
from trine.workflows.trajectory import Trajectory

pytestmark = pytest.mark.usefixtures("one_torch_thread")

OBSERVATION = [{"role": "user", "content": "Higher. Guess again."}]


def assert_logprobs_match_recomputation(model, tokenizer, completions: list[Completion]) -> None:
    """The engine's logprobs are the trainer's recomputation over the full sequences (fp32: 1e-5)."""
    experiences = [
        Experience(
            tokens=c.prompt_ids + c.response_ids,
            prompt_length=len(c.prompt_ids),
            action_mask=[1] * len(c.response_ids),
            logprobs=c.logprobs,
        )
        for c in completions
    ]
    batch = collate(experiences, list(range(len(experiences))), tokenizer.pad_token_id, "cpu")
    with torch.no_grad():
        logprobs, _ = forward_logprobs(model, batch)
    mask = batch.action_mask.bool()
    torch.testing.assert_close(logprobs[mask], batch.old_logprobs[mask], atol=1e-5, rtol=0)


def continue_(tokenizer, completion: Completion, text: str = " and then") -> list[int]:
    """The next prompt a multi-turn workflow sends: the previous tokens plus new ones."""
    return completion.prompt_ids + completion.response_ids + tokenizer(text)["input_ids"]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_continuations_reuse_the_prefix_and_match_recomputation(attn, model, tokenizer):
    model = copy.deepcopy(model)
    model.set_attn_implementation(attn)
    engine = HFEngine(model, tokenizer, seed=0)
    params = SamplingParams(temperature=1.0, max_tokens=10)
    first = [c for (c,) in engine.generate_batch([(p, params) for p in prompts(tokenizer)])]
    store = engine.prefix_cache
    assert store is not None and len(store) == 4 and store.hits == 0
    # stored: prompt + every sampled token but the last (never fed back to the model)
    assert store.tokens == sum(len(c.prompt_ids) + len(c.response_ids) - 1 for c in first)
    second = engine.generate_batch([(continue_(tokenizer, c), params) for c in first])
    assert store.hits == 4 and store.reused_tokens == store.tokens - sum(
        len(c.prompt_ids) + len(c.response_ids) - 1 for (c,) in second
    )
    assert_logprobs_match_recomputation(model, tokenizer, first + [c for (c,) in second])
    engine.close()


def test_a_mixed_batch_of_cached_and_fresh_rows_samples_as_without_the_cache(model, tokenizer):
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    sampled = SamplingParams(temperature=1.0, max_tokens=12, n=3)
    cached, plain = (
        HFEngine(model, tokenizer, seed=0),
        HFEngine(model, tokenizer, seed=0, prefix_cache_tokens=0),
    )
    assert plain.prefix_cache is None
    firsts = [c for (c,) in cached.generate_batch([(p, greedy) for p in prompts(tokenizer)[:2]])]
    # rows with a cached prefix (of different lengths) and rows without, ragged, n > 1 on a cached prompt
    requests = [
        (continue_(tokenizer, firsts[0]), greedy),
        (prompts(tokenizer)[2], greedy),
        (continue_(tokenizer, firsts[1], " so the answer is"), greedy),
        (continue_(tokenizer, firsts[0], " x"), sampled),
        (prompts(tokenizer)[3], sampled),
    ]
    got = cached.generate_batch(requests)
    assert cached.prefix_cache.hits == 3
    want = plain.generate_batch(requests)
    # same tokens (greedy rows exactly; sampled rows draw the same generator stream)
    assert [[c.response_ids for c in cs] for cs in got] == [[c.response_ids for c in cs] for cs in want]
    for g, w in zip([c for cs in got for c in cs], [c for cs in want for c in cs], strict=True):
        assert g.logprobs == pytest.approx(w.logprobs, abs=1e-5)
    assert_logprobs_match_recomputation(model, tokenizer, [c for cs in got for c in cs])
    cached.close()
    plain.close()


def test_new_weights_empty_the_cache(model, tokenizer):
    engine = HFEngine(copy.deepcopy(model), tokenizer, seed=0)
    params = SamplingParams(temperature=1.0, max_tokens=6)
    (first,) = engine.generate_batch([(prompts(tokenizer)[1], params)])[0]
    assert len(engine.prefix_cache) == 1
    newer = copy.deepcopy(model)
    with torch.no_grad():
        for p in newer.parameters():
            p.mul_(1.1)
    engine.load_weights(newer.state_dict(), version=1)
    assert len(engine.prefix_cache) == 0
    # weights changed in place without load_weights (a colocated trainer's step): not reused either
    (second,) = engine.generate_batch([(continue_(tokenizer, first), params)])[0]
    with torch.no_grad():
        next(engine.model.parameters()).mul_(0.9)
    (third,) = engine.generate_batch([(continue_(tokenizer, second), params)])[0]
    assert engine.prefix_cache.hits == 0 and len(engine.prefix_cache) == 1
    assert_logprobs_match_recomputation(engine.model, tokenizer, [third])
    engine.close()


def test_the_token_budget_evicts_least_recently_used_entries():
    store = PrefixCache(max_tokens=10)
    kv = [torch.zeros(1, 4, 2)]
    for start in (0, 100, 200):
        store.put(list(range(start, start + 4)), kv, kv)
    assert store.tokens == 8 and len(store) == 2  # the third 4-token entry pushed out the first
    assert store.match([0, 1, 2, 3, 9]) is None
    assert store.match([100, 101, 102, 103, 9]) is not None  # now the most recently used
    store.put([300, 301, 302, 303], kv, kv)
    assert store.match([200, 201, 202, 203, 9]) is None and store.match([300, 301, 302, 303, 4]) is not None
    assert store.match([100, 101, 102, 103]) is None  # a prompt must extend the entry by a token
    store.put(list(range(11)), kv, kv)  # longer than the whole budget: not kept
    assert store.tokens == 8
    with pytest.raises(ValueError, match="prefix_cache_tokens=-1"):
        PrefixCache(-1)


def test_the_engine_keeps_within_its_budget_and_seeded_evaluation_is_left_alone(model, tokenizer):
    engine = HFEngine(model, tokenizer, seed=0, prefix_cache_tokens=40)
    params = SamplingParams(temperature=1.0, max_tokens=16, n=4, ignore_eos=True)
    done = engine.generate_batch([(p, params) for p in prompts(tokenizer)])
    store = engine.prefix_cache
    assert 0 < store.tokens <= 40 and len(store) < 16
    longest = max((c for cs in done for c in cs), key=lambda c: len(c.prompt_ids))
    with engine.seeded(7):
        engine.generate_batch([(continue_(tokenizer, longest), params)])
    assert store.hits == 0 and store.tokens <= 40
    engine.close()


def test_a_three_turn_trajectory_samples_the_same_with_and_without_the_cache(model, tokenizer):
    params = SamplingParams(temperature=1.0, max_tokens=12)
    runs = {}
    for budget in (0, 4096):
        engine = HFEngine(model, tokenizer, seed=3, prefix_cache_tokens=budget)
        trajectories = [Trajectory(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS[:3]]
        for turn in range(3):
            done = engine.generate_batch([(t.tokens, params) for t in trajectories])
            for t, (c,) in zip(trajectories, done, strict=True):
                t.add_completion(c, engine.policy_version)
                if turn < 2:
                    assert t.add_messages(OBSERVATION)
        runs[budget] = trajectories
        if budget:
            assert engine.prefix_cache.hits == 6
        engine.close()
    for plain, cached in zip(runs[0], runs[4096], strict=True):
        assert cached.tokens == plain.tokens
        assert cached.logprobs == pytest.approx(plain.logprobs, abs=1e-5)
    exps = [t.experience(reward=0.0) for t in runs[4096]]
    batch = collate(exps, list(range(len(exps))), tokenizer.pad_token_id, "cpu")
    with torch.no_grad():
        logprobs, _ = forward_logprobs(model, batch)
    mask = batch.action_mask.bool()
    torch.testing.assert_close(logprobs[mask], batch.old_logprobs[mask], atol=1e-5, rtol=0)


def test_weights_loaded_between_two_tokens_leave_no_stale_prefix(model, tokenizer):
    import threading
    import time

    newer = copy.deepcopy(model)
    with torch.no_grad():
        for p in newer.parameters():
            p.mul_(1.1)
    engine = HFEngine(copy.deepcopy(model), tokenizer, seed=0, partial_rollout=True)
    params = SamplingParams(temperature=1.0, max_tokens=64, ignore_eos=True)
    out: dict = {}
    sampler = threading.Thread(
        target=lambda: out.update(c=engine.generate_batch([(prompts(tokenizer)[1], params)]))
    )
    sampler.start()
    while not engine._decoding:
        time.sleep(0.001)
    engine.load_weights(newer.state_dict(), version=1)  # between two tokens: the row is re-prefilled
    sampler.join()
    ((done,),) = out["c"]
    assert done.token_versions is not None and len(engine.prefix_cache) == 0  # nothing kept from that run
    (after,) = engine.generate_batch([(continue_(tokenizer, done), params.replace(max_tokens=6))])[0]
    assert engine.prefix_cache.hits == 0
    assert_logprobs_match_recomputation(newer, tokenizer, [after])
    engine.close()
