"""What the config knows about rollout engines without importing them (re-exported by :mod:`trine.config`).

The config names engines as strings (``model.engine``) and checks their settings at ``trine validate``,
where no engine module may be imported (the built-in ``hf`` engine imports torch). So the engines' pure
config facts live here, and the engine modules of :mod:`trine.models` read them from here:

- :data:`VLLM_ENGINES`: the names of the in-process vLLM engine (``model.vllm`` applies to them);
- :data:`RESERVED_ENGINE_ARGS`: the ``vllm.LLM`` arguments Trine sets itself (``model.vllm.engine_args``
  may not set them; :func:`trine.models.vllm_requests.llm_kwargs` refuses them too);
- :func:`engine_problems`: run settings the remote ``openai`` engine cannot honour.

How an engine is *built* is its own table entry's business (:data:`trine.models.ENGINES`: a class with a
``from_config`` classmethod, or the constructor convention of :mod:`trine.models.protocol`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trine.config import RunConfig

VLLM_ENGINES = ("vllm", "trine.models.vllm_engine:VLLMEngine")
"""The ``model.engine`` values that name :class:`trine.models.vllm_engine.VLLMEngine` (``model.vllm`` applies)."""

RESERVED_ENGINE_ARGS = frozenset(
    {"model", "tokenizer", "seed", "dtype", "tensor_parallel_size", "logprobs_mode", "trust_remote_code",
     "gpu_memory_utilization", "max_model_len", "enable_sleep_mode", "enforce_eager", "enable_prefix_caching"}
)  # fmt: skip
"""``vllm.LLM`` arguments Trine sets itself (``model.vllm.engine_args`` may not override them)."""


def engine_problems(cfg: RunConfig) -> list[str]:
    """Run settings an ``openai`` engine cannot honour: the remote server loads its own weights, so the
    explorer must never be handed the trainer's weights (mode async in one process: ``copy`` sync; mode
    sync is refused by ``ModelConfig`` itself) and evaluation during mode train would sample the server,
    not the weights being trained. Empty for every other engine. For :func:`trine.config.checks.mode_problems`."""
    if cfg.model.engine != "openai":
        return []
    fix = (
        "set mode: async with launch: processes and run `trine serve` on the run directory (it loads the "
        "weights trine train publishes), or use model.engine: hf"
    )
    if cfg.mode == "async" and cfg.launch != "processes":
        return [f"model.engine: openai with mode async and launch: {cfg.launch} would copy the trainer's "
                f"weights into the engine (sync.method {cfg.sync_method!r}); {fix}"]  # fmt: skip
    if cfg.mode == "train" and cfg.tasks.eval:
        return ["model.engine: openai: evaluation in mode train would sample the server, not the weights being "
                "trained; use model.engine: hf"]  # fmt: skip
    return []
