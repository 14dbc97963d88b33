"""The pure half of the vLLM engine (:mod:`trine.models.vllm_engine`): Trine's requests as vLLM's arguments
and vLLM's outputs as Trine's :class:`~trine.types.Completion` objects, the ``vllm.LLM`` arguments, the
request seed stream, and the function that runs inside vLLM's worker to load new weights.

Nothing here imports vllm at module level; :func:`import_vllm` does, with an error that says how to
install it. Everything but :func:`load_into_worker` runs (and is tested) without vllm or a GPU.
"""

from __future__ import annotations

import hashlib
import inspect
import os
from typing import Any

from trine.config.engines import RESERVED_ENGINE_ARGS
from trine.types import Completion, SamplingParams

INSTALL = 'pip install -e ".[vllm]"'


def import_vllm() -> Any:
    """The ``vllm`` module, or an ``ImportError`` that says how to install it."""
    try:
        import vllm
    except ImportError as err:
        raise ImportError(
            f"model.engine: vllm needs the vllm package, which cannot be imported ({err}). Install the extra on a "
            f"Linux machine with an NVIDIA GPU: {INSTALL}; or use model.engine: hf (CPU or GPU)."
        ) from err
    return vllm


def request_seed(stream: int, counter: int) -> int:
    """The seed of request number ``counter`` of seed stream ``stream``: a hash, so neighbouring streams and
    counters never share seeds; 62 bits leave room for vLLM's ``seed + i`` of the ``n`` samples."""
    digest = hashlib.blake2b(f"{stream}:{counter}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**62 - 1)


def sampling_kwargs(params: SamplingParams, seed: int) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for ``params``: Trine's top_k 0 (off) is vLLM's -1,
    ``logprobs=0`` returns the sampled token's logprob, stop strings stay in vLLM's text."""
    return {
        "n": params.n,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k if params.top_k > 0 else -1,
        "max_tokens": params.max_tokens,
        "stop": list(params.stop) or None,
        "stop_token_ids": list(params.stop_token_ids) or None,
        "seed": params.seed if params.seed is not None else seed,
        "ignore_eos": params.ignore_eos,
        "logprobs": 0,
        "include_stop_str_in_output": True,
    }


def completions(prompt_ids: list[int], output: Any, tokenizer: Any, version: int) -> list[Completion]:
    """Trine completions from one vLLM ``RequestOutput`` (its ``outputs``, by ``index``): tokens, the logprob
    of each sampled token (``logprobs[i][token].logprob``), locally decoded text, ``finish_reason``."""
    out = []
    for choice in sorted(output.outputs, key=lambda c: c.index):
        ids = [int(t) for t in choice.token_ids]
        if choice.finish_reason not in ("stop", "length"):
            raise RuntimeError(
                f"vLLM ended a sample with finish_reason={choice.finish_reason!r} (expected 'stop' or 'length'); "
                "the engine aborted the request (put to sleep or shut down while sampling?). The task is retried."
            )
        if choice.logprobs is None or len(choice.logprobs) != len(ids):
            got = (
                "none"
                if choice.logprobs is None
                else f"{len(choice.logprobs)} positions for {len(ids)} tokens"
            )
            raise RuntimeError(
                f"vLLM returned no logprob per sampled token ({got}); it was asked for logprobs=0"
            )
        logprobs = []
        for i, token in enumerate(ids):
            entry = choice.logprobs[i].get(token)
            if entry is None:
                raise RuntimeError(f"vLLM's logprobs at position {i} lack the sampled token {token}")
            logprobs.append(float(entry.logprob))
        out.append(
            Completion(
                prompt_ids=list(prompt_ids),
                response_ids=ids,
                logprobs=logprobs,
                text=tokenizer.decode(ids, skip_special_tokens=True),
                finish_reason=choice.finish_reason,
                policy_version=version,
            )
        )
    return out


def llm_kwargs(
    model: Any, tokenizer: Any, path: str | None, dtype: str, seed: int, **settings: Any
) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments: the policy's directory (``path``, else ``model.config._name_or_path``), the
    tokenizer's directory when it is local, ``dtype`` (``auto``: the loaded policy's dtype, which the trainer
    computes in), one GPU, processed logprobs, then ``settings`` (``engine_args`` merged last)."""
    source = path or getattr(getattr(model, "config", None), "_name_or_path", None)
    if not source or not os.path.isfile(os.path.join(source, "config.json")):
        raise ValueError(
            f"model.engine: vllm builds its engine from the policy's local directory, but {source!r} is not a "
            "model directory (no config.json); pass path= (model.path in the config) pointing at it."
        )
    if dtype == "auto" and model is not None and hasattr(model, "parameters"):
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    tokenizer_dir = getattr(tokenizer, "name_or_path", None)
    extra = dict(settings.pop("engine_args", None) or {})
    clash = sorted(RESERVED_ENGINE_ARGS & set(extra))
    if clash:
        raise ValueError(
            f"model.vllm.engine_args sets {clash}, which Trine sets itself; use the model.vllm fields"
        )
    if settings.get("max_model_len") is None:
        settings.pop("max_model_len", None)
    return {
        "model": source,
        "tokenizer": tokenizer_dir if tokenizer_dir and os.path.isdir(tokenizer_dir) else None,
        "seed": seed,
        "dtype": dtype,
        "tensor_parallel_size": 1,
        "logprobs_mode": "processed_logprobs",
        **settings,
        **extra,
    }


def load_into_worker(worker: Any, weights: list[tuple[str, Any]]) -> None:
    """Runs inside vLLM's worker: copy ``(name, tensor)`` pairs (Hugging Face names) into its model in place."""
    runner = worker.model_runner
    reload = getattr(runner, "reload_weights", None)
    if reload is not None and "weights_iterator" in inspect.signature(reload).parameters:
        worker.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)  # vLLM >= 0.2x
        return
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    model.load_weights(weights=iter(weights))
