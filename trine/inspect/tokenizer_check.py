"""Preflight of the policy's tokenizer: it must have a vocabulary and round-trip the first training prompt.

A model directory that lost its ``tokenizer.json`` (but kept ``tokenizer_config.json``) still loads:
transformers builds a tokenizer of a handful of special tokens that encodes every prompt as nothing, and
the run trained on empty prompts, ending ``finished``. :func:`tokenizer_problems` refuses

- a tokenizer directory with no file a vocabulary can come from (:data:`VOCAB_FILES`: ``tokenizer.json``,
  ``vocab.json`` + ``merges.txt``, a SentencePiece ``*.model``, ...), unless ``model.trust_remote_code``
  lets the model's own code read other files;
- a ``tokenizer.json`` that does not load, has fewer than :data:`MIN_VOCAB` tokens, encodes the first
  task's prompt as unknown tokens only, or does not give it back when decoding (compared ignoring
  whitespace and Unicode compatibility forms, NFKC).

It reads ``tokenizer.json`` with the ``tokenizers`` library, which the fast tokenizer of the run wraps, so
``trine validate`` imports neither transformers nor torch; the prompt is the first task's message texts
(the chat template's markup is special tokens, whose text is not checked). Each problem names the
tokenizer's directory, what is missing there and the fix.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any

MIN_VOCAB = 16
"""Fewer tokens than this is no language model's vocabulary (a broken tokenizer has 3)."""
FALLBACK_PROMPT = "What is 2+3? Answer with a number."
"""What is round-tripped when the run has no taskset rows (``tasks.source: buffer``)."""
VOCAB_FILES = (
    "tokenizer.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tekken.json",
    "*.model",
    "*.tiktoken",
)
"""Files a tokenizer's vocabulary is read from (``tokenizer.json`` alone makes a fast tokenizer;
``tokenizer_config.json`` holds only settings and special tokens)."""


def tokenizer_problems(cfg: Any, first: tuple[str, Any] | None) -> list[str]:
    """Problems of ``cfg``'s tokenizer (``model.tokenizer_path``, else ``model.path``) with the prompt of
    ``first`` = ``(taskset key, task)`` (None: a fixed prompt); [] when it round-trips."""
    source = cfg.model.tokenizer_path or cfg.model.path
    root = Path(source).expanduser()
    if not _vocabulary_files(root):
        if cfg.model.trust_remote_code:
            return []  # the model's own tokenizer code may read files of other names
        return [
            f"the tokenizer in {source} has no vocabulary: {_files(root)}, so transformers would build a "
            "tokenizer of its special tokens only, which encodes every prompt as nothing. " + _fix(source)
        ]
    if not (root / "tokenizer.json").is_file():
        return []  # a slow tokenizer's files (vocab.json + merges.txt, a SentencePiece model): not read here
    from tokenizers import Tokenizer

    try:
        tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
    except Exception as err:  # enrich: any failure to read it becomes one line naming the file
        return [f"{root / 'tokenizer.json'} does not load ({type(err).__name__}: {err}). {_fix(source)}"]
    where = f"the first prompt of {first[0]} (task {first[1].task_id!r})" if first else "a test prompt"
    text = _prompt(first[1] if first else None)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    decoded = tokenizer.decode(ids, skip_special_tokens=False)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    unk = getattr(tokenizer.model, "unk_token", None)
    unk_id = tokenizer.token_to_id(unk) if unk else None
    if vocab < MIN_VOCAB:
        why = f"its vocabulary has only {vocab} tokens"
    elif ids and unk_id is not None and all(i == unk_id for i in ids):
        why = f"every one of its {len(ids)} tokens is the unknown token {unk!r}"
    elif _normal(decoded) != _normal(text):
        why = f"{len(text)} characters encode as {len(ids)} tokens that decode as {_clip(decoded)}"
    else:
        return []
    return [
        f"the tokenizer in {source} cannot round-trip {where}, {_clip(text)}: {why}. Its tokenizer.json is "
        f"broken or belongs to another model. {_fix(source)}"
    ]


def _vocabulary_files(root: Path) -> list[Path]:
    return [f for pattern in VOCAB_FILES for f in root.glob(pattern) if f.is_file()]


def _prompt(task: Any) -> str:
    """The texts of ``task``'s messages (system prompt included), one per line."""
    messages = task.messages() if task is not None else [{"role": "user", "content": FALLBACK_PROMPT}]
    return "\n".join(str(m.get("content", "")) for m in messages)


def _normal(text: str) -> str:
    """``text`` without whitespace, in NFKC form: what any faithful tokenizer gives back."""
    return "".join(unicodedata.normalize("NFKC", text).split())


def _clip(text: str, limit: int = 80) -> str:
    return repr(text) if len(text) <= limit else repr(text[: limit - 3] + "...")


def _files(root: Path) -> str:
    """``it has tokenizer_config.json but no tokenizer.json (nor vocab.json + merges.txt, ...)``."""
    names = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
    have = [n for n in names if (root / n).is_file()]
    has = f"it has {', '.join(have)}" if have else "it has no tokenizer files"
    return f"{has} but no tokenizer.json (nor vocab.json + merges.txt, vocab.txt or a SentencePiece *.model)"


def _fix(source: str) -> str:
    return (
        f"Copy the model's tokenizer files (tokenizer.json, tokenizer_config.json, ...) into {source} from "
        "where the model came from, set model.tokenizer_path to a directory that has them, or build a tiny "
        "test model with its tokenizer: `trine init-model tiny-1m NEW_DIR`."
    )
