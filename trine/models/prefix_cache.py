"""Prefix KV reuse across turns: keep the KV cache of finished sequences and start continuations from it.

Multi-turn rollouts send, as the next prompt, exactly the previous turn's prompt + sampled tokens + the new
observation tokens (:class:`trine.workflows.trajectory.Trajectory`). Without reuse every turn prefills the
whole conversation again. :class:`PrefixCache` keeps, for recently finished rows, the keys/values of the
tokens the model has already run over (the prompt and every sampled token but the last, which was never fed
back) on the model's device, least recently used first out under a token budget. :func:`prefill` builds a
batch's KV cache from them: each row's cached prefix sits right-aligned in a shared prefix region, its new
suffix (left-padded) is prefilled after it, and the attention mask has zeros for the pads between them,
with explicit position ids, so the logits are those of a from-scratch prefill up to float noise.

The cache is only valid for the weights it was computed with: :meth:`PrefixCache.check` drops everything
when a fingerprint of the weights changes (in-place updates bump every parameter's version counter, and the
engine adds its policy version).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from trine.models.kv_cache import BufferLayer, cache_kwargs, preallocated_cache

_MASK = (1 << 61) - 1


@dataclass
class CachedPrefix:
    """The KV of ``tokens`` (positions ``0..len(tokens)-1``): per layer ``[heads, len(tokens), head_dim]``."""

    tokens: list[int]
    keys: list[Tensor]
    values: list[Tensor]


@dataclass
class Prefill:
    """A prefilled batch: its cache, the last position's logits, the attention mask over the cache's
    columns and each row's next position id."""

    cache: Any
    logits: Tensor
    mask: Tensor
    next_pos: Tensor


class PrefixCache:
    """LRU store of finished sequences' KV, bounded by ``max_tokens`` cached tokens in all.

    :meth:`match` finds the longest stored sequence that is a proper prefix of a prompt (a rolling hash per
    prefix length, confirmed token by token); :meth:`put` stores one and evicts the least recently used.
    ``hits`` / ``reused_tokens`` count what was reused (for benchmarks and tests).
    """

    def __init__(self, max_tokens: int) -> None:
        if max_tokens < 0:
            raise ValueError(f"prefix_cache_tokens={max_tokens}; expected >= 0 (0 turns prefix reuse off)")
        self.max_tokens = max_tokens
        self.tokens = 0
        self.hits = self.reused_tokens = 0
        self._entries: OrderedDict[tuple[int, int], CachedPrefix] = OrderedDict()
        self._lengths: dict[int, int] = {}  # length -> number of entries of that length
        self._fingerprint: object = None

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        """Drop every entry (their memory is freed once no batch uses it)."""
        self._entries.clear()
        self._lengths.clear()
        self.tokens = 0

    def check(self, fingerprint: object) -> None:
        """Drop everything if ``fingerprint`` (of the weights) differs from the one the entries were made with."""
        if fingerprint != self._fingerprint:
            self.clear()
            self._fingerprint = fingerprint

    def match(self, prompt: list[int]) -> CachedPrefix | None:
        """The longest stored sequence that ``prompt`` starts with and extends by at least one token."""
        if not self._entries:
            return None
        found: tuple[int, int] | None = None
        h = 0
        for n, tok in enumerate(prompt[: min(len(prompt) - 1, max(self._lengths))], start=1):
            h = (h * 1_000_003 + tok + 1) & _MASK
            if n in self._lengths and (n, h) in self._entries:
                if self._entries[(n, h)].tokens == prompt[:n]:
                    found = (n, h)
        if found is None:
            return None
        self._entries.move_to_end(found)
        self.hits += 1
        self.reused_tokens += found[0]
        return self._entries[found]

    def put(self, tokens: list[int], keys: list[Tensor], values: list[Tensor]) -> None:
        """Store the KV of ``tokens``; evict least recently used entries beyond the budget."""
        if not tokens or len(tokens) > self.max_tokens:
            return
        key = (len(tokens), _hash(tokens))
        if key in self._entries:
            self._remove(key)
        self._entries[key] = CachedPrefix(tokens, keys, values)
        self._lengths[len(tokens)] = self._lengths.get(len(tokens), 0) + 1
        self.tokens += len(tokens)
        while self.tokens > self.max_tokens:
            self._remove(next(iter(self._entries)))

    def _remove(self, key: tuple[int, int]) -> None:
        entry = self._entries.pop(key)
        n = len(entry.tokens)
        self.tokens -= n
        self._lengths[n] -= 1
        if not self._lengths[n]:
            del self._lengths[n]


