"""Supervised and preference rows made from tasks (``trine.tasks.supervised``): what ``mode: train``
and MIX's expert rows train on."""

from __future__ import annotations

import pytest

from trine.models.chat import encode_sft
from trine.tasks.supervised import preference_experiences, sft_experiences
from trine.types import Task


def test_sft_rows_train_on_the_answer_or_the_response_key(tokenizer):
    task = Task("t0", "3+5=", answer="8", raw={"solution": "eight"})
    (row,) = sft_experiences([task], tokenizer, response_key=None)
    tokens, prompt_length = encode_sft(tokenizer, task.messages(), "8")
    assert (row.tokens, row.prompt_length, row.kind, row.task_id) == (tokens, prompt_length, "sft", "t0")
    assert row.action_mask == [1] * (len(tokens) - prompt_length) and row.info == {"expert": True}
    (keyed,) = sft_experiences([task], tokenizer, response_key="solution")
    assert tokenizer.decode(keyed.response_tokens) == "eight<|im_end|>"


def test_sft_row_of_a_whole_chat_masks_the_user_turns(tokenizer):
    chat = [
        {"role": "user", "content": "1+1="},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "and 2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    (row,) = sft_experiences([Task("c", chat)], tokenizer, response_key=None)
    assert 0 in row.action_mask and len(row.action_mask) == row.response_length


def test_sft_row_without_a_target_names_the_task_and_the_fix(tokenizer):
    with pytest.raises(ValueError, match="task t1 has no target response.*tasks.train.response_key"):
        sft_experiences([Task("t1", "3+5=", raw={})], tokenizer, response_key="solution")


def test_preference_rows_come_in_chosen_then_rejected_pairs(tokenizer):
    task = Task("p", "3+5=", raw={"chosen": "8", "rejected": "9"})
    chosen, rejected = preference_experiences([task], tokenizer, "chosen", "rejected")
    assert [chosen.info, rejected.info] == [{"chosen": True}, {"chosen": False}]
    assert chosen.group_id == rejected.group_id == "pair:p" and chosen.kind == "preference"
    assert tokenizer.decode(rejected.response_tokens) == "9<|im_end|>"
    with pytest.raises(ValueError, match=r"task q has no 'rejected' field.*found: \['chosen'\]"):
        preference_experiences([Task("q", "1+1=", raw={"chosen": "2"})], tokenizer, "chosen", "rejected")
