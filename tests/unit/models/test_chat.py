"""Chat encoding for supervised data: prompt + response, and whole chats masked to assistant turns."""

from __future__ import annotations

import pytest

from trine.models import load_tokenizer
from trine.models.chat import decode_messages, encode_conversation, encode_prompt, encode_sft, readable_prompt


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


def test_a_chat_templated_prompt_decodes_to_its_messages_without_markup(tokenizer):
    """ChatML (the tiny models' template): the special tokens split the prompt into role + content;
    the generation prompt (an empty assistant turn) is left out."""
    chat = [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "What is 2+3?\nThink first."},
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": "And 2+4?"},
    ]
    ids = encode_prompt(tokenizer, chat)
    assert "<|im_start|>" in tokenizer.decode(ids)  # what annotators used to see
    assert decode_messages(tokenizer, ids) == chat
    text, messages = readable_prompt(tokenizer, ids)
    assert messages == chat and "<|im" not in text
    assert (
        text
        == "system: Answer with a number.\n\nuser: What is 2+3?\nThink first.\n\nassistant: 5\n\nuser: And 2+4?"
    )
    lone = encode_prompt(tokenizer, [{"role": "user", "content": "7+8="}])
    assert readable_prompt(tokenizer, lone) == ("7+8=", [{"role": "user", "content": "7+8="}])


def test_a_llama3_style_template_and_plain_text(tokenizer, tmp_path):
    """A template whose role sits alone between header tokens (Llama 3); text with no chat template
    is no conversation: it is shown decoded, special tokens left out."""
    import shutil

    tok = load_tokenizer(shutil.copytree(tokenizer.name_or_path, tmp_path / "tok"))
    tok.add_special_tokens(
        {"additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]}
    )
    tok.chat_template = (
        "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
        "{{ m['content'] }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    )
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    ids = encode_prompt(tok, chat)
    assert "<|start_header_id|>" in tok.decode(ids)
    assert decode_messages(tok, ids) == chat
    plain = tok("1+1=", add_special_tokens=False)["input_ids"]
    assert decode_messages(tok, plain) is None
    assert readable_prompt(tok, plain + [tok.convert_tokens_to_ids("<|eot_id|>")]) == ("1+1=", None)
