"""The shared-prompt forward: each distinct prompt of a micro-batch runs once, for all of its responses.

GRPO and its relatives sample ``n`` responses per prompt, and the per-sample forward
(:func:`trine.models.batching.padded_logits`) runs that prompt ``n`` times. Here a micro-batch's rows
are arranged by prompt (a :class:`SharedLayout`):

- **prefix rows**, one per distinct prompt ``p`` (length ``P ≥ 2``): ``p[:-1]``, left-padded to the
  longest, run once *with* gradients and ``use_cache=True``; their keys/values stay in the autograd graph;
- **segment rows**, one per experience with response ``y`` (length ``r``): ``[p[-1], y_0 … y_{r-2}]``,
  left-padded to ``R`` (the longest response), run as one batch over the prefix cache gathered to the
  rows (``index_select`` on every layer's keys and values: the gradient of every row flows back through
  its prompt's activations, summed over the group).

Segment column ``j`` holds the token before target column ``j`` of
:class:`~trine.models.batching.MicroBatch` (the last prompt token before the first response token), so
the segment's ``[B, R, V]`` logits are right-aligned exactly like ``padded_logits``' and the
logprob/entropy math after them is shared. Positions are explicit (``P - 1 + t``); the pads between a
row's prefix and its segment are masked. Attention sees the same keys at the same positions as in one
forward over ``p + y``, so logprobs, losses and gradients agree with the per-sample forward up to float
rounding (``tests/unit/models/test_shared_prompt.py``).

Tokens run per micro-batch: ``G × (P_max - 1) + B × R`` instead of ``B × L_max``;
:func:`plan_shared_micro_batches` cuts a mini-batch into micro-batches within the token budget, keeping
each prompt's rows together or bucketing rows by response length, whichever runs fewer tokens.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor

from trine.models.kv_cache import cache_kwargs


@dataclass
class SharedLayout:
    """A micro-batch arranged by prompt: ``G`` prefix rows and ``B`` segment rows (module docstring)."""

    prefix_ids: Tensor  # [G, Pm] each distinct prompt but its last token, left-padded
    prefix_mask: Tensor  # [G, Pm] 0/1
    prefix_pos: Tensor  # [G, Pm] position ids
    prompt_of_row: Tensor  # [B] which prefix row each experience's prompt is
    segment_ids: Tensor  # [B, R] last prompt token + response[:-1], left-padded
    segment_mask: Tensor  # [B, R] 0/1
    segment_pos: Tensor  # [B, R] position ids

    @property
    def forward_tokens(self) -> int:
        """Tokens the two forwards run over, pads included: ``G × Pm + B × R``."""
        return self.prefix_ids.numel() + self.segment_ids.numel()


def shared_layout(
    prompts: list[list[int]], responses: list[list[int]], pad_id: int, device: Any
) -> SharedLayout:
    """The :class:`SharedLayout` of rows with these prompts and responses (equal prompts share a prefix
    row). Every prompt needs at least two tokens and some response at least one."""
    if any(len(p) < 2 for p in prompts) or not any(responses):
        raise ValueError(
            f"shared_layout: prompt lengths {sorted({len(p) for p in prompts})[:3]} and longest response "
            f"{max(map(len, responses), default=0)}; expected prompts of >= 2 tokens and a response of "
            ">= 1 token (use the per-sample forward for these rows)"
        )
    index: dict[tuple[int, ...], int] = {}
    of_row = [index.setdefault(tuple(p), len(index)) for p in prompts]
    prefixes = [list(p[:-1]) for p in index]
    width = max(len(p) for p in prefixes)
    resp = max(len(r) for r in responses)
    prefix_ids, prefix_mask = _left_pad(prefixes, width, pad_id)
    segment_ids = torch.full((len(prompts), resp), pad_id, dtype=torch.long)
    segment_mask = torch.zeros((len(prompts), resp), dtype=torch.long)
    segment_pos = torch.zeros((len(prompts), resp), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        seg = [p[-1], *r[:-1]]
        n = len(seg) if r else 0  # an empty response: no target, an all-pad segment row
        if n:
            segment_ids[i, resp - n :] = torch.tensor(seg, dtype=torch.long)
            segment_mask[i, resp - n :] = 1
            segment_pos[i, resp - n :] = torch.arange(len(p) - 1, len(p) - 1 + n)
    return SharedLayout(
        prefix_ids=prefix_ids.to(device),
        prefix_mask=prefix_mask.to(device),
        prefix_pos=(prefix_mask.cumsum(-1) - 1).clamp(min=0).to(device),
        prompt_of_row=torch.tensor(of_row, dtype=torch.long, device=device),
        segment_ids=segment_ids.to(device),
        segment_mask=segment_mask.to(device),
        segment_pos=segment_pos.to(device),
    )


def _left_pad(seqs: list[list[int]], width: int, pad_id: int) -> tuple[Tensor, Tensor]:
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s) :] = 1
    return ids, mask


def shared_logits(model: Any, layout: SharedLayout) -> Tensor:
    """``[B, R, V]`` logits predicting the right-aligned targets: the prefixes' forward into a fresh
    cache (one per call: nothing is shared between micro-batches), the cache gathered to the rows, then
    the segments' forward over it. Gradients (when enabled) reach the prefix activations."""
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache(config=_base(model).config)
    model(
        input_ids=layout.prefix_ids,
        attention_mask=layout.prefix_mask,
        position_ids=layout.prefix_pos,
        use_cache=True,
        logits_to_keep=1,
        **cache_kwargs(model, cache),
    )
    cache.batch_select_indices(layout.prompt_of_row)  # new tensors (indexing), differentiable
    out = model(
        input_ids=layout.segment_ids,
        attention_mask=torch.cat([layout.prefix_mask[layout.prompt_of_row], layout.segment_mask], dim=-1),
        position_ids=layout.segment_pos,
        use_cache=True,
        **cache_kwargs(model, cache),
    )
    return out.logits


