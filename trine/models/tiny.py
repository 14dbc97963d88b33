"""Tiny Qwen2-architecture models built locally, for tests, examples and CPU debugging.

``trine init-model tiny-1m OUT_DIR`` calls :func:`init_model`: it trains a small byte-level BPE
tokenizer (Qwen2's own pre-tokenizer pipeline, so every UTF-8 string round-trips and every digit is
its own token) on a corpus generated here, builds a randomly initialised ``Qwen2ForCausalLM`` of the
preset's size, and saves both in Hugging Face format. The result loads exactly like a real model
(``trine.models.load_model`` / ``load_tokenizer``), so the rest of Trine never special-cases it.

Importing this module is free (no torch/transformers); they are imported when a model is built.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

# Qwen2 hyperparameters per preset; word embeddings are tied, so the count is embed + layers.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny-0.5m": dict(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
    ),
    "tiny-1m": dict(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=5,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
    ),
    "tiny-5m": dict(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=6,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=2048,
    ),
    "tiny-30m": dict(
        vocab_size=4096,
        hidden_size=512,
        intermediate_size=1760,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=4096,
    ),
}

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, EOS_TOKEN]

# Qwen2's pre-tokenizer split: contractions, letter runs (with one leading non-letter), single
# digits, punctuation runs, newlines, whitespace.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

CHAT_TEMPLATE = (
    # ChatML. With tools, the system turn lists them (one JSON object per line inside <tools>); the model
    # calls one as <tool_call>{"name": ..., "arguments": {...}}</tool_call> and a result comes back as a
    # `tool` message (the Hermes / Qwen2.5 convention, kept short for tiny models).
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n' }}{%- endif %}"
    "{{- '<tools>\\n' }}"
    "{%- for tool in tools %}{{- (tool['function'] if tool['function'] is defined else tool) | tojson }}"
    "{{- '\\n' }}{%- endfor %}"
    "{{- '</tools><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (tools and loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_NAMES = (
    "Alice Bob Carol Dave Eve Frank Grace Heidi Ivan Judy Mallory Oscar Peggy Trent Victor Walter".split()
)
_NOUNS = (
    "apple apples book books cat cats dog dogs house river tree trees car cars city cities garden "
    "teacher student students child children friend friends window door table chair computer phone "
    "bird birds flower flowers mountain ocean road train boat letter story song music game games "
    "problem problems answer answers number numbers question questions box boxes coin coins cake "
    "pencil pencils bag bags shop market school village forest island bridge kitchen morning evening"
).split()
_VERBS = (
    "sees likes finds makes takes gives reads writes buys sells opens closes needs wants helps "
    "builds paints counts moves carries brings watches follows solves checks"
).split()
_PAST = (
    "saw liked found made took gave read wrote bought sold opened closed needed wanted helped "
    "built painted counted moved carried brought watched followed solved checked"
).split()
_ADJS = (
    "big small red blue green old new happy quiet bright dark warm cold fast slow good bad long "
    "short young tall heavy light simple hard easy clean round"
).split()
_ADVS = "quickly slowly carefully happily quietly often always never sometimes again".split()
_MATH_WORDS = (
    "zero one two three four five six seven eight nine ten eleven twelve twenty thirty hundred "
    "thousand plus minus times divided equals sum product difference remainder total half double "
    "first second third last more less fewer than each every many much step steps solution result "
    "equation expression value values digit digits even odd prime factor multiply add subtract"
).split()
_SYLLABLES = "ka lo mi ne ru ta vi so de pa mo li na ri be go fu ze ha ti wa ke yo lu".split()
_PLACES = "in the park|at home|near the river|in the city|at school|by the sea|in the garden".split("|")
_CODE = [
    "def add(a, b):\n    return a + b\n",
    "for i in range(10):\n    print(i * 2)\n",
    "if x > 0 and y < 5:\n    result = x - y\nelse:\n    result = None\n",
    'data = {"name": "trine", "steps": 100, "ok": true}\n',
    "while n != 1:\n\tn = n // 2 if n % 2 == 0 else 3 * n + 1\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "import math\nprint(math.sqrt(16))  # 4.0\n",
    "values = [1, 2, 3]\ntotal = sum(values)\nassert total == 6\n",
    "SELECT name, score FROM results WHERE score >= 10;\n",
    "x = (a + b) * (c - d) / 2; y = x ** 2 % 7\n",
]
_MIXED = [
    "Café, naïve, résumé, déjà vu — ça va? Ünïcödé text.",
    "中文 文本 测试：你好，世界！ 日本語 テキスト 한국어 텍스트",
    "Emoji 🙂 🚀 ✅ and symbols © ® ™ € £ ¥ ° ± × ÷ → ≤ ≥ ≠",
    "Tabs\tand  double  spaces,   triple spaces\n\nand blank lines.\r\n",
    "<think>Let me think step by step.</think> The answer is \\boxed{42}.",
    "Answer: 17. Final answer: 3/4. The result is -12.5 (about 1e-3).",
]


def _sentence(rng: random.Random) -> str:
    """One plain English sentence from the word lists."""
    name, other = rng.sample(_NAMES, 2)
    noun, noun2 = rng.sample(_NOUNS, 2)
    adj, place, adv = rng.choice(_ADJS), rng.choice(_PLACES), rng.choice(_ADVS)
    i = rng.randrange(len(_VERBS))
    templates = [
        f"{name} {_VERBS[i]} the {adj} {noun} {place}.",
        f"The {adj} {noun} is next to the {noun2}.",
        f"Yesterday {name} {_PAST[i]} a {noun} and gave it to {other}.",
        f"Why does {name} {adv} look at the {noun}?",
        f'{name} said: "I {_PAST[i]} the {noun2} {place}!"',
        f"It's {adj} today, so we'll stay {place} and {_VERBS[i][:-1]} {adv}.",
        f"There are {rng.randint(2, 99)} {noun} and {rng.randint(2, 99)} {noun2} {place}.",
    ]
    return rng.choice(templates)


def _arithmetic(rng: random.Random) -> str:
    """An arithmetic fact like ``12*7=84`` or a short word problem with its answer."""
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    op = rng.choice("+-*")
    value = a + b if op == "+" else a - b if op == "-" else a * b
    kind = rng.randrange(4)
    if kind == 0:
        return f"{a}{op}{b}={value}"
    if kind == 1:
        return f"{a} {op} {b} = {value}"
    if kind == 2:
        nums = rng.sample(range(1, 20), 3)
        return f"Using the numbers {nums}, create an equation that equals {value}."
    return f"{rng.choice(_NAMES)} has {a} coins and finds {b} more. How many? The answer is {a + b}."


def _chat(rng: random.Random) -> str:
    """A ChatML conversation (the special tokens are kept whole by the trainer)."""
    a, b = rng.randint(0, 50), rng.randint(0, 50)
    return (
        f"{IM_START}system\nYou are a helpful assistant.{EOS_TOKEN}\n"
        f"{IM_START}user\nWhat is {a}+{b}?{EOS_TOKEN}\n"
        f"{IM_START}assistant\n<think>{a} plus {b} is {a + b}.</think> {a + b}{EOS_TOKEN}\n"
    )


def build_corpus(seed: int = 0, lines: int = 3000) -> list[str]:
    """The deterministic training corpus of the tiny tokenizer: prose, arithmetic, chat, code, UTF-8."""
    rng = random.Random(seed)
    makers = [_sentence, _sentence, _arithmetic, _chat]
    corpus = [rng.choice(makers)(rng) for _ in range(lines)]
    words = _NAMES + _NOUNS + _VERBS + _PAST + _ADJS + _ADVS + _MATH_WORDS
    # made-up words (place names, say) give the larger vocabularies enough distinct merges
    words += ["".join(rng.choices(_SYLLABLES, k=rng.randint(2, 4))) for _ in range(1500)]
    for _ in range(2):
        corpus += [" ".join(words), " ".join(w.capitalize() for w in words), ", ".join(words) + "."]
    corpus += _CODE * 10 + _MIXED * 10
    return corpus


def build_tokenizer(vocab_size: int, model_max_length: int = 2048, seed: int = 0):
    """Train the byte-level BPE tokenizer and wrap it as a ``PreTrainedTokenizerFast`` with ChatML."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(build_corpus(seed), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[IM_START],
        model_max_length=model_max_length,
        add_prefix_space=False,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def estimate_parameters(
    vocab_size: int,
    hidden_size: int,
    intermediate_size: int,
    num_hidden_layers: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    **_: Any,
) -> int:
    """Parameter count of a tied-embedding Qwen2 model, computed from its hyperparameters alone."""
    head_dim = hidden_size // num_attention_heads
    q, kv = num_attention_heads * head_dim, num_key_value_heads * head_dim
    attention = (hidden_size * q + q) + 2 * (hidden_size * kv + kv) + q * hidden_size
    layer = attention + 3 * hidden_size * intermediate_size + 2 * hidden_size
    return vocab_size * hidden_size + num_hidden_layers * layer + hidden_size


