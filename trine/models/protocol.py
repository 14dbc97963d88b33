"""The rollout-model protocol: what the explorer, workflows and weight sync use of an engine.

Every engine (``model.engine`` in the config: ``hf`` today; an OpenAI-compatible client and vLLM
later) implements :class:`RolloutModel`; nothing outside ``trine.models`` reaches into an engine's
internals (its torch model, generator or threads).

- Workflows sample with ``await generate(prompt_ids, params)`` / ``await chat(messages, params)``;
  concurrent callers are batched by the engine.
- Weight sync loads new weights with ``load_weights(state_dict, version)`` and reads
  ``policy_version`` (the version of the weights the engine samples from).
- Evaluation samples reproducibly inside ``with engine.seeded(seed):`` without disturbing the
  sampling stream of training.
- Checkpoints save and restore the sampling stream with ``state_dict()`` / ``load_state_dict()``.

Engines are listed in ``trine.models.ENGINES`` (the registry kind ``engine``); anything else is an import path
``"package.module:Class"``. The table entry (the class) is all the wiring (:mod:`trine.build`) reads:

- ``Class.from_config(model, tokenizer, section, explorer, seed)``, if the class has it, builds the engine
  from the ``model`` config section (:class:`~trine.config.ModelConfig`), the ``explorer`` section and the
  run's seed (``openai``, ``vllm``). Otherwise the class is built as
  ``Class(model, tokenizer, max_batch_size=..., seed=...)`` (plus ``partial_rollout=True`` and
  ``prefix_cache_tokens`` when the config sets them), where ``model`` is the loaded policy (an engine that
  serves remote weights may ignore it).
- ``Class.weights`` says where the weights it samples live: ``"given"`` (the default: the ``model`` it is
  built on, which may be the trainer's own), ``"copy"`` (its own copy, built from ``model.path`` and
  refreshed by ``load_weights``: no snapshot of the policy is taken for it, and an explorer process loads
  no policy) or ``"server"`` (a remote server that loads its own: published weights are not loaded in).
- An engine whose ``enable_sleep_mode`` is true has ``sleep()`` / ``wake_up()`` and sleeps while a trainer
  on the same GPU steps (:class:`~trine.trainer.side.TrainerSide` ``colocated``).

Config checks of an engine's settings live in :mod:`trine.config` (``trine validate`` imports no engine).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol, runtime_checkable

from trine.types import Completion, SamplingParams


@runtime_checkable
class RolloutModel(Protocol):
    """An async sampling service over one set of policy weights."""

    tokenizer: Any
    """The Hugging Face tokenizer of the policy (chat template, ids <-> text)."""
    policy_version: int
    """Version of the weights being sampled (the trainer's step count when they were pushed)."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        """``params.n`` completions of ``prompt_ids`` (token ids in, token ids and logprobs out)."""
        ...

    async def chat(self, messages: list[dict[str, Any]], params: SamplingParams) -> list[Completion]:
        """The chat template applied to ``messages`` (with the generation prompt), then :meth:`generate`."""
        ...

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Sample from these weights from now on, as ``version``."""
        ...

    def seeded(self, seed: int) -> AbstractContextManager[None]:
        """Inside the block, sampling draws from a stream seeded with ``seed``; afterwards the previous
        stream continues exactly where it was (evaluation never disturbs training's samples)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The sampling stream and policy version, for checkpoints."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        ...

    def close(self) -> None:
        """Release threads and devices (idempotent)."""
        ...