def _base(model: Any) -> Any:
    """The Hugging Face model under a wrapper (PEFT, the trainer's reference-model wrappers)."""
    getter = getattr(model, "get_base_model", None)
    return getter() if callable(getter) else model


_CHECKPOINTING = ("is_activation_checkpointing", "is_gradient_checkpointing")


def unsupported_reason(model: Any) -> str | None:
    """Why ``model`` cannot run the shared-prompt forward, or None when it can: it needs a Hugging Face
    config whose cache is plain full-attention :class:`~transformers.cache_utils.DynamicLayer` layers
    (sliding-window layers drop old keys), no gradient checkpointing (a checkpointed layer would write the
    cache again when it recomputes) and no FSDP sharding (two forwards before one backward are untested
    under FSDP2)."""
    from transformers.cache_utils import DynamicCache, DynamicLayer

    base = _base(model)
    config = getattr(base, "config", None)
    if config is None:
        return f"{type(base).__name__} has no Hugging Face config"
    flag = next((f for f in _CHECKPOINTING if hasattr(type(base), f)), None)  # renamed in transformers 5
    if flag is not None and getattr(base, flag):
        return "gradient checkpointing is on"
    if any(hasattr(p, "full_tensor") for p in model.parameters()):
        return "the model is sharded by FSDP2"
    layers = DynamicCache(config=config).layers
    if not layers or any(type(layer) is not DynamicLayer for layer in layers):
        return f"{type(base).__name__}'s cache has sliding-window or other special layers"
    return None


