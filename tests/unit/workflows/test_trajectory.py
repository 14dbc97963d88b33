"""Trajectory: token-in token-out multi-turn conversations with a real engine and a real chat template."""

from __future__ import annotations

import pytest
import torch

from trine.models.batching import collate, forward_logprobs
from trine.models.engine import HFEngine
from trine.types import Completion, SamplingParams
from trine.workflows.trajectory import STATUSES, ChatDelta, Trajectory

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 12 times 34?"}]


def _completion(tokenizer, traj: Trajectory, text: str, eos: bool = True) -> Completion:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    ids += [tokenizer.convert_tokens_to_ids("<|im_end|>")] if eos else []
    return Completion(list(traj.tokens), ids, [-0.5] * len(ids), text, "stop" if eos else "length", 0)


def test_three_turns_with_a_real_engine_keep_every_sampled_token_and_logprob(model, tokenizer):
    engine = HFEngine(model, tokenizer, seed=0)
    traj = Trajectory(tokenizer, CHAT)
    params = SamplingParams(temperature=1.0, max_tokens=12)
    sampled = []
    for turn in range(3):
        (completion,) = engine.generate_batch([(traj.tokens, params)])[0]
        assert completion.prompt_ids == traj.tokens  # the context is exactly the tokens so far
        traj.add_completion(completion)
        sampled.append(completion)
        if turn < 2:
            assert traj.add_messages([{"role": "user", "content": f"Observation {turn}: higher."}])
    engine.close()
    assert [t.end - t.start for t in traj.turns] == [len(c.response_ids) for c in sampled]
    for turn, c in zip(traj.turns, sampled):
        assert traj.tokens[turn.start : turn.end] == c.response_ids  # never re-tokenized
    # the one concatenated experience: the trainer's logprobs of the sampled tokens = the engine's
    exp = traj.experience(1.0)
    exp.check()
    batch = collate([exp], [0], tokenizer.pad_token_id, "cpu")
    with torch.no_grad():
        logprobs, _ = forward_logprobs(model.eval(), batch)
    mask = torch.tensor(exp.action_mask, dtype=torch.bool)
    got = logprobs[0, -exp.response_length :][mask]
    assert torch.allclose(got, torch.tensor(exp.logprobs)[mask], atol=1e-4)
    assert sum(exp.action_mask) == sum(len(c.response_ids) for c in sampled)
    assert all(lp == 0.0 for lp, m in zip(exp.logprobs, exp.action_mask) if m == 0)
    # one experience per turn: each turn's prompt is exactly everything before it
    turns = traj.turn_experiences(1.0)
    assert [e.step for e in turns] == [0, 1, 2] and len({e.run_id for e in turns}) == 1
    for e, c in zip(turns, sampled):
        assert e.response_tokens == c.response_ids and e.tokens[: e.prompt_length] == c.prompt_ids


def test_the_tokens_render_the_chat_the_template_renders(tokenizer):
    traj = Trajectory(tokenizer, CHAT)
    traj.add_completion(_completion(tokenizer, traj, "Is it 400?"))
    traj.add_messages([{"role": "user", "content": "Higher."}])
    traj.add_completion(_completion(tokenizer, traj, "408"))
    text = tokenizer.apply_chat_template(traj.messages, tokenize=False, add_generation_prompt=False)
    assert tokenizer.decode(traj.tokens) + "\n" == text  # up to the closing newline of the last turn
    masked = [t for t, m in zip(traj.tokens[traj.prompt_length :], traj.mask) if m == 0]
    assert tokenizer.decode(masked) == "\n<|im_start|>user\nHigher.<|im_end|>\n<|im_start|>assistant\n"


def test_a_turn_cut_by_the_length_limit_gets_the_templates_closing(tokenizer):
    traj = Trajectory(tokenizer, CHAT)
    traj.add_completion(_completion(tokenizer, traj, "Let me think", eos=False))
    traj.add_messages([{"role": "user", "content": "Go on."}])
    observation = [t for t, m in zip(traj.tokens[traj.prompt_length :], traj.mask) if m == 0]
    assert tokenizer.decode(observation).startswith("<|im_end|>\n<|im_start|>user\nGo on.")


def test_tool_messages_and_specs_render_through_the_template(tokenizer):
    tools = [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object"}}}]
    traj = Trajectory(tokenizer, CHAT, tools=tools)
    assert "<tools>" in tokenizer.decode(traj.tokens[: traj.prompt_length])
    traj.add_completion(_completion(tokenizer, traj, '<tool_call>{"name": "multiply"}</tool_call>'))
    traj.add_messages([{"role": "tool", "name": "multiply", "content": "408"}])
    assert tokenizer.decode(traj.tokens).endswith("<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n")


def test_the_token_budget_ends_the_episode_as_truncated_never_raises(tokenizer):
    traj = Trajectory(tokenizer, CHAT, max_tokens=60)
    room = traj.room()
    assert 0 < room < 60
    traj.add_completion(_completion(tokenizer, traj, "ok"))
    assert not traj.add_messages([{"role": "user", "content": "word " * 80}])
    assert traj.status == "truncated" and "does not fit max_tokens=60" in traj.reason
    exp = traj.experience(0.0)
    exp.check()
    assert exp.status == "truncated" and exp.info["turns"] == 1
    short = Trajectory(tokenizer, CHAT, max_tokens=5)
    assert short.status == "truncated" and "opening prompt" in short.reason
    with pytest.raises(ValueError, match="expected one of"):
        traj.end("bad")  # type: ignore[arg-type]
    assert "reward_error" in STATUSES


def test_partial_rollout_versions_are_kept_per_token(tokenizer):
    traj = Trajectory(tokenizer, CHAT)
    first = _completion(tokenizer, traj, "Is it 400?")
    first.token_versions = [3] + [4] * (len(first.response_ids) - 1)
    first.policy_version = 3
    traj.add_completion(first)
    traj.add_messages([{"role": "user", "content": "Higher."}])
    second = _completion(tokenizer, traj, "408")
    second.policy_version = 5
    traj.add_completion(second)
    exp = traj.experience(1.0)
    versions = exp.info["token_versions"]
    assert len(versions) == exp.response_length and versions[0] == 3 and versions[-1] == 5


def test_a_template_that_rewrites_history_is_refused_with_the_reason(tokenizer):
    class Rewriting:  # renders only the last message: no conversation is a prefix of its continuation
        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False, **kw):
            return messages[-1]["content"] + ("<gen>" if add_generation_prompt else "")

    with pytest.raises(ValueError, match="prefix-consistent template"):
        ChatDelta(Rewriting())
