"""Turning experiences into padded tensors: length bucketing, token-budget micro-batches.

Sequences are **left-padded** so every row ends at the last column; the response of row ``i``
then fills the last ``R_i`` columns, and one ``logits_to_keep = R + 1`` forward (``R`` the longest
response) yields the logits of every response token without computing the prompt's. All
response-side tensors (``targets``, ``action_mask``, ``old_logprobs``, ``advantages``) are
``[B, R]`` and right-aligned the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from trine.models.sampling import truncated_logprobs
from trine.models.shared_prompt import SharedLayout, plan_shared_micro_batches, shared_layout, shared_logits
from trine.types import Experience


@dataclass
class MicroBatch:
    input_ids: Tensor  # [B, L] left-padded prompt+response
    attention_mask: Tensor  # [B, L]
    position_ids: Tensor  # [B, L]
    targets: Tensor  # [B, R] response tokens, right-aligned
    action_mask: Tensor  # [B, R] float: 1 = trained token
    old_logprobs: Tensor | None  # [B, R] behaviour logprobs (0 where absent)
    temperature: Tensor  # [B, 1, 1]
    rows: list[int]  # indices of the experiences in the step's list
    extras: dict[str, Tensor] = field(default_factory=dict)  # per-token tensors added by the trainer
    truncation: tuple[Tensor, Tensor] | None = None  # per-row (top_k [B, 1], top_p [B, 1]) to replay
    shared: SharedLayout | None = None  # the rows arranged by prompt: the shared-prompt forward runs

    @property
    def num_tokens(self) -> int:
        return int(self.attention_mask.sum())

    @property
    def padded_tokens(self) -> int:
        return self.input_ids.numel()

    @property
    def forward_tokens(self) -> tuple[int, int]:
        """``(real, run)``: the tokens the forward runs over for this micro-batch, without and with its
        pads: the left-padded rows, or with a shared layout its prefix and segment rows (each prompt once)."""
        if self.shared is None:
            return self.num_tokens, self.padded_tokens
        real = int(self.shared.prefix_mask.sum()) + int(self.shared.segment_mask.sum())
        return real, self.shared.forward_tokens


def plan_micro_batches(lengths: list[int], token_budget: int, overhead_tokens: int = 128) -> list[list[int]]:
    """Group sequence indices into micro-batches whose padded size ``B × max_len`` fits the budget.

    Length bucketing: sequences are sorted by length (longest first) and cut into contiguous groups
    by dynamic programming that minimises ``padded tokens + overhead_tokens × micro-batches`` — each
    extra micro-batch costs a fixed launch overhead, each pad token costs compute. A sequence longer
    than the budget gets a micro-batch of its own. The plan depends only on the lengths.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    sizes = [lengths[i] for i in order]
    n = len(sizes)
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for end in range(1, n + 1):
        start = end - 1
        while start >= 0 and (start == end - 1 or (end - start) * sizes[start] <= token_budget):
            cost = best[start] + (end - start) * sizes[start] + overhead_tokens
            if cost < best[end]:
                best[end], cut[end] = cost, start
            start -= 1
    plan: list[list[int]] = []
    end = n
    while end > 0:
        plan.append(order[cut[end] : end])
        end = cut[end]
    return plan[::-1]


