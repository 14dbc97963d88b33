"""The one way Trine loads models and tokenizers: a local Hugging Face directory.

A tiny model made by ``trine init-model`` and a real checkpoint go through exactly the same path.
Nothing is ever downloaded (``local_files_only=True``): a model id like ``Qwen/Qwen2.5-0.5B`` works
only if it is already in the local Hugging Face cache.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trine.config.devices import auto_dtype, resolve_device

DTYPES = ("float32", "bfloat16", "float16", "auto")
_ALIASES = {
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "auto": "auto",
}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")


def resolve_dtype(name: Any, device: str | None = None):
    """Turn ``"float32" | "bfloat16" | "float16" | "auto"`` (or a ``torch.dtype``) into a ``torch.dtype``.

    ``"auto"`` means the best training dtype for the device: bfloat16 on a CUDA device that supports
    it, float32 otherwise (CPU). ``device=None`` asks whether CUDA is available at all.
    """
    import torch

    if isinstance(name, torch.dtype):
        return name
    key = _ALIASES.get(str(name).lower().removeprefix("torch."))
    if key is None:
        raise ValueError(f"unknown dtype {name!r}; expected one of {list(DTYPES)} (or fp32/bf16/fp16).")
    return getattr(torch, auto_dtype(device) if key == "auto" else key)


def load_tokenizer(path: str | Path, trust_remote_code: bool = False):
    """Load the tokenizer saved at ``path`` with ``AutoTokenizer`` and make sure it has a pad token.

    A tokenizer without a pad token gets its eos token as pad (with a warning). Which side to pad
    is left to the caller (generation pads left, training right).
    """
    from transformers import AutoTokenizer

    source = _local_source(path, _TOKENIZER_FILES, "tokenizer")
    try:
        tokenizer = AutoTokenizer.from_pretrained(
            source, local_files_only=True, trust_remote_code=trust_remote_code
        )
    except OSError as err:
        raise FileNotFoundError(_missing_message(path, "tokenizer", f"loading failed: {err}")) from err
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(
                f"tokenizer at {path} has neither a pad nor an eos token; add a pad token to its "
                'tokenizer_config.json (e.g. "pad_token": "<|endoftext|>").'
            )
        warnings.warn(
            f"tokenizer at {path} has no pad token; using its eos token {tokenizer.eos_token!r} as pad.",
            stacklevel=2,
        )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(
    path: str | Path,
    dtype: Any = "float32",
    device: str = "cpu",
    trust_remote_code: bool = False,
    *,
    adapter_dir: str | None = None,
):
    """Load the causal LM saved at ``path`` in ``dtype`` on ``device``, in eval mode.

    ``dtype`` is a name accepted by :func:`resolve_dtype`; ``device`` is a torch device string or
    ``"auto"``. Raises ``FileNotFoundError`` (naming the path) when there is no model there.
    ``adapter_dir``: the LoRA adapter trained on this base (a checkpoint's ``adapter``), kept on the model
    as ``trine_adapter_dir`` for the trainer to resume (:func:`trine.trainer.policy.prepare_policy`).
    """
    import transformers
    from transformers import AutoModelForCausalLM

    device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, device)
    source = _local_source(path, ("config.json",), "model")
    # transformers >= 4.56 takes `dtype=`; older releases only know `torch_dtype=`
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    dtype_kwarg = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    kwargs = {dtype_kwarg: torch_dtype, "local_files_only": True, "trust_remote_code": trust_remote_code}
    try:
        with quiet_progress():
            model = AutoModelForCausalLM.from_pretrained(source, **kwargs)
    except OSError as err:
        raise FileNotFoundError(_missing_message(path, "model", f"loading failed: {err}")) from err
    model = model.to(device).eval()
    if adapter_dir is not None:
        model.trine_adapter_dir = adapter_dir
    return model


def check_model_files(path: str | Path, tokenizer_path: str | Path | None = None) -> list[str]:
    """Problems with the model directory ``path`` that would stop :func:`load_model`, found without
    loading it: a missing or unreadable config.json, no tokenizer files, no weights, or a safetensors
    file whose header and size disagree (a truncated download). Each problem names its file."""
    p = Path(path).expanduser()
    if not p.is_dir():
        return [_missing_message(path, "model", "it is not a directory")]
    problems = []
    config = p / "config.json"
    if not config.is_file():
        problems.append(f"{config} is missing; a Hugging Face model directory needs its config.json")
    else:
        try:
            json.loads(config.read_text(encoding="utf-8"))
        except (ValueError, OSError) as err:
            problems.append(f"{config} is not valid JSON ({err}); re-download or re-save the model")
    tokenizer = Path(tokenizer_path).expanduser() if tokenizer_path else p
    if not any((tokenizer / name).is_file() for name in _TOKENIZER_FILES):
        problems.append(
            f"{tokenizer} has no tokenizer files ({' / '.join(_TOKENIZER_FILES)}); save the tokenizer "
            "there or set model.tokenizer_path"
        )
    weights = sorted(p.glob("*.safetensors")) + sorted(p.glob("pytorch_model*.bin"))
    if not weights:
        problems.append(f"{p} has no weights (*.safetensors or pytorch_model*.bin)")
    problems += [
        problem for file in weights if file.suffix == ".safetensors" if (problem := _check_safetensors(file))
    ]
    return problems


def _check_safetensors(file: Path) -> str | None:
    """None if the safetensors header parses and the tensors it lists end exactly at the end of the file."""
    size = file.stat().st_size
    fix = "the file is truncated or corrupt; re-download or re-save the model"
    with open(file, "rb") as handle:
        head = handle.read(8)
        if len(head) < 8:
            return f"{file}: {size} bytes, too short for a safetensors header; {fix}"
        length = int.from_bytes(head, "little")
        if length > size - 8:
            return f"{file}: header says {length} bytes of metadata but the file has {size}; {fix}"
        try:
            header = json.loads(handle.read(length))
        except ValueError as err:
            return f"{file}: header is not valid JSON ({err}); {fix}"
    if not isinstance(header, dict):
        return f"{file}: header is not a JSON object; {fix}"
    offsets = [
        t.get("data_offsets") for k, t in header.items() if k != "__metadata__" and isinstance(t, dict)
    ]
    if not all(isinstance(o, list) and len(o) == 2 and all(isinstance(x, int) for x in o) for o in offsets):
        return f"{file}: a tensor in the header has no valid data_offsets; {fix}"
    ends = [o[1] for o in offsets]
    expected = 8 + length + max(ends, default=0)
    if expected != size:
        return f"{file}: its header lists tensors up to byte {expected} but the file has {size} bytes; {fix}"
    return None


def _local_source(path: str | Path, required: tuple[str, ...], what: str) -> str:
    """Check ``path`` is a directory holding one of ``required``; a model id is left to the HF cache."""
    p = Path(path).expanduser()
    if p.is_dir():
        if not any((p / name).is_file() for name in required):
            found = sorted(x.name for x in p.iterdir())[:10]
            raise FileNotFoundError(
                _missing_message(path, what, f"the directory has no {' / '.join(required)} (found: {found})")
            )
        return str(p)
    if p.exists():
        raise FileNotFoundError(_missing_message(path, what, f"it is a file, not a {what} directory"))
    if _looks_like_model_id(str(path)):
        return str(path)  # e.g. "Qwen/Qwen2.5-0.5B": only the local cache is tried
    raise FileNotFoundError(_missing_message(path, what, "the path does not exist"))


def _looks_like_model_id(text: str) -> bool:
    parts = text.split("/")
    return len(parts) == 2 and all(parts) and not text.startswith((".", "~")) and "\\" not in text


@contextlib.contextmanager
def quiet_progress() -> Iterator[None]:
    """Hide transformers' progress bars (weight loading/saving) inside the block."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _missing_message(path: str | Path, what: str, reason: str) -> str:
    return (
        f"cannot load a {what} from {str(path)!r}: {reason}. Give the path of a local Hugging Face "
        f"model directory (with config.json, weights and tokenizer files); for a tiny test model run "
        f"`trine init-model tiny-1m {path}`."
    )
