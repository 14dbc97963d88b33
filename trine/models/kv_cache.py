"""A KV cache that writes into preallocated buffers instead of concatenating every step.

``transformers``' ``DynamicCache`` grows each layer with ``torch.cat`` at every decoded token, which
copies the whole cache each step (quadratic in length; on CPU it was ~70% of sampling time at 256
tokens). :func:`preallocated_cache` returns a ``DynamicCache`` whose full-attention layers keep one
buffer of ``capacity`` positions, write new keys/values in place and hand attention a view of the
filled part. Sliding-window or other special layers keep their own implementation.

:func:`cache_kwargs` passes a cache to a model's ``forward`` under the name its transformers version
takes: ``cache`` (newer releases, which deprecate ``past_key_values`` with a ``FutureWarning``), else
``past_key_values`` (older releases, remote-code models).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class BufferLayer(DynamicLayer):
    """Full-attention cache layer over a preallocated ``[B, H, capacity, D]`` buffer."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h, _, d = key_states.shape
        self._k = key_states.new_empty((b, h, self.capacity, d))
        self._v = value_states.new_empty((b, h, self.capacity, value_states.shape[-1]))
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self._k.shape[-2]:  # outgrew the estimate: double once (amortised)
            grow = max(end, 2 * self._k.shape[-2]) - self._k.shape[-2]
            self._k = torch.cat(
                [self._k, self._k.new_empty((*self._k.shape[:2], grow, self._k.shape[-1]))], dim=-2
            )
            self._v = torch.cat(
                [self._v, self._v.new_empty((*self._v.shape[:2], grow, self._v.shape[-1]))], dim=-2
            )
        self._k[:, :, self.length : end] = key_states
        self._v[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self._k[:, :, :end], self._v[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._k, self._v = self._k[indices], self._v[indices]
            self.keys, self.values = self._k[:, :, : self.length], self._v[:, :, : self.length]

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self.batch_select_indices(
                torch.arange(self._k.shape[0], device=self._k.device).repeat_interleave(repeats)
            )

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError(
            "BufferLayer does not support crop(); use DynamicCache for speculative decoding"
        )

    def reset(self) -> None:
        self.length = 0
        self.is_initialized = False
        self.keys = self.values = None


def preallocated_cache(model: Any, capacity: int) -> DynamicCache:
    """A cache for ``model`` whose full-attention layers write into ``capacity``-long buffers."""
    cache = DynamicCache(config=model.config)
    if all(type(layer) is DynamicLayer for layer in cache.layers) and cache.layers:
        cache.layers = [BufferLayer(capacity) for _ in cache.layers]
    return cache


_CACHE_NAMES: dict[type, str] = {}


def cache_kwargs(model: Any, cache: Any) -> dict[str, Any]:
    """``{name: cache}`` for ``model(...)``: ``name`` is ``"cache"`` where the architecture's ``forward``
    declares it (transformers renamed ``past_key_values`` and warns on the old name), else
    ``"past_key_values"``. A PEFT wrapper is looked through to its base model (it forwards keywords)."""
    getter = getattr(model, "get_base_model", None)
    base = getter() if callable(getter) else model
    kind = type(base)
    if kind not in _CACHE_NAMES:
        try:
            params = inspect.signature(kind.forward).parameters
        except (TypeError, ValueError, AttributeError):  # no inspectable forward: the long-standing name
            params = {}
        _CACHE_NAMES[kind] = "cache" if "cache" in params else "past_key_values"
    return {_CACHE_NAMES[kind]: cache}