def collate(
    experiences: list[Experience],
    rows: list[int],
    pad_id: int,
    device: Any,
    default_temperature: float = 1.0,
    *,
    shared_prompt: bool = False,
) -> MicroBatch:
    """Build a left-padded :class:`MicroBatch` from ``experiences[rows]``; ``shared_prompt``: also its
    :class:`~trine.models.shared_prompt.SharedLayout`, which :func:`forward_logprobs` then runs."""
    exps = [experiences[i] for i in rows]
    width = max(len(e.tokens) for e in exps)
    resp = max(e.response_length for e in exps)
    n = len(exps)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, resp), dtype=torch.float32)
    old = torch.zeros((n, resp), dtype=torch.float32)
    has_old = all(e.logprobs is not None for e in exps)
    temps, top_k, top_p = [], [], []
    for i, e in enumerate(exps):
        if e.prompt_length < 1:
            raise ValueError(
                f"Experience {e.id} has prompt_length={e.prompt_length}; the trainer needs at least "
                "one prompt token before the response (e.g. a BOS or chat-template token)."
            )
        ids[i, width - len(e.tokens) :] = torch.tensor(e.tokens, dtype=torch.long)
        attn[i, width - len(e.tokens) :] = 1
        r = e.response_length
        if r:
            mask[i, resp - r :] = torch.tensor(e.action_mask, dtype=torch.float32)
            if has_old:
                old[i, resp - r :] = torch.tensor(e.logprobs, dtype=torch.float32)
        t = e.info.get("temperature", default_temperature)
        temps.append(t if t and t > 0 else 1.0)
        top_k.append(int(e.info.get("top_k") or 0))
        top_p.append(float(e.info.get("top_p") or 1.0))
    truncation = None
    if any(k > 0 for k in top_k) or any(p < 1 for p in top_p):
        truncation = (
            torch.tensor(top_k, dtype=torch.long, device=device).view(-1, 1),
            torch.tensor(top_p, dtype=torch.float32, device=device).view(-1, 1),
        )
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return MicroBatch(
        input_ids=ids.to(device),
        attention_mask=attn.to(device),
        position_ids=pos.to(device),
        targets=ids[:, width - resp :].to(device),
        action_mask=mask.to(device),
        old_logprobs=old.to(device) if has_old else None,
        temperature=torch.tensor(temps, dtype=torch.float32, device=device).view(-1, 1, 1),
        rows=list(rows),
        truncation=truncation,
        shared=shared_layout(
            [e.tokens[: e.prompt_length] for e in exps], [e.response_tokens for e in exps], pad_id, device
        )
        if shared_prompt and resp > 0
        else None,
    )


def choose_micro_batches(
    prompts: list[list[int]],
    responses: list[int],
    token_budget: int,
    mode: bool | str = "auto",
    packed: bool = False,
) -> tuple[list[list[int]], bool]:
    """The micro-batches (row indices) of rows with these ``prompts`` (token lists) and ``responses``
    (lengths), and whether they run the shared-prompt forward — the one rule of the trainer, DPO pairs and
    response scoring (a teacher's logprobs).

    ``mode`` False: the per-sample plan (:func:`plan_micro_batches`, bucketed by
    length). True or ``"auto"``: the shared-prompt plan (:func:`~trine.models.shared_prompt.plan_shared_micro_batches`) when every
    prompt holds >= 2 tokens and some response >= 1; ``"auto"`` keeps it only when it runs fewer tokens
    than the per-sample plan, each forward counted at the planners' 128-token overhead (``packed``: the
    per-sample forward runs without pads, its cost is its tokens).
    """
    lengths = [len(p) + r for p, r in zip(prompts, responses, strict=True)]
    plan = plan_micro_batches(lengths, token_budget)
    if mode is False or any(len(p) < 2 for p in prompts) or not any(responses):
        return plan, False
    shared, cost = plan_shared_micro_batches(
        [tuple(p) for p in prompts], [len(p) for p in prompts], responses, token_budget
    )
    if mode == "auto":
        sizes = [sum(lengths[i] for i in b) if packed else len(b) * max(lengths[i] for i in b) for b in plan]
        if cost >= sum(sizes) + 128 * len(plan):
            return plan, False
    return shared, True


def right_align(values: list[list[float]], resp: int, device: Any) -> Tensor:
    """Right-align per-response-token lists into a ``[B, resp]`` float tensor."""
    out = torch.zeros((len(values), resp), dtype=torch.float32)
    for i, v in enumerate(values):
        if v:
            out[i, resp - len(v) :] = torch.tensor(v, dtype=torch.float32)
    return out.to(device)