def plan_shared_micro_batches(
    prompts: list[Hashable],
    prompt_lengths: list[int],
    response_lengths: list[int],
    token_budget: int,
    overhead_tokens: int = 128,
) -> tuple[list[list[int]], int]:
    """Micro-batches (row indices) for the shared-prompt forward, and their cost in tokens.

    A micro-batch costs ``G × (P_max - 1) + B × R_max`` tokens (``G`` distinct prompts among its ``B``
    rows) plus ``overhead_tokens`` for each of its two forwards. Its rows obey the per-sample budget,
    ``B × L_max <= token_budget`` (``L`` = prompt + response) unless it is a single unit, so it holds no
    more rows than a per-sample micro-batch and needs no more memory (its activations cover fewer tokens;
    the prompt keys/values gathered to the rows are a small part of a layer's activations). Two plans are
    cut, each by dynamic programming over units sorted by
    longest response (like :func:`~trine.models.batching.plan_micro_batches`), and the cheaper is kept:

    - units = each prompt's rows together (a group too big for the budget alone is cut into chunks,
      longest responses first): a prompt runs once per step, the choice for long prompts;
    - units = single rows: responses of very different lengths are bucketed apart even within a group
      (a prompt then runs once per micro-batch it appears in), the choice for a few long responses among
      many short ones.
    """
    groups: dict[Hashable, list[int]] = {}
    for i, key in enumerate(prompts):
        groups.setdefault(key, []).append(i)
    rank = {key: n for n, key in enumerate(groups)}

    def unit(rows: list[int]) -> _Unit:
        key, prompt = prompts[rows[0]], prompt_lengths[rows[0]]
        resp = max(response_lengths[i] for i in rows)
        return _Unit(rows, key, rank[key], prompt - 1, resp, prompt + resp)

    lengths = [p + r for p, r in zip(prompt_lengths, response_lengths, strict=True)]
    whole = [unit(c) for rows in groups.values() for c in _chunks(rows, lengths, token_budget)]
    single = [unit([i]) for i in range(len(prompts))]
    return min(
        (_cut(whole, token_budget, overhead_tokens), _cut(single, token_budget, overhead_tokens)),
        key=lambda planned: planned[1],
    )


def shared_pays(prompts: list[list[int]], responses: list[int], mode: bool | str = "auto") -> bool:
    """Whether one micro-batch of rows with these ``prompts`` and ``responses`` (lengths) runs the
    shared-prompt forward, by the rule of :func:`~trine.models.batching.choose_micro_batches` for a micro-batch that must stay
    whole (DPO's pairs): ``G × (P_max - 1) + B × R_max`` tokens and two forwards against
    ``B × L_max`` tokens and one, each forward at 128 tokens."""
    if mode is False or any(len(p) < 2 for p in prompts) or not any(responses):
        return False
    if mode is True:
        return True
    distinct = {tuple(p) for p in prompts}
    shared = len(distinct) * (max(map(len, prompts)) - 1) + len(prompts) * max(responses) + 2 * 128
    return shared < len(prompts) * max(len(p) + r for p, r in zip(prompts, responses, strict=True)) + 128


class _Unit(NamedTuple):
    rows: list[int]
    key: Hashable
    rank: int  # first-seen order of the prompt: ties keep a prompt's rows next to each other
    prefix: int  # P - 1
    resp: int  # longest response
    longest: int  # longest row, prompt + response


def _cut(units: list[_Unit], token_budget: int, overhead_tokens: int) -> tuple[list[list[int]], int]:
    """Contiguous micro-batches of ``units`` (sorted by longest response) of least total cost."""
    units = sorted(units, key=lambda u: (-u.resp, -u.prefix, u.rank, u.rows[0]))
    n = len(units)
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for end in range(1, n + 1):
        keys: set[Hashable] = set()
        prefix = rows = longest = 0
        for start in range(end - 1, -1, -1):
            u = units[start]
            keys.add(u.key)
            prefix, rows, longest = max(prefix, u.prefix), rows + len(u.rows), max(longest, u.longest)
            if start < end - 1 and rows * longest > token_budget:  # the per-sample padded size
                break
            tokens = len(keys) * prefix + rows * u.resp  # u.resp: the longest, units sorted
            cost = best[start] + tokens + 2 * overhead_tokens
            if cost < best[end]:
                best[end], cut[end] = cost, start
    plan: list[list[int]] = []
    end = n
    while end > 0:
        plan.append([i for u in units[cut[end] : end] for i in u.rows])
        end = cut[end]
    return plan[::-1], int(best[n])


def _chunks(rows: list[int], lengths: list[int], token_budget: int) -> list[list[int]]:
    """One prompt's rows, longest first, cut into consecutive chunks of ``B × L_max <= token_budget``."""
    rows = sorted(rows, key=lambda i: (-lengths[i], i))
    chunks: list[list[int]] = [[]]
    for i in rows:
        chunk = chunks[-1]
        if chunk and (len(chunk) + 1) * lengths[chunk[0]] > token_budget:
            chunks.append(chunk := [])
        chunk.append(i)
    return chunks