def count_parameters(model) -> int:
    """Number of distinct parameters of a torch module (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def build_model(preset: str, tokenizer, seed: int = 0):
    """A randomly initialised ``Qwen2ForCausalLM`` of ``preset`` whose special ids match ``tokenizer``."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    hparams = dict(_preset(preset))
    if len(tokenizer) > hparams["vocab_size"]:
        raise ValueError(
            f"tokenizer has {len(tokenizer)} tokens but preset {preset!r} has "
            f"vocab_size={hparams['vocab_size']}; raise the preset's vocab_size."
        )
    ids = dict(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    config = Qwen2Config(**hparams, tie_word_embeddings=True, initializer_range=0.02, **ids)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(**ids)
    return model.eval()


def init_model(preset: str, out_dir: str | Path, seed: int = 0, overwrite: bool = False) -> Path:
    """Build tokenizer + random model of ``preset`` and save them in HF format under ``out_dir``.

    The files are written into a temporary sibling directory that is renamed into place at the
    end, so a crash never leaves a half-written ``out_dir`` that looks like a model.
    """
    hparams = _preset(preset)
    out = Path(out_dir).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} exists and is not a directory; choose another OUT_DIR.")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise FileExistsError(
            f"{out} already exists and is not empty; pass overwrite=True "
            "(--overwrite on the command line) or choose another OUT_DIR."
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(hparams["vocab_size"], hparams["max_position_embeddings"], seed)
    model = build_model(preset, tokenizer, seed)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; the model dir should read like any other
        _save_quietly(model, tokenizer, tmp)
        info = {"preset": preset, "seed": seed, "parameters": count_parameters(model)}
        (tmp / "trine_model.json").write_text(json.dumps(info, indent=2) + "\n")
        _replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _preset(preset: str) -> dict[str, Any]:
    """The hyper-parameters of ``preset``: a built-in, one registered by a plugin
    (``@trine.register("model_preset", name)``) or an import path (the registry's lookup)."""
    from trine import registry

    return registry.resolve("model_preset", preset)


def _save_quietly(model, tokenizer, path: Path) -> None:
    """``save_pretrained`` both, without transformers' progress bar for a one-shard model."""
    from trine.models.loading import quiet_progress

    with quiet_progress():
        model.save_pretrained(path, safe_serialization=True)
        tokenizer.save_pretrained(path)


def _replace_dir(src: Path, dst: Path) -> None:
    """Move the finished ``src`` to ``dst``, replacing whatever (already checked) is there."""
    old = None
    if dst.exists():
        old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
        os.rename(dst, old)
    os.rename(src, dst)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
