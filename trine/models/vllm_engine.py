"""``model.engine: vllm``: the explorer samples the policy with an in-process vLLM engine on a GPU.

:class:`VLLMEngine` is a :class:`~trine.models.protocol.RolloutModel` over ``vllm.LLM`` built from the
policy's local directory. It stays **token-in token-out** like :class:`~trine.models.engine.HFEngine`:

- ``await generate(prompt_ids, params)``: requests of concurrent workflows queue up per event loop and are
  handed, as one batch, to the engine's single worker thread, which runs ``LLM.generate`` on them
  (``TokensPrompt`` + one ``vllm.SamplingParams`` per request; vLLM batches continuously *inside* the call).
  A request that arrives while a batch runs waits for the next batch.
- Logprobs: the engine is built with ``logprobs_mode="processed_logprobs"`` and each request asks for
  ``logprobs=0``, so every token comes back with its logprob under the distribution it was *drawn from*:
  ``log_softmax(logits / temperature)``, truncated to the top-k / top-p kept set and renormalised; greedy
  rows report ``log_softmax(logits)``. That is what :mod:`trine.models.sampling` defines and the trainer
  replays. Kernels differ from the trainer's (bf16, fused attention), so the numbers differ slightly:
  the rollout correction (``algorithm`` settings) measures and corrects that gap.
- Text is decoded locally from the tokens (a stop string stays in it, as with ``HFEngine``).
- ``load_weights(state_dict, version)`` copies the trainer's tensors into the running engine in place
  (vLLM's ``reload_weights`` with a weights iterator where the worker has it, else the model's own
  ``load_weights``; both take Hugging Face parameter names) and resets the prefix cache.
- ``sleep()`` / ``wake_up()`` free and restore the engine's GPU memory (``enable_sleep_mode``) so a trainer
  on the same GPU can step in between; see :meth:`VLLMEngine.sleep` for the order of calls.
- Sampling is reproducible: a request without ``SamplingParams.seed`` gets one from the engine's seed
  stream (the engine seed and a request counter), which ``state_dict()`` saves and ``seeded()`` swaps.

vLLM is imported inside functions only; without it the engine raises an ``ImportError`` naming
``pip install -e ".[vllm]"``. The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)
with one GPU (``tensor_parallel_size=1``), so weights move by reference, never through a socket.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trine.config.rollout import VLLMConfig
from trine.models.chat import encode_prompt
from trine.models.queueing import serve_queue
from trine.models.vllm_requests import (
    completions,
    import_vllm,
    llm_kwargs,
    load_into_worker,
    request_seed,
    sampling_kwargs,
)
from trine.types import Completion, SamplingParams

if TYPE_CHECKING:
    from trine.config import ExplorerConfig, ModelConfig

log = logging.getLogger(__name__)


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    seed: int
    future: asyncio.Future | None = None


class VLLMEngine:
    """Rollout engine over an in-process ``vllm.LLM`` on one GPU (see the module docstring).

    Args:
        model: the loaded policy (read for its directory and dtype only; the engine keeps no reference).
        tokenizer: the policy's tokenizer (chat template, decoding).
        max_batch_size: most samples (``n`` summed over requests) handed to one ``LLM.generate`` call.
        seed: seed of the engine (vLLM's global seed and the request seed stream).
        path: the policy's directory (default: ``model.config._name_or_path``).
        trust_remote_code: allow model code shipped inside the model directory.
        gpu_memory_utilization, max_model_len, enforce_eager, enable_prefix_caching, enable_sleep_mode:
            the ``vllm.LLM`` settings of the same names (``model.vllm`` in the config).
        sleep_level: what :meth:`sleep` does by default (1: weights to CPU memory, 2: weights discarded).
        dtype: ``auto`` (the policy's dtype as loaded), ``bfloat16``, ``float16`` or ``float32``.
        engine_args: further ``vllm.LLM`` keyword arguments, passed as they are.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 256,
        seed: int = 0,
        path: str | None = None,
        trust_remote_code: bool = False,
        gpu_memory_utilization: float = 0.5,
        max_model_len: int | None = None,
        enable_sleep_mode: bool = False,
        sleep_level: int = 1,
        enforce_eager: bool = False,
        enable_prefix_caching: bool = True,
        dtype: str = "auto",
        engine_args: dict[str, Any] | None = None,
    ) -> None:
        vllm = import_vllm()
        _require_cuda()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.policy_version = 0
        self.enable_sleep_mode = enable_sleep_mode
        self.sleep_level = sleep_level
        self._seed_stream, self._seed_counter = seed, 0
        self._seed_lock = threading.Lock()
        self._pending: dict[asyncio.AbstractEventLoop, list[_Request]] = {}
        self._serving: dict[asyncio.AbstractEventLoop, asyncio.Task] = {}
        self._asleep = 0  # 0: awake, else the level it sleeps at
        self._weights_awake = True  # the weights' GPU memory is mapped (False during sleep)
        self._weights_valid = True  # False after a level-2 sleep, until load_weights
        self._closed = False
        self._worker_thread: int | None = None
        settings = dict(
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            enable_sleep_mode=enable_sleep_mode,
            enforce_eager=enforce_eager,
            enable_prefix_caching=enable_prefix_caching,
            trust_remote_code=trust_remote_code,
            engine_args=engine_args,
        )
        kwargs = llm_kwargs(model, tokenizer, path, dtype, seed, **settings)
        self._owns_distributed = not _distributed_initialized()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="trine-vllm", initializer=self._mark_worker
        )
        try:  # built on the thread that will make every vLLM call
            self._llm = self._executor.submit(_build_llm, vllm, kwargs).result()
        except BaseException:
            self._executor.shutdown(wait=False)
            raise

    weights = "copy"
    """Where the weights it samples live (:mod:`trine.models.protocol`): its own copy on the GPU, built from
    ``model.path``; the trainer's weights are copied in by :meth:`load_weights`."""

    @classmethod
    def from_config(
        cls, model: Any, tokenizer: Any, section: ModelConfig, explorer: ExplorerConfig, seed: int
    ) -> VLLMEngine:
        """The engine of ``model.engine: vllm`` (the ``model`` config section ``section``): built from
        ``model.path`` with the ``model.vllm`` settings (their defaults without that section). ``model`` None
        (an explorer process loads no policy): ``model.vllm.dtype: auto`` is ``model.dtype``."""
        settings = (section.vllm or VLLMConfig()).model_dump()
        if (
            settings["dtype"] == "auto" and model is None and section.dtype != "auto"
        ):  # no loaded policy to ask
            settings["dtype"] = section.dtype
        return cls(
            model,
            tokenizer,
            max_batch_size=explorer.max_batch_size,
            seed=seed,
            path=section.path,
            trust_remote_code=section.trust_remote_code,
            **settings,
        )

    def _mark_worker(self) -> None:
        self._worker_thread = threading.get_ident()

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the worker thread (all vLLM calls happen there, one at a time) and return its result."""
        if threading.get_ident() == self._worker_thread:
            return fn()
        if self._closed:
            raise RuntimeError("the vllm engine is closed; build a new one")
        return self._executor.submit(fn).result()

    def _next_seed(self) -> int:
        with self._seed_lock:
            self._seed_counter += 1
            return request_seed(self._seed_stream, self._seed_counter - 1)

    # ----------------------------------------------------------------- async API (workflows)
    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        """Sample ``params.n`` completions of ``prompt_ids``; batched with concurrent callers."""
        if not prompt_ids:
            raise ValueError("generate() got an empty prompt; pass at least one token id.")
        if self._closed:
            raise RuntimeError("the vllm engine is closed; build a new one")
        loop = asyncio.get_running_loop()
        request = _Request(list(prompt_ids), params, self._next_seed(), loop.create_future())
        self._pending.setdefault(loop, []).append(request)
        task = self._serving.get(loop)
        if task is None or task.done():
            self._serving[loop] = asyncio.ensure_future(self._serve(loop))
        return await request.future

    async def chat(self, messages: list[dict[str, Any]], params: SamplingParams) -> list[Completion]:
        """Apply the chat template (with the generation prompt) and sample."""
        return await self.generate(self.encode_chat(messages), params)

    def encode_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of ``messages`` rendered with the tokenizer's chat template (generation prompt added)."""
        return encode_prompt(self.tokenizer, messages)

    async def _serve(self, loop: asyncio.AbstractEventLoop) -> None:
        """Hand this loop's queued requests to the worker thread, one batch at a time, until none are left."""
        await serve_queue(
            self._pending[loop],
            self.max_batch_size,
            lambda batch: loop.run_in_executor(self._executor, self._run_batch, batch),
        )
        self._pending.pop(loop, None)
        self._serving.pop(loop, None)

    # ----------------------------------------------------------------- sync API (eval, benchmarks)
    def generate_batch(self, requests: list[tuple[list[int], SamplingParams]]) -> list[list[Completion]]:
        """Sample ``(prompt_ids, params)`` requests in one ``LLM.generate`` call; completions per request."""
        reqs = [_Request(list(ids), params, self._next_seed()) for ids, params in requests]
        return self._call(lambda: self._run_batch(reqs))

    def _run_batch(self, reqs: list[_Request]) -> list[list[Completion]]:
        if self._asleep or not self._weights_valid:
            raise RuntimeError(
                "the vllm engine is asleep (sleep() was called); call wake_up() before sampling"
                if self._weights_valid
                else "the vllm engine's weights were discarded by a level-2 sleep; load_weights() then wake_up()"
            )
        vllm = import_vllm()
        prompts = [vllm.TokensPrompt(prompt_token_ids=r.prompt_ids) for r in reqs]
        params = [vllm.SamplingParams(**sampling_kwargs(r.params, r.seed)) for r in reqs]
        outputs = self._llm.generate(prompts, params, use_tqdm=False)
        version = self.policy_version
        return [completions(r.prompt_ids, o, self.tokenizer, version) for r, o in zip(reqs, outputs)]

    # ----------------------------------------------------------------- weights and GPU memory
    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        """Copy ``state_dict`` (Hugging Face names, any device and float dtype) into the engine in place, between
        two batches; reset the prefix cache (its KV was computed with the old weights). While asleep only
        the weights wake up (the KV cache stays released until :meth:`wake_up`)."""

        def load() -> None:
            if self._asleep and not self._weights_awake:
                self._llm.wake_up(tags=["weights"])
                self._weights_awake = True
            self._llm.collective_rpc(load_into_worker, args=(list(state_dict.items()),))
            self._weights_valid = True
            if not self._asleep:
                self._llm.reset_prefix_cache()
            self.policy_version = version

        self._call(load)

    def sleep(self, level: int | None = None) -> None:
        """Release the engine's GPU memory so a colocated trainer can use it (needs ``enable_sleep_mode``).

        Level 1 moves the weights to CPU memory and drops the KV cache; level 2 drops both (cheaper when new
        weights come anyway). Trine's colocated step is ``sleep()`` → trainer step → ``load_weights(new,
        version)`` → ``wake_up()``. Sampling while asleep is refused. A no-op when already asleep.
        """
        level = self.sleep_level if level is None else level
        if level not in (1, 2):
            raise ValueError(f"sleep(level={level!r}): expected 1 (weights to CPU) or 2 (weights discarded)")
        if not self.enable_sleep_mode:
            raise RuntimeError(
                "the vllm engine was built without sleep mode; set model.vllm.enable_sleep_mode: true to let it "
                "release its GPU memory for a colocated trainer"
            )

        def go() -> None:
            if self._asleep:
                return
            self._llm.sleep(level=level)
            self._asleep, self._weights_awake, self._weights_valid = level, False, level == 1

        self._call(go)

    def wake_up(self) -> None:
        """Restore the GPU memory :meth:`sleep` released (weights, then KV cache) and clear the prefix cache.
        After a level-2 sleep the weights must have been loaded first (:meth:`load_weights`)."""

        def go() -> None:
            if not self._asleep:
                return
            if not self._weights_valid:
                raise RuntimeError(
                    "wake_up() after a level-2 sleep needs new weights first: call load_weights(state_dict, "
                    "version), then wake_up()"
                )
            self._llm.wake_up(tags=["kv_cache"] if self._weights_awake else None)
            self._asleep, self._weights_awake = 0, True
            self._llm.reset_prefix_cache()

        self._call(go)

    @property
    def asleep(self) -> bool:
        """Whether :meth:`sleep` released the engine's memory (and :meth:`wake_up` has not restored it)."""
        return bool(self._asleep)

    # ----------------------------------------------------------------- sampling stream, lifetime
    @contextlib.contextmanager
    def seeded(self, seed: int) -> Iterator[None]:
        """Requests made inside the block draw their seeds from a stream seeded with ``seed``; the previous
        stream continues exactly where it was afterwards."""
        with self._seed_lock:
            saved = (self._seed_stream, self._seed_counter)
            self._seed_stream, self._seed_counter = seed, 0
        try:
            yield
        finally:
            with self._seed_lock:
                self._seed_stream, self._seed_counter = saved

    def state_dict(self) -> dict[str, Any]:
        with self._seed_lock:
            return {
                "policy_version": self.policy_version,
                "seed_stream": self._seed_stream,
                "seed_counter": self._seed_counter,
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._seed_lock:
            self.policy_version = int(state["policy_version"])
            self._seed_stream = int(state.get("seed_stream", self._seed_stream))
            self._seed_counter = int(state.get("seed_counter", 0))

    def close(self) -> None:
        """Shut the engine down and free its GPU memory (waits for a running batch; idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._executor.submit(self._shutdown).result()
        finally:
            self._executor.shutdown(wait=True, cancel_futures=True)

    def _shutdown(self) -> None:
        llm, self._llm = self._llm, None
        core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        del llm, core
        _free_gpu(self._owns_distributed)


def _require_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(
            "model.engine: vllm samples on a CUDA GPU and torch sees none (torch.cuda.is_available() is False); "
            "use model.engine: hf on this machine."
        )


def _distributed_initialized() -> bool:
    import torch.distributed

    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _build_llm(vllm: Any, kwargs: dict[str, Any]) -> Any:
    """``vllm.LLM(**kwargs)`` with its engine core in this process (weights are then loaded by reference)."""
    if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":
        log.warning("VLLM_ENABLE_V1_MULTIPROCESSING=%s ignored: Trine runs vLLM's engine core in-process",
                    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"])  # fmt: skip
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    return vllm.LLM(**kwargs)


def _free_gpu(owns_distributed: bool) -> None:
    """Drop vLLM's process groups (only if vLLM created the default one) and return cached GPU memory."""
    import gc

    import torch

    gc.collect()
    with contextlib.suppress(ImportError):
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()
        if owns_distributed:
            destroy_distributed_environment()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
