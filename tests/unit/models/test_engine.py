"""HFEngine: logprob parity with the trainer, greedy = HF generate, stops, seeds, async batching."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from tests.helpers import assert_greedy_matches_hf_generate, prompts
from trine.models.batching import collate, forward_logprobs
from trine.models.engine import HFEngine
from trine.types import Experience, SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_engine_logprobs_match_the_trainers_recomputation(engine, model, tokenizer):
    settings = [
        SamplingParams(temperature=1.0, max_tokens=12, n=3),
        SamplingParams(temperature=0.7, top_p=0.9, max_tokens=10, n=2),
        SamplingParams(temperature=0.0, max_tokens=6, n=1),
    ]
    requests = [(p, s) for s in settings for p in prompts(tokenizer)]
    results = engine.generate_batch(requests)
    assert [len(r) for r in results] == [s.n for _, s in requests]
    experiences = []
    for (prompt, params), completions in zip(requests, results, strict=True):
        for c in completions:
            assert c.prompt_ids == prompt and len(c.logprobs) == len(c.response_ids) > 0
            experiences.append(
                Experience(
                    tokens=c.prompt_ids + c.response_ids,
                    prompt_length=len(c.prompt_ids),
                    action_mask=[1] * len(c.response_ids),
                    logprobs=c.logprobs,
                    info={"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p},
                )
            )
    assert len({len(e.tokens) for e in experiences}) > 3  # a ragged batch, lots of padding
    batch = collate(experiences, list(range(len(experiences))), tokenizer.pad_token_id, "cpu")
    with torch.no_grad():
        logprobs, _ = forward_logprobs(model, batch)
    mask = batch.action_mask.bool()
    assert int(mask.sum()) == sum(e.response_length for e in experiences)
    torch.testing.assert_close(logprobs[mask], batch.old_logprobs[mask], atol=1e-5, rtol=0)


def test_greedy_equals_hf_generate(engine, model, tokenizer):
    for prompt in prompts(tokenizer)[:2]:
        assert_greedy_matches_hf_generate(engine, model, tokenizer, prompt)


def test_top_k_one_equals_greedy_and_reports_the_truncated_logprob(engine, tokenizer):
    prompt = prompts(tokenizer)[1]
    (greedy,), (top1,) = engine.generate_batch(
        [
            (prompt, SamplingParams(temperature=0.0, max_tokens=10)),
            (prompt, SamplingParams(temperature=1.0, top_k=1, max_tokens=10)),
        ]
    )
    assert top1.response_ids == greedy.response_ids
    # logprobs are of the distribution sampled from: one token kept, log 1 = 0 (greedy reports log π)
    assert top1.logprobs == pytest.approx([0.0] * len(top1.logprobs), abs=1e-6)
    assert max(greedy.logprobs) < -1e-3


def test_max_tokens_and_finish_reasons(engine, tokenizer):
    prompt = prompts(tokenizer)[0]
    sampled = engine.generate_batch([(prompt, SamplingParams(temperature=1.0, max_tokens=7, n=30))])[0]
    for c in sampled:
        assert 1 <= len(c.response_ids) <= 7
        if c.finish_reason == "length":
            assert len(c.response_ids) == 7 and tokenizer.eos_token_id not in c.response_ids
        else:
            assert c.finish_reason == "stop" and c.response_ids[-1] == tokenizer.eos_token_id
            assert tokenizer.eos_token_id not in c.response_ids[:-1]
    (greedy,) = engine.generate_batch([(prompt, SamplingParams(temperature=0.0, max_tokens=12))])[0]
    assert greedy.finish_reason == "length" and len(greedy.response_ids) == 12
    # a stop token id ends the response at its first occurrence (the stop token is kept)
    stop_id = greedy.response_ids[3]
    first = greedy.response_ids.index(stop_id)
    (stopped,) = engine.generate_batch(
        [(prompt, SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[stop_id]))]
    )[0]
    assert stopped.finish_reason == "stop"
    assert stopped.response_ids == greedy.response_ids[: first + 1]


def _stop_string(tokenizer, tokens: list[int]) -> tuple[str, int]:
    """A printable piece of one token that does not occur in the text before it."""
    for i in range(1, len(tokens)):
        piece = tokenizer.decode([tokens[i]]).strip()
        if piece and "\ufffd" not in piece and piece not in tokenizer.decode(tokens[:i]):
            return piece, i
    raise AssertionError(f"no usable stop string in {tokens}")


def test_stop_strings_stop_generation(engine, tokenizer):
    found = None
    for prompt in prompts(tokenizer):
        (greedy,) = engine.generate_batch([(prompt, SamplingParams(temperature=0.0, max_tokens=12))])[0]
        try:
            found = (prompt, greedy, *_stop_string(tokenizer, greedy.response_ids))
            break
        except AssertionError:
            continue
    assert found is not None, "no greedy response with a usable stop string"
    prompt, greedy, stop, index = found
    (stopped,) = engine.generate_batch(
        [(prompt, SamplingParams(temperature=0.0, max_tokens=12, stop=[stop]))]
    )[0]
    assert stopped.finish_reason == "stop"
    assert stopped.response_ids == greedy.response_ids[: index + 1]
    assert stop in stopped.text and stop not in tokenizer.decode(stopped.response_ids[:-1])


def test_seeds_make_sampling_reproducible(model, tokenizer):
    prompt = prompts(tokenizer)[2]
    engine = HFEngine(model, tokenizer, seed=0)

    def sample(seed: int | None) -> list[list[int]]:
        params = SamplingParams(temperature=1.0, max_tokens=8, n=3, seed=seed)
        return [c.response_ids for c in engine.generate_batch([(prompt, params)])[0]]

    first = sample(123)
    sample(None)  # advances the engine's own generator; seeded requests do not depend on it
    assert sample(123) == first
    assert sample(124) != first
    assert len({tuple(r) for r in first}) == 3  # the n samples of one seeded request differ
    # the engine's own stream is reproducible from its seed
    again = HFEngine(model, tokenizer, seed=0)
    params = SamplingParams(temperature=1.0, max_tokens=8, n=2)
    a = [c.response_ids for c in HFEngine(model, tokenizer, seed=5).generate_batch([(prompt, params)])[0]]
    b = [c.response_ids for c in again.generate_batch([(prompt, params)])[0]]
    c = [c.response_ids for c in HFEngine(model, tokenizer, seed=0).generate_batch([(prompt, params)])[0]]
    assert b == c and a != b
    for e in (engine, again):
        e.close()


def test_seeded_block_is_reproducible_and_leaves_the_stream_where_it_was(model, tokenizer):
    from trine.models import ENGINES, RolloutModel

    prompt = prompts(tokenizer)[1]
    params = SamplingParams(temperature=1.0, max_tokens=8, n=4)

    def sample(engine) -> list[list[int]]:
        return [c.response_ids for c in engine.generate_batch([(prompt, params)])[0]]

    plain, evaluated = HFEngine(model, tokenizer, seed=0), ENGINES["hf"](model, tokenizer, seed=0)
    assert isinstance(evaluated, RolloutModel)
    with evaluated.seeded(7):
        inside = sample(evaluated)
    with evaluated.seeded(7):
        assert sample(evaluated) == inside  # the same seed, the same samples
    assert sample(evaluated) == sample(plain)  # the training stream did not move
    for e in (plain, evaluated):
        e.close()


def test_concurrent_chats_are_batched(model, tokenizer):
    engine = HFEngine(model, tokenizer, seed=0, max_batch_size=16)
    batches: list[int] = []
    generate_batch = engine.generate_batch

    def counting(requests):
        batches.append(len(requests))
        return generate_batch(requests)

    engine.generate_batch = counting
    chats = [[{"role": "user", "content": f"question number {i}" + "!" * i}] for i in range(20)]
    params = SamplingParams(temperature=1.0, max_tokens=4, n=2)

    async def main():
        return await asyncio.gather(*(engine.chat(chat, params) for chat in chats))

    results = asyncio.run(main())
    engine.close()
    assert len(results) == 20
    for chat, completions in zip(chats, results, strict=True):
        assert len(completions) == 2
        assert all(c.prompt_ids == engine.encode_chat(chat) for c in completions)
    assert sum(batches) == 20
    assert 1 < len(batches) < 20  # batched, and split to respect max_batch_size (16 rows = 8 requests)
    assert max(batches) <= 8, batches


def test_generate_rejects_an_empty_prompt_and_keeps_training_mode(engine, model):
    with pytest.raises(ValueError, match="empty prompt"):
        asyncio.run(engine.generate([], SamplingParams()))
    model.train()
    try:
        engine.generate_batch([([1, 2, 3], SamplingParams(max_tokens=2))])
        assert model.training
    finally:
        model.eval()


def test_call_runs_torch_work_on_the_one_engine_thread(engine, tokenizer):
    import threading

    main = threading.get_ident()
    worker = engine.call(threading.get_ident)
    assert worker != main
    assert engine.call(threading.current_thread).name.startswith("trine-engine")
    # nested calls from the worker run inline (no deadlock); errors reach the caller
    assert engine.call(lambda: engine.call(threading.get_ident)) == worker
    with pytest.raises(ZeroDivisionError):
        engine.call(lambda: 1 / 0)
    # the sync sampling API runs on the worker too, whoever calls it
    seen = []
    original = engine._sample
    engine._sample = lambda reqs: seen.append(threading.get_ident()) or original(reqs)
    try:
        engine.generate_batch([(prompts(tokenizer)[0], SamplingParams(max_tokens=2))])
    finally:
        del engine._sample
    assert seen == [worker]


@pytest.mark.parametrize("partial", [True, False])
def test_partial_rollout_goes_on_under_new_weights_loaded_between_two_tokens(partial, model, tokenizer):
    import copy
    import threading
    import time

    from trine.models.batching import response_logprobs

    newer = copy.deepcopy(model)
    with torch.no_grad():
        gen = torch.Generator().manual_seed(1)
        for p in newer.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    engine = HFEngine(copy.deepcopy(model), tokenizer, seed=0, partial_rollout=partial)
    params = SamplingParams(temperature=1.0, max_tokens=96, n=2, ignore_eos=True)
    out: dict = {}
    sampler = threading.Thread(
        target=lambda: out.update(c=engine.generate_batch([(p, params) for p in prompts(tokenizer)[:2]]))
    )
    sampler.start()
    while not (engine._decoding if partial else sampler.is_alive()):
        time.sleep(0.001)
    time.sleep(0.02)
    engine.load_weights(newer.state_dict(), version=1)  # returns between two tokens (partial), or after
    loaded_while_sampling = sampler.is_alive()
    sampler.join()
    engine.close()
    completions = [c for cs in out["c"] for c in cs]
    assert engine.policy_version == 1
    if not partial:  # the load waited for the generation: every token from the old weights
        assert all(c.token_versions is None and c.policy_version == 0 for c in completions)
        return
    assert loaded_while_sampling  # it returned between two tokens, the generation went on
    pad = tokenizer.pad_token_id
    for c in completions:
        versions = c.token_versions
        assert versions is not None and len(versions) == len(c.response_ids) == 96
        assert versions[0] == 0 and versions[-1] == 1 and versions == sorted(versions)
        pair = [(c.prompt_ids, c.response_ids)]
        by_version = {
            v: torch.tensor(response_logprobs(m.eval(), pair, pad_id=pad)[0])
            for v, m in ((0, model), (1, newer))
        }
        got = torch.tensor(c.logprobs)
        for v in (0, 1):
            sel = torch.tensor(versions) == v
            assert torch.allclose(got[sel], by_version[v][sel], atol=1e-4)  # sampled with those weights
        later = torch.tensor(versions) == 1
        assert (by_version[0][later] - by_version[1][later]).abs().max() > 1e-2  # and they do differ


def test_sampling_passes_the_kv_cache_under_the_name_transformers_takes(engine, model, tokenizer):
    """No FutureWarning from transformers (``past_key_values`` renamed ``cache``) while sampling: the
    engine passes the cache under the name the model's forward declares; older signatures keep the old name."""
    import inspect
    import warnings

    from trine.models.kv_cache import cache_kwargs

    name = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    assert list(cache_kwargs(model, object())) == [name]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine.generate_batch(
            [(p, SamplingParams(temperature=1.0, max_tokens=5, n=2)) for p in prompts(tokenizer)]
        )
    assert not [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]

    class OldForward(torch.nn.Module):  # a remote-code model or an older transformers release
        def forward(self, input_ids=None, past_key_values=None, use_cache=None):
            return None

    class Wrapped:  # PEFT forwards keywords to its base model
        def get_base_model(self):
            return OldForward()

    assert list(cache_kwargs(OldForward(), 1)) == ["past_key_values"]
    assert list(cache_kwargs(Wrapped(), 1)) == ["past_key_values"]


def test_close_ends_the_worker_thread(model, tokenizer):
    """A run's stages close their engines; the worker thread used to outlive every run (issue 25 item 12)."""
    engine = HFEngine(model, tokenizer, seed=0)
    engine.generate_batch([([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=2))])
    worker = [t for t in threading.enumerate() if t.ident == engine._worker_thread]
    assert len(worker) == 1 and worker[0].is_alive()
    engine.close()
    assert not worker[0].is_alive()
