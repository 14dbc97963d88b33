"""Chat encoding for supervised data: prompt + response, and whole chats masked to assistant turns."""

from __future__ import annotations

import pytest

from trine.models import load_tokenizer
from trine.models.chat import encode_conversation, encode_prompt, encode_sft


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def test_sft_row_is_the_generation_prompt_then_the_response_and_eos(tokenizer):
    chat = [{"role": "user", "content": "3+5="}]
    tokens, prompt_length = encode_sft(tokenizer, chat, "8")
    assert tokens[:prompt_length] == encode_prompt(tokenizer, chat)
    assert tokenizer.decode(tokens[prompt_length:]) == "8<|im_end|>"


def test_conversation_trains_on_assistant_turns_only(tokenizer):
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1+1="},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "and 2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    tokens, prompt_length, mask = encode_conversation(tokenizer, chat)
    assert len(mask) == len(tokens) - prompt_length
    # the prompt is exactly what the model sees before its first answer
    assert tokens[:prompt_length] == encode_prompt(tokenizer, chat[:2])
    response = tokens[prompt_length:]
    trained = tokenizer.decode([t for t, m in zip(response, mask) if m])
    untrained = tokenizer.decode([t for t, m in zip(response, mask) if not m])
    assert trained == "2<|im_end|>\n4<|im_end|>\n"
    assert "and 2+2?" in untrained and "<|im_start|>assistant" in untrained
    # the whole chat survives: rendering equals the template's own text
    assert tokenizer.decode(tokens) == tokenizer.apply_chat_template(chat, tokenize=False)


def test_a_chat_without_an_assistant_turn_is_refused(tokenizer):
    with pytest.raises(ValueError, match="at least one assistant message"):
        encode_conversation(tokenizer, [{"role": "user", "content": "hi"}])
