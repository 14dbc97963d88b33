"""The tiny-model builder and the model/tokenizer loading path."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from trine.models import PRESETS, init_model, load_model, load_tokenizer
from trine.models.loading import resolve_dtype
from trine.models.tiny import (
    CHAT_TEMPLATE,
    build_tokenizer,
    count_parameters,
    estimate_parameters,
)

TEXTS = [
    "Hello world, this is a test.",
    "  leading spaces, double  spaces and trailing   ",
    "line one\nline two\n\n\tindented with a tab\r\n",
    "3+5=8 and 12*7=84; 1000000 - 1 = 999999",
    "Café naïve déjà vu — ÉÀÇ",
    "中文测试：你好，世界！",
    "emoji 🙂🚀 and flags 🇫🇷 and ZWJ 👩‍💻",
    "def f(x):\n    return {'a': [1, 2]}  # comment",
    "<|im_start|>user\nhi<|im_end|>\n",
]


@pytest.mark.parametrize("text", TEXTS)
def test_text_round_trips_after_reload(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def test_reloaded_tokenizer_matches_the_built_one(tiny_model_dir, tokenizer):
    built = build_tokenizer(PRESETS["tiny-0.5m"]["vocab_size"], seed=0)
    for text in TEXTS:
        assert tokenizer.encode(text) == built.encode(text)
    assert len(tokenizer) == len(built) == PRESETS["tiny-0.5m"]["vocab_size"]
    assert load_tokenizer(tiny_model_dir).encode(TEXTS[1]) == built.encode(TEXTS[1])


def test_digits_are_single_tokens(tokenizer):
    ids = tokenizer.encode("9876543210", add_special_tokens=False)
    assert [tokenizer.decode([i]) for i in ids] == list("9876543210")
    for digit in "0123456789":
        assert len(tokenizer.encode(digit, add_special_tokens=False)) == 1


def test_no_special_tokens_are_added_to_plain_text(tokenizer):
    assert tokenizer.encode("abc") == tokenizer.encode("abc", add_special_tokens=False)


def test_chat_template_renders_chatml(tokenizer):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    text = tokenizer.apply_chat_template(chat, tokenize=False)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
    prompt = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert prompt == text + "<|im_start|>assistant\n"
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3
    assert ids.count(tokenizer.eos_token_id) == 2
    assert tokenizer.chat_template == CHAT_TEMPLATE


def test_special_tokens_pad_differs_from_eos(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    assert tokenizer.decode(tokenizer.encode("<|im_start|>a<|im_end|>"), skip_special_tokens=True) == "a"


def test_model_config_and_generation_config_match_tokenizer(tiny_model_dir, tokenizer):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    generation = json.loads((tiny_model_dir / "generation_config.json").read_text())
    for cfg in (config, generation):
        assert cfg["eos_token_id"] == tokenizer.eos_token_id
        assert cfg["pad_token_id"] == tokenizer.pad_token_id
    assert config["model_type"] == "qwen2"
    assert config["tie_word_embeddings"] is True
    assert config["max_position_embeddings"] >= 1024
    assert (tiny_model_dir / "model.safetensors").is_file()


def test_model_reloads_and_runs(tiny_model_dir, tokenizer):
    model = load_model(tiny_model_dir)
    assert isinstance(model, Qwen2ForCausalLM) and not model.training
    assert model.dtype == torch.float32
    n = count_parameters(model)
    assert n == estimate_parameters(**PRESETS["tiny-0.5m"])
    assert 0.4e6 < n < 0.6e6
    ids = torch.tensor([tokenizer.encode("1+1=2")])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert torch.equal(plain.model.embed_tokens.weight, model.model.embed_tokens.weight)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_parameter_count_is_near_the_preset_name(preset):
    hparams = PRESETS[preset]
    target = float(preset.removeprefix("tiny-").removesuffix("m")) * 1e6
    config = Qwen2Config(**hparams, tie_word_embeddings=True)
    with torch.device("meta"):
        model = Qwen2ForCausalLM(config)
    assert count_parameters(model) == estimate_parameters(**hparams)
    assert abs(count_parameters(model) - target) / target < 0.1
    assert hparams["hidden_size"] // hparams["num_attention_heads"] >= 16
    assert hparams["max_position_embeddings"] >= 1024


@pytest.mark.parametrize("vocab_size", sorted({p["vocab_size"] for p in PRESETS.values()}))
def test_tokenizer_fills_each_preset_vocab(vocab_size):
    assert len(build_tokenizer(vocab_size)) == vocab_size


def test_same_seed_same_weights_other_seed_differs(tmp_path, tiny_model_dir):
    again = load_model(init_model("tiny-0.5m", tmp_path / "same", seed=0))
    other = load_model(init_model("tiny-0.5m", tmp_path / "other", seed=1))
    base = load_model(tiny_model_dir)
    weight = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(again.state_dict()[weight], base.state_dict()[weight])
    assert not torch.equal(other.state_dict()[weight], base.state_dict()[weight])


def test_unknown_preset_lists_valid_ones(tmp_path):
    with pytest.raises(ValueError, match="tiny-1m") as info:
        init_model("tiny-2m", tmp_path / "m")
    assert "tiny-2m" in str(info.value)
    assert not (tmp_path / "m").exists()


def test_existing_dir_needs_overwrite(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="overwrite"):
        init_model("tiny-0.5m", out)
    assert (out / "notes.txt").read_text() == "keep me"
    init_model("tiny-0.5m", out, overwrite=True)
    assert not (out / "notes.txt").exists()
    assert (out / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no temp dirs left behind


def test_empty_existing_dir_is_filled(tmp_path):
    out = tmp_path / "empty"
    out.mkdir()
    assert init_model("tiny-0.5m", out) == out.resolve()
    assert json.loads((out / "trine_model.json").read_text())["preset"] == "tiny-0.5m"


@pytest.mark.parametrize("loader", [load_model, load_tokenizer])
def test_missing_path_suggests_init_model(tmp_path, loader):
    missing = tmp_path / "does-not-exist"
    with pytest.raises(FileNotFoundError, match="trine init-model") as info:
        loader(missing)
    assert str(missing) in str(info.value)
    with pytest.raises(FileNotFoundError, match="trine init-model"):
        loader(tmp_path)  # a directory, but no model in it


def test_missing_pad_token_falls_back_to_eos(tmp_path, tiny_model_dir):
    copy = shutil.copytree(tiny_model_dir, tmp_path / "nopad")
    config_path = copy / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["pad_token"] = None
    config_path.write_text(json.dumps(config))
    with pytest.warns(UserWarning, match="no pad token"):
        tokenizer = load_tokenizer(copy)
    assert tokenizer.pad_token == tokenizer.eos_token == "<|im_end|>"


def test_resolve_dtype():
    assert resolve_dtype("float32") is torch.float32
    assert resolve_dtype("bf16") is torch.bfloat16
    assert resolve_dtype("float16") is torch.float16
    assert resolve_dtype(torch.bfloat16) is torch.bfloat16
    assert resolve_dtype("auto", device="cpu") is torch.float32
    with pytest.raises(ValueError, match="bfloat16"):
        resolve_dtype("float8")


def test_importing_trine_models_is_light():
    code = (
        "import sys; import trine.models, trine.models.tiny; "
        "assert trine.models.tiny.PRESETS; "
        "heavy = {'torch', 'transformers', 'tokenizers'} & set(sys.modules); "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_init_model_builds_a_preset_that_a_plugin_file_registers(tmp_path):
    from typer.testing import CliRunner

    from trine import registry
    from trine.cli import app

    plugin = tmp_path / "presets.py"
    plugin.write_text(
        "import trine\n"
        "trine.register('model_preset', 'my-tiny')(dict(vocab_size=512, hidden_size=64, "
        "intermediate_size=128, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, "
        "max_position_embeddings=256))\n"
    )
    runner = CliRunner()
    try:
        missing = runner.invoke(app, ["init-model", "my-tiny", str(tmp_path / "a")])
        assert missing.exit_code == 2 and "unknown model_preset 'my-tiny'" in missing.output
        done = runner.invoke(app, ["init-model", "my-tiny", str(tmp_path / "b"), "--plugin", str(plugin)])
        assert done.exit_code == 0, done.output
        assert load_model(tmp_path / "b").config.hidden_size == 64
    finally:
        registry._extra.get("model_preset", {}).pop("my-tiny", None)
