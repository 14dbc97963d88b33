"""Models: loading HF models and tokenizers, the tiny-model builder, rollout engines.

Names are resolved lazily (module ``__getattr__``) so ``import trine.models`` does not import
torch or transformers.
"""

from __future__ import annotations

from trine.registry import Table, lazy_exports

ENGINES = Table(
    {
        "hf": "trine.models.engine:HFEngine",
        "openai": "trine.models.openai_engine:OpenAIEngine",
        "vllm": "trine.models.vllm_engine:VLLMEngine",
    }
)
"""Built-in rollout engines by name (``model.engine``; ``openai``: a remote OpenAI-compatible server, see
:mod:`trine.models.openai_engine`); see :mod:`trine.models.protocol`. Each is imported when first looked up."""

_EXPORTS = {
    "RolloutModel": "trine.models.protocol",
    "PRESETS": "trine.models.tiny",
    "init_model": "trine.models.tiny",
    "count_parameters": "trine.models.tiny",
    "load_model": "trine.models.loading",
    "load_tokenizer": "trine.models.loading",
    "resolve_dtype": "trine.models.loading",
}

__all__ = ["ENGINES", *sorted(_EXPORTS)]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