def forward_logprobs(
    model: Any, batch: MicroBatch, *, entropy_fn: Any = None, entropy_grad: bool = False, packed: bool = False
) -> tuple[Tensor, Tensor | None]:
    """Per-token logprobs ``[B, R]`` of ``batch.targets`` under ``model`` (temperature-scaled).

    ``log π(y_t) = z_{y_t}/T - logsumexp(z/T)`` from the logits of the positions that predict the
    response tokens only (``logits_to_keep``). Rows sampled with top-k / top-p (``batch.truncation``)
    replay the truncation: ``log π_trunc(y)`` over the kept set (:func:`truncated_logprobs`), which is
    what the engine reported. With ``entropy_fn`` also the per-token entropy of the untruncated
    distribution (with gradient only when ``entropy_grad``, for an entropy bonus). ``packed``: one
    forward over the rows packed without padding (:func:`packed_logits`), same numbers up to kernel
    rounding. A batch collated with ``shared_prompt`` runs each distinct prompt once
    (:func:`~trine.models.shared_prompt.shared_logits`), also the same numbers up to float rounding.
    """
    if batch.shared is not None:
        logits = shared_logits(model, batch.shared)
    else:
        logits = (packed_logits if packed else padded_logits)(model, batch)
    logits = logits.float() / batch.temperature
    if batch.truncation is None:
        logprobs = logits.gather(-1, batch.targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(
            logits, dim=-1
        )
    else:
        logprobs = truncated_logprobs(logits, batch.targets, *batch.truncation)
    entropy = None
    if entropy_fn is not None:
        if entropy_grad:
            entropy = entropy_fn(logits)
        else:
            with torch.no_grad():
                entropy = entropy_fn(logits.detach())
    return logprobs, entropy


def padded_logits(model: Any, batch: MicroBatch) -> Tensor:
    """``[B, R, V]`` logits predicting the right-aligned targets, from the left-padded rows."""
    resp = batch.targets.shape[1]
    out = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
        logits_to_keep=resp + 1,
    )
    return out.logits[:, :-1]


def packed_logits(model: Any, batch: MicroBatch) -> Tensor:
    """``[B, R, V]`` logits like :func:`padded_logits`, from one row holding every sequence back to back
    (no pad tokens; position ids restart at 0 per sequence, which transformers turns into a
    block-diagonal causal mask, or varlen kernels under flash attention). Only the positions that
    predict a target are projected to the vocabulary (``logits_to_keep`` as indices)."""
    lengths = batch.attention_mask.sum(-1)
    resp = batch.targets.shape[1]
    real = batch.attention_mask.bool()
    ids = batch.input_ids[real].unsqueeze(0)
    positions = batch.position_ids[real].unsqueeze(0)
    offsets = torch.cumsum(lengths, 0) - lengths
    # target column j of row i sits at real position L_i - R + j and is predicted by the one before it
    cols = torch.arange(resp, device=ids.device)
    source = lengths[:, None] - resp + cols[None, :] - 1
    index = (offsets[:, None] + source.clamp(min=0)).flatten()  # columns before the row: any position
    out = model(input_ids=ids, position_ids=positions, use_cache=False, logits_to_keep=index)
    return out.logits[0].view(len(lengths), resp, -1)


@torch.no_grad()
def response_logprobs(
    model: Any,
    pairs: list[tuple[list[int], list[int]]],
    *,
    pad_id: int,
    token_budget: int = 8192,
    temperature: float = 1.0,
    shared_prompt: bool | str = False,
) -> list[list[float]]:
    """Per-token logprobs of each response given its prompt, ``[(prompt_ids, response_ids), ...]``.

    The one scoring path for every model that only reads sequences (a teacher, a judge, difficulty
    scoring): the same length-bucketed, left-padded ``logits_to_keep`` forward as the trainer, without
    gradients. An empty response gets ``[]``; a prompt must hold at least one token. ``shared_prompt``
    (True / ``"auto"``, for a model that can run it: :func:`~trine.models.shared_prompt.unsupported_reason`)
    runs each distinct prompt once (:func:`choose_micro_batches`): a teacher
    scoring GRPO groups reads each prompt once per group, same numbers up to float rounding.
    """
    exps = [
        Experience(
            tokens=list(p) + list(r),
            prompt_length=len(p),
            action_mask=[1] * len(r),
            info={"temperature": temperature},
        )
        for p, r in pairs
    ]
    out: list[list[float]] = [[] for _ in pairs]
    live = [i for i, (_, r) in enumerate(pairs) if r]
    device = next(model.parameters()).device
    plans, shared = choose_micro_batches(
        [list(pairs[i][0]) for i in live], [len(pairs[i][1]) for i in live], token_budget, shared_prompt
    )
    for plan in plans:
        rows = [live[j] for j in plan]
        logprobs, _ = forward_logprobs(model, collate(exps, rows, pad_id, device, shared_prompt=shared))
        width = logprobs.shape[1]
        for k, row in enumerate(rows):
            out[row] = logprobs[k, width - len(pairs[row][1]) :].tolist()
    return out