def _hash(tokens: list[int]) -> int:
    h = 0
    for tok in tokens:
        h = (h * 1_000_003 + tok + 1) & _MASK
    return h


def supports_prefix_reuse(model: Any) -> bool:
    """Whether every layer of ``model``'s cache is a full-attention :class:`BufferLayer` (sliding-window and
    other special layers keep their own layout, which a cached prefix cannot be placed into)."""
    cache = preallocated_cache(model, 1)
    return bool(cache.layers) and all(type(layer) is BufferLayer for layer in cache.layers)


def weights_fingerprint(model: Any) -> int:
    """Changes whenever a parameter is modified in place (optimizer step, ``load_state_dict``) or replaced."""
    return sum(p._version + id(p) for p in model.parameters())


def prefill(
    model: Any, prompts: list[list[int]], hits: list[CachedPrefix | None], pad_id: int, extra: int
) -> Prefill:
    """Prefill ``prompts``, starting each row with a cached prefix from ``hits`` (None: from scratch), into a
    cache with room for ``extra`` more tokens. Row ``i``'s cached prefix sits right-aligned before the
    suffix region; its suffix is left-padded there; pads are masked and positions are explicit."""
    device = model.device
    cached = [len(h.tokens) if h is not None else 0 for h in hits]
    suffixes = [p[c:] for p, c in zip(prompts, cached, strict=True)]
    width = max(cached)
    ids, suffix_mask = left_pad(suffixes, pad_id, device)
    pos = torch.tensor(cached, device=device)[:, None] + (suffix_mask.cumsum(-1) - 1).clamp(min=0)
    prefix_mask = torch.zeros((len(prompts), width), dtype=suffix_mask.dtype, device=device)
    for i, c in enumerate(cached):
        prefix_mask[i, width - c :] = 1
    cache = preallocated_cache(model, width + ids.shape[1] + extra)
    if width:
        _place_prefixes(cache, hits, width)
    mask = torch.cat([prefix_mask, suffix_mask], dim=-1)
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=pos,
        use_cache=True,
        **cache_kwargs(model, cache),
        logits_to_keep=1,
    )
    return Prefill(cache, out.logits[:, -1].float(), mask, pos[:, -1] + 1)


def _place_prefixes(cache: Any, hits: list[CachedPrefix | None], width: int) -> None:
    """Write each hit's KV right-aligned into the first ``width`` columns of every layer (zeros elsewhere)."""
    sample = next(h for h in hits if h is not None)
    for layer, (k0, v0) in enumerate(zip(sample.keys, sample.values, strict=True)):
        keys = k0.new_zeros((len(hits), k0.shape[0], width, k0.shape[-1]))
        values = v0.new_zeros((len(hits), v0.shape[0], width, v0.shape[-1]))
        for i, hit in enumerate(hits):
            if hit is not None:
                n = len(hit.tokens)
                keys[i, :, width - n :] = hit.keys[layer]
                values[i, :, width - n :] = hit.values[layer]
        cache.layers[layer].update(keys, values)


def row_kv(cache: Any, row: int, columns: Tensor) -> tuple[list[Tensor], list[Tensor]]:
    """Copies of batch row ``row``'s keys/values at the cache ``columns`` (a bool mask over its length)."""
    idx = columns.nonzero().squeeze(-1)
    start, n = int(idx[0]), idx.numel()
    contiguous = int(idx[-1]) - start + 1 == n
    keys, values = [], []
    for layer in cache.layers:
        k, v = layer.keys[row], layer.values[row]
        if contiguous:
            keys.append(k[:, start : start + n].clone())
            values.append(v[:, start : start + n].clone())
        else:
            keys.append(k[:, idx])
            values.append(v[:, idx])
    return keys, values


def left_pad(seqs: list[list[int]], pad_id: int, device: Any) -> tuple[Tensor, Tensor]:
    """``seqs`` left-padded with ``pad_id`` into ``[len(seqs), longest]`` ids and a 0/1 attention mask."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s) :] = 1
    return ids.to(device), mask.to(device)
