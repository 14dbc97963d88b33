"""Auxiliary models: a judge, a second agent or a user simulator that workflows and rewards call by name.

``explorer.auxiliary_models`` in the config names them; each is a local model sampled by its own engine
(``path``) or an OpenAI-compatible endpoint (``base_url`` + ``model``, :class:`~trine.models.openai_model.
OpenAIModel`). Both are :class:`~trine.models.protocol.RolloutModel`-shaped, so a workflow calls them the
way it calls the rollout model (``await models["judge"].chat(messages, params)``).

:class:`AuxiliaryModels` is what the explorer hands out: a read-only mapping name -> model for workflows
(which declare an ``auxiliary_models`` parameter), plus :meth:`AuxiliaryModels.ask` for reward functions
(which declare a ``models`` parameter). Reward functions run in worker threads; ``ask`` runs the request
on the explorer's event loop and waits for the text, bounded by a timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from typing import Any

from trine.types import SamplingParams


class AuxiliaryModels(Mapping[str, Any]):
    """Auxiliary models by name, bound to the event loop of the explorer that uses them."""

    def __init__(self, models: Mapping[str, Any], loop: asyncio.AbstractEventLoop) -> None:
        self._models = dict(models)
        self.loop = loop

    def __getitem__(self, name: str) -> Any:
        try:
            return self._models[name]
        except KeyError:
            known = ", ".join(sorted(self._models)) or "none"
            raise KeyError(
                f"no auxiliary model {name!r}; explorer.auxiliary_models defines: {known}. Add it there."
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._models)

    def __len__(self) -> int:
        return len(self._models)

    def ask(
        self,
        name: str,
        messages: list[dict[str, Any]],
        *,
        timeout: float = 60.0,
        **sampling: Any,
    ) -> str:
        """The text of one chat completion of model ``name`` (from a worker thread, e.g. a reward
        function): runs on the explorer's event loop, waits at most ``timeout`` seconds."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            raise RuntimeError(
                "AuxiliaryModels.ask() blocks until the explorer's event loop answers: call it from a worker "
                "thread (a reward function), or `await models[name].chat(...)` in a workflow"
            )
        model = self[name]
        params = SamplingParams(**{"temperature": 0.0, "max_tokens": 64, **sampling})
        future = asyncio.run_coroutine_threadsafe(model.chat(messages, params), self.loop)
        try:
            return future.result(timeout)[0].text
        except TimeoutError:
            future.cancel()
            raise TimeoutError(f"auxiliary model {name!r} did not answer within {timeout}s") from None


def build_auxiliary(specs: Mapping[str, Any], build_local: Any) -> dict[str, Any]:
    """The models of ``explorer.auxiliary_models`` (``AuxiliaryModelConfig`` by name): an OpenAI-compatible
    client for a ``base_url``, else ``build_local(spec)`` (a local engine)."""
    from trine.models.openai_model import OpenAIModel

    out = {}
    for name, spec in specs.items():
        if spec.base_url is not None:
            out[name] = OpenAIModel(
                spec.base_url, spec.model, api_key_env=spec.api_key_env, timeout=spec.timeout
            )
        else:
            out[name] = build_local(spec)
    return out
