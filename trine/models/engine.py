"""The built-in rollout engine: batched sampling from any HF causal LM, as an async service.

Concurrent workflows ``await engine.generate(...)``/``engine.chat(...)``; requests that arrive
while the engine is busy are batched together and run in one sampling loop on a worker thread,
so the event loop stays free for rewards and environments.

The sampling loop prefills each distinct prompt once, expands the KV cache to the ``n`` samples
of its request, then decodes token by token with per-row temperature / top-p / top-k / max_tokens /
stop tokens / stop strings. Finished rows are dropped from the batch (and the cache) as they end.
Returned logprobs are those of the distribution each token was drawn from: ``log_softmax(logits /
temperature)``, truncated to the top-k / top-p kept set and renormalised when the row truncates
(:mod:`trine.models.sampling`, which the trainer replays); greedy rows (temperature 0) report
``log_softmax(logits)``.

**Partial rollout** (``partial_rollout=True``, ``explorer.partial_rollout`` in the config): work handed to
the worker thread while a generation runs (:meth:`HFEngine.call`: new weights, a colocated trainer step)
runs *between two tokens* instead of after the generation. When it brought new weights, the rows still
decoding go on under them: their KV cache is recomputed with the new weights over prompt + tokens so far,
and each token keeps the version and the behaviour logprob it was sampled with
(``Completion.token_versions``).

**Prefix reuse** (``prefix_cache_tokens``, on by default): the KV cache of every finished row is kept
(least recently used out, within a token budget; dropped whenever the weights change), and a request whose
prompt extends a kept sequence — a multi-turn workflow's next turn — prefills only the new tokens
(:mod:`trine.models.prefix_cache`). Only how the first logits are computed changes (float noise); the
decode loop and the sampling stream are the same.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from trine.models.chat import encode_prompt
from trine.models.kv_cache import cache_kwargs
from trine.models.prefix_cache import (
    Prefill,
    PrefixCache,
    prefill,
    row_kv,
    supports_prefix_reuse,
    weights_fingerprint,
)
from trine.models.queueing import serve_queue
from trine.models.sampling import kept_set
from trine.types import Completion, SamplingParams


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future | None = None


class HFEngine:
    """Rollout engine over a ``transformers`` causal LM (shared with the trainer when colocated).

    Args:
        model, tokenizer: the causal LM and its tokenizer.
        max_batch_size: most rows (samples) in one sampling loop.
        seed: seed of the sampling stream.
        partial_rollout: run :meth:`call` jobs between two tokens (see the module docstring).
        prefix_cache_tokens: budget, in cached tokens, of the KV kept from finished rows for continuations
            on the model's device (0: off). Costs per token ``2 * layers * kv_heads * head_dim`` values.
    """

    weights = "given"
    """Where the weights it samples live (:mod:`trine.models.protocol`): the ``model`` it is built on."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 256,
        seed: int = 0,
        partial_rollout: bool = False,
        prefix_cache_tokens: int = 32768,
    ) -> None:
        self.model = model
        self.partial_rollout = partial_rollout
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.policy_version = 0
        self.generator = torch.Generator(device=model.device).manual_seed(seed)
        self.eos_ids = _eos_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self._pending: list[_Request] = []
        self._worker: asyncio.Task | None = None
        self._worker_thread: int | None = None
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="trine-engine", initializer=self._mark_worker
        )
        self._decoding = False  # a sampling loop runs (partial rollout: jobs wait in _between)
        self._between: list[tuple[concurrent.futures.Future, Callable[[], Any]]] = []
        self._between_lock = threading.Lock()
        self.prefix_cache: PrefixCache | None = None
        """KV of finished sequences kept for continuations (None: off, or the model's cache layout has
        special layers); see :mod:`trine.models.prefix_cache`."""
        if prefix_cache_tokens and supports_prefix_reuse(model):
            self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self._prefix_paused = 0  # inside seeded(): no reuse, nothing stored

    def _mark_worker(self) -> None:
        self._worker_thread = threading.get_ident()
        self._worker_handle = threading.current_thread()

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` on the engine's worker thread, wait, and return its result.

        Sampling always runs there, and colocated training (the trainer's step, teacher scoring)
        goes through here too, so that all heavy torch work of a process runs on **one thread**.
        With torch's OpenMP CPU backend (libgomp) every thread that runs parallel ops gets its own
        thread team; once two teams exist on a small machine, libgomp stops spin-waiting between
        ops, its workers sleep and wake for every op, and a GRPO step on 2 cores took 1.6x longer
        (measured in benchmarks/RESULTS.md). Called from the worker itself, ``fn`` runs inline.

        With ``partial_rollout``, ``fn`` does not wait for a running generation to end: it runs between
        two of its tokens (see the module docstring).
        """
        if threading.get_ident() == self._worker_thread:
            return fn(*args, **kwargs)
        if self.partial_rollout:
            with self._between_lock:
                job: concurrent.futures.Future | None = None
                if self._decoding:
                    job = concurrent.futures.Future()
                    self._between.append((job, lambda: fn(*args, **kwargs)))
            if job is not None:
                return job.result()
        return self._executor.submit(fn, *args, **kwargs).result()

    def _run_between(self, final: bool = False) -> bool:
        """Run the jobs that arrived during the generation (worker thread, outside inference mode);
        ``final``: the generation ends, no more jobs may queue. Returns whether any ran."""
        with self._between_lock:
            jobs, self._between = self._between, []
            if final:
                self._decoding = False
        for job, fn in jobs:
            if job.set_running_or_notify_cancel():
                try:
                    with torch.inference_mode(False), torch.enable_grad():
                        job.set_result(fn())
                except BaseException as err:  # handed to the caller
                    job.set_exception(err)
        return bool(jobs)

    # ----------------------------------------------------------------- async API (workflows)
    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        """Sample ``params.n`` completions of ``prompt_ids``; batched with concurrent callers."""
        if not prompt_ids:
            raise ValueError("generate() got an empty prompt; pass at least one token id.")
        request = _Request(list(prompt_ids), params, asyncio.get_running_loop().create_future())
        self._pending.append(request)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.ensure_future(self._serve())
        return await request.future

    async def chat(self, messages: list[dict[str, str]], params: SamplingParams) -> list[Completion]:
        """Apply the chat template (with the generation prompt) and sample."""
        return await self.generate(self.encode_chat(messages), params)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        return encode_prompt(self.tokenizer, messages)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        await serve_queue(
            self._pending,
            self.max_batch_size,
            lambda batch: loop.run_in_executor(self._executor, self.generate_batch, batch),
        )

    # ----------------------------------------------------------------- sync API (eval, benchmarks)
    def generate_batch(
        self, requests: list[_Request] | list[tuple[list[int], SamplingParams]]
    ) -> list[list[Completion]]:
        """Run requests to completion in one sampling loop (on the worker thread, see :meth:`call`);
        returns completions per request."""
        if threading.get_ident() != self._worker_thread:
            return self.call(self.generate_batch, requests)
        reqs = [r if isinstance(r, _Request) else _Request(list(r[0]), r[1]) for r in requests]
        was_training = self.model.training
        self.model.eval()
        if self.partial_rollout:
            with self._between_lock:
                self._decoding = True
        # FSDP2's gathered parameters must not become inference tensors (the next training step reuses
        # their buffers): a sharded policy samples under no_grad
        sharded = any(hasattr(p, "full_tensor") for p in self.model.parameters())
        try:
            with torch.no_grad() if sharded else torch.inference_mode():
                flat = self._sample(reqs)
        finally:
            self.model.train(was_training)
            if self.partial_rollout:
                self._run_between(final=True)
        out, i = [], 0
        for r in reqs:
            out.append(flat[i : i + r.params.n])
            i += r.params.n
        return out

    def load_weights(self, state_dict: dict[str, Tensor], version: int) -> None:
        """Copy new weights into the engine's model (no-op copy when they are the same tensors), on the
        worker thread: between two generations, never while one runs."""

        def load() -> None:
            self.model.load_state_dict(state_dict)
            self.policy_version = version
            if self.prefix_cache is not None:
                self.prefix_cache.clear()

        self.call(load)

    @contextlib.contextmanager
    def seeded(self, seed: int) -> Iterator[None]:
        """Sample from a stream seeded with ``seed`` inside the block; the previous stream resumes after.
        Prefix reuse is paused inside (nothing reused or stored), so evaluation is undisturbed."""
        saved = self.generator.get_state()
        self.generator.manual_seed(seed)
        self._prefix_paused += 1  # evaluation samples exactly as without the prefix cache
        try:
            yield
        finally:
            self._prefix_paused -= 1
            self.generator.set_state(saved)

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state(), "policy_version": self.policy_version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        self.policy_version = state["policy_version"]

    def close(self, timeout: float = 10.0) -> None:
        """End the worker thread: queued calls are cancelled, a running one gets ``timeout`` seconds to
        finish (a stuck one is left behind rather than hanging the caller; :func:`trine.blocking.exit_guard`
        still ends the process)."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        worker = getattr(self, "_worker_handle", None)
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout)

    # ----------------------------------------------------------------- the sampling loop
    def _sample(self, reqs: list[_Request]) -> list[Completion]:
        device = self.model.device
        params = [r.params for r in reqs]
        first, store = self._prefill(reqs)
        cache = first.cache
        expand = torch.tensor([u for u, p in enumerate(params) for _ in range(p.n)], device=device)
        logits = first.logits[expand]
        if expand.numel() != len(reqs) or bool((expand != torch.arange(len(reqs), device=device)).any()):
            cache.batch_select_indices(expand)
        rows = _RowParams(
            [p for p in params for _ in range(p.n)],
            [r.prompt_ids for r in reqs for _ in range(r.params.n)],
            self.eos_ids,
            device,
        )
        width, mask = first.mask.shape[1], first.mask[expand]
        mask = torch.cat([mask, mask.new_zeros(len(expand), rows.max_new)], dim=-1)  # filled as we go
        batch = _Batch(rows, mask, first.next_pos[expand])
        state = _DecodeState(rows.size, rows.max_new, self.pad_id, device)
        for t in range(rows.max_new):
            tok, lp = self._pick(logits, batch)
            state.tokens[batch.active, t] = tok  # rows that already ended write past their length: ignored
            state.logprobs[batch.active, t] = lp
            state.versions.append(self.policy_version)  # of the weights that computed these logits
            ended, stopped = batch.ended(tok, t, state, self.tokenizer)
            if bool(ended.any()):
                rows_ended = batch.active[ended]
                if store is not None:
                    self._keep_prefixes(store, cache, batch, ended, state, width, t)
                state.length[rows_ended] = t + 1
                state.stopped[rows_ended] = stopped[ended]
                batch.alive &= ~ended
                batch.dead += int(ended.sum())
                if batch.dead == len(batch.alive):
                    break
                if 4 * batch.dead >= len(batch.alive):  # drop ended rows (and their cache) in bulk
                    keep = batch.compact()
                    cache.batch_select_indices(keep)
                    tok = tok[keep]
            batch.mask[:, width + t] = 1
            version = self.policy_version
            if self._between and self._run_between():
                store = None  # the jobs may have changed the weights: keep no KV from here on
                if self.policy_version != version:
                    cache, width, logits = self._reprefill(batch, state, t, rows)  # partial rollout
                    continue
            out = self.model(
                input_ids=tok[:, None],
                attention_mask=batch.mask[:, : width + t + 1],
                position_ids=batch.next_pos[:, None],
                use_cache=True,
                **cache_kwargs(self.model, cache),
            )
            batch.next_pos += 1
            logits = out.logits[:, -1].float()
        return state.completions(rows, self.tokenizer)

    def _reprefill(
        self, batch: _Batch, state: _DecodeState, t: int, rows: _RowParams
    ) -> tuple[Any, int, Tensor]:
        """New weights arrived after token ``t``: recompute the KV cache of the rows still decoding over
        prompt + tokens ``0..t`` under them. Returns the cache, the ``width`` that keeps the loop's column
        arithmetic (``width + t + 1`` = the next token's column) and the logits of the next token."""
        if batch.dead:
            batch.compact()
        if self.prefix_cache is not None:
            self.prefix_cache.clear()  # computed with the old weights
        active = batch.active.tolist()
        seqs = [rows.prompts[r] + state.tokens[r, : t + 1].tolist() for r in active]
        left = rows.max_new - t - 1
        fresh = prefill(self.model, seqs, [None] * len(seqs), self.pad_id, left)  # no reuse: new weights
        batch.mask = torch.cat([fresh.mask, fresh.mask.new_zeros(len(active), left)], dim=-1)
        batch.next_pos = fresh.next_pos
        return fresh.cache, fresh.mask.shape[1] - t - 1, fresh.logits

    def _prefill(self, reqs: list[_Request]) -> tuple[Prefill, PrefixCache | None]:
        """Prefill each request's prompt once, from the longest kept prefix it extends (if any); returns it
        and the prefix cache to keep the rows' KV in when they end (None: prefix reuse off or paused)."""
        store = self.prefix_cache
        if store is not None and not self._prefix_paused:
            store.check((self.policy_version, weights_fingerprint(self.model)))  # empties it on new weights
            hits = [store.match(r.prompt_ids) for r in reqs]
        else:
            store, hits = None, [None] * len(reqs)
        extra = max(r.params.max_tokens for r in reqs)
        return prefill(self.model, [r.prompt_ids for r in reqs], hits, self.pad_id, extra), store

    @staticmethod
    def _keep_prefixes(
        store: PrefixCache, cache: Any, batch: _Batch, ended: Tensor, state: _DecodeState, width: int, t: int
    ) -> None:
        """Store the KV of the rows that end at step ``t``: prompt + sampled tokens ``0..t-1`` (token ``t``
        was never fed back), the first ``width + t`` columns of the cache where the row's mask is 1."""
        for i in ended.nonzero().squeeze(-1).tolist():
            row = int(batch.active[i])
            tokens = batch.rows.prompts[row] + state.tokens[row, :t].tolist()
            keys, values = row_kv(cache, i, batch.mask[i, : width + t].bool())
            store.put(tokens, keys, values)

    def _pick(self, logits: Tensor, batch: _Batch) -> tuple[Tensor, Tensor]:
        """Next token per row (greedy rows: argmax) and its logprob under ``logits / temperature``,
        truncated and renormalised for rows sampled with top-k / top-p (:mod:`trine.models.sampling`)."""
        logp = torch.log_softmax(logits / batch.temperature[:, None] if batch.any_sampled else logits, dim=-1)
        if not batch.any_sampled:
            tok = logp.argmax(-1)
        else:
            filtered = logp
            if batch.any_filter:
                filtered = logp.masked_fill(~kept_set(logp, batch.top_k, batch.top_p), float("-inf"))
            tok = torch.multinomial(filtered.exp(), 1, generator=self.generator).squeeze(-1)
            for i, gen in batch.seeded():
                tok[i] = torch.multinomial(filtered[i].exp(), 1, generator=gen)[0]
            if batch.any_greedy:
                tok = torch.where(batch.greedy, logp.argmax(-1), tok)
            if batch.any_filter:  # the truncated distribution's logprob (trine.models.sampling)
                chosen = filtered.gather(-1, tok[:, None]).squeeze(-1) - torch.logsumexp(filtered, dim=-1)
                truncating = ((batch.top_k > 0) | (batch.top_p < 1)) & ~batch.greedy
                return tok, torch.where(truncating, chosen, logp.gather(-1, tok[:, None]).squeeze(-1))
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


class _Batch:
    """The rows currently in the decode batch, with their settings gathered once (re-gathered only
    when ended rows are dropped)."""

    def __init__(self, rows: _RowParams, mask: Tensor, next_pos: Tensor) -> None:
        self.rows, self.mask, self.next_pos = rows, mask, next_pos
        self.active = torch.arange(rows.size, device=mask.device)
        self.alive = torch.ones(rows.size, dtype=torch.bool, device=mask.device)
        self.dead = 0
        self._gather(self.active)

    def _gather(self, index: Tensor) -> None:
        r = self.rows
        self.greedy = r.temperature[index] <= 0
        self.temperature = torch.where(self.greedy, 1.0, r.temperature[index])
        self.top_k, self.top_p = r.top_k[index], r.top_p[index]
        self.stop_ids, self.max_tokens = r.stop_ids[index], r.max_tokens[index]
        self.min_max_tokens = int(self.max_tokens.min())
        self.any_greedy = bool(self.greedy.any())
        self.any_sampled = not bool(self.greedy.all())
        self.any_filter = r.any_filter and bool(((self.top_k > 0) | (self.top_p < 1)).any())

    def compact(self) -> Tensor:
        keep = self.alive.nonzero().squeeze(-1)
        self.active, self.mask, self.next_pos = self.active[keep], self.mask[keep], self.next_pos[keep]
        self.alive, self.dead = self.alive[keep], 0
        self._gather(self.active)
        return keep

    def seeded(self) -> list[tuple[int, torch.Generator]]:
        gens = self.rows.generators
        return [(i, gens[r]) for i, r in enumerate(self.active.tolist()) if r in gens] if gens else []

    def ended(self, tok: Tensor, t: int, state: _DecodeState, tokenizer: Any) -> tuple[Tensor, Tensor]:
        """(rows that end at step ``t``, which of them ended on a stop token/string)."""
        stopped = (self.stop_ids == tok[:, None]).any(-1)
        ended = stopped | (self.max_tokens <= t + 1) if t + 1 >= self.min_max_tokens else stopped.clone()
        if self.rows.stop_strings:
            for i, row in enumerate(self.active.tolist()):
                strings = self.rows.stop_strings.get(row)
                if strings and not bool(ended[i]):
                    tail = tokenizer.decode(state.tokens[row, max(0, t - 15) : t + 1].tolist())
                    if any(x in tail for x in strings):
                        ended[i] = stopped[i] = True
        return ended & self.alive, stopped


class _RowParams:
    """Per-row sampling settings as tensors, plus the Python-side stop-string data."""

    def __init__(
        self, params: list[SamplingParams], prompts: list[list[int]], eos_ids: list[int], device: Any
    ):
        self.size = len(params)
        self.params = params
        self.prompts = prompts
        self.temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device)
        self.top_k = torch.tensor([p.top_k for p in params], dtype=torch.long, device=device)
        self.top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device)
        self.max_tokens = torch.tensor([p.max_tokens for p in params], dtype=torch.long, device=device)
        self.max_new = max(p.max_tokens for p in params)
        self.any_filter = any(p.top_k > 0 or p.top_p < 1 for p in params)
        stops = [([] if p.ignore_eos else list(eos_ids)) + list(p.stop_token_ids) for p in params]
        width = max(1, max(len(s) for s in stops))
        self.stop_ids = torch.tensor(
            [s + [-1] * (width - len(s)) for s in stops], dtype=torch.long, device=device
        )
        self.stop_strings = {i: p.stop for i, p in enumerate(params) if p.stop}
        self.generators: dict[int, torch.Generator] = {}
        counts: dict[int, int] = {}
        for i, p in enumerate(params):
            if p.seed is not None:
                j = counts.setdefault(id(p), 0)
                counts[id(p)] = j + 1
                self.generators[i] = torch.Generator(device=device).manual_seed(p.seed + j)


class _DecodeState:
    """Token/logprob buffers for all rows and where each row ended."""

    def __init__(self, size: int, max_new: int, pad_id: int, device: Any):
        self.tokens = torch.full((size, max_new), pad_id, dtype=torch.long, device=device)
        self.logprobs = torch.zeros((size, max_new), dtype=torch.float32, device=device)
        self.length = torch.full((size,), max_new, dtype=torch.long, device=device)
        self.stopped = torch.zeros((size,), dtype=torch.bool, device=device)
        self.versions: list[int] = []  # weights version of each decode step (the same for every row)

    def completions(self, rows: _RowParams, tokenizer: Any) -> list[Completion]:
        tokens, logprobs = self.tokens.cpu().tolist(), self.logprobs.cpu().tolist()
        lengths, stopped = self.length.tolist(), self.stopped.tolist()
        out = []
        for i in range(rows.size):
            response = tokens[i][: lengths[i]]
            versions = self.versions[: lengths[i]]
            out.append(
                Completion(
                    prompt_ids=rows.prompts[i],
                    response_ids=response,
                    logprobs=logprobs[i][: lengths[i]],
                    text=tokenizer.decode(response, skip_special_tokens=True),
                    finish_reason="stop" if stopped[i] else "length",
                    policy_version=versions[0] if versions else None,
                    token_versions=versions if versions and versions[0] != versions[-1] else None,
                )
            )
        return out


def _eos_ids(model: Any, tokenizer: Any) -> list[int]:
    ids = model.generation_config.eos_token_id if getattr(model, "generation_config", None) else None
    ids = ids if ids is not None else tokenizer.eos_token_id
    if ids is None:
        raise ValueError(
            "the model and tokenizer define no eos token; set eos_token in the tokenizer config."
        )
    ids = [ids] if isinstance(ids, int) else list(ids)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids
