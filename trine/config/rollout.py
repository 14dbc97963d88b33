"""Config sections of the rollout side: the model, sampling, tasksets and tasks, auxiliary models, the
explorer (re-exported by :mod:`trine.config`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from trine.config.base import (
    Count,
    NonNeg,
    NonNegInt,
    Positive,
    Section,
    _check_name,
    _resolve_path,
)
from trine.config.checks import argument_problems, source_problems
from trine.config.engines import RESERVED_ENGINE_ARGS, VLLM_ENGINES


class VLLMConfig(Section):
    """``model.engine: vllm``: the in-process vLLM engine on one GPU (:mod:`trine.models.vllm_engine`)."""

    gpu_memory_utilization: Annotated[float, Field(gt=0, le=1)] = 0.5
    """Share of the GPU's memory vLLM takes for weights, activations and KV cache (the rest is left to a
    trainer on the same GPU)."""
    max_model_len: Count | None = None
    """Longest prompt + response in tokens (None: the model's ``max_position_embeddings``); a lower value
    shrinks the KV cache vLLM must be able to hold."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """vLLM's weights and compute dtype: ``auto`` is the policy's dtype as Trine loads it (``model.dtype``),
    the one the trainer computes logprobs in."""
    enforce_eager: bool = False
    """Run without CUDA graphs (slower decoding, faster start, less memory)."""
    enable_prefix_caching: bool = True
    """Reuse the KV cache of shared prompt prefixes (multi-turn continuations, the ``n`` samples of a
    prompt); cleared whenever new weights are loaded."""
    enable_sleep_mode: bool = False
    """Let the engine release its GPU memory while a trainer on the same GPU steps (``sleep()`` /
    ``wake_up()``); needs vLLM's CuMem allocator (CUDA)."""
    sleep_level: Literal[1, 2] = 1
    """With ``enable_sleep_mode``: 1 moves the weights to CPU memory and drops the KV cache, 2 drops both
    (less CPU memory; the trainer's new weights are loaded before the engine wakes)."""
    engine_args: dict[str, Any] = {}
    """Further keyword arguments of ``vllm.LLM`` (vLLM's ``EngineArgs``: ``max_num_seqs``,
    ``kv_cache_memory_bytes``, ``attention_config``...), passed as they are; not the ones above or those
    Trine sets itself (``model``, ``tokenizer``, ``seed``, ``tensor_parallel_size``, ``logprobs_mode``,
    ``trust_remote_code``)."""

    @field_validator("engine_args")
    @classmethod
    def _own_args(cls, v: dict[str, Any]) -> dict[str, Any]:
        clash = sorted(RESERVED_ENGINE_ARGS & set(v))
        if clash:
            raise ValueError(
                f"model.vllm.engine_args sets {clash}, which Trine sets itself; use the model.vllm fields "
                "(gpu_memory_utilization, max_model_len, dtype, ...) or model.path / model.trust_remote_code"
            )
        return v


class ModelConfig(Section):
    path: str = "model"
    """Local directory of a Hugging Face causal LM (config.json, weights, tokenizer)."""
    init_preset: str | None = None
    """If set and ``path`` does not exist, build this tiny model there first (``trine init-model``)."""
    tokenizer_path: str | None = None
    """Tokenizer directory when it differs from ``path``."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights dtype: ``auto`` is bfloat16 on GPU and float32 on CPU."""
    device: str = "auto"
    """``auto`` (cuda if available, else cpu), ``cpu``, ``cuda``, ``cuda:1``..."""
    trust_remote_code: bool = False
    """Allow model code shipped inside the model directory."""
    engine: str = "hf"
    """Rollout engine: ``hf`` (batched sampling from the local HF model, CPU or GPU), ``vllm`` (vLLM in this
    process on a GPU, ``model.vllm``; docs/vllm.md), ``openai`` (an OpenAI-compatible server that returns token
    ids and logprobs: ``trine serve`` on the run directory, vLLM's server; the tokenizer stays local) or
    ``package.module:Class`` (see ``trine.models.protocol``)."""
    base_url: str | None = None
    """``engine: openai``: the server's ``/v1`` URL, e.g. ``http://127.0.0.1:8000/v1``."""
    served_model: str | None = None
    """``engine: openai``: the model name the server expects (``/v1/models`` lists it; for ``trine serve``:
    ``serve.model_name``, else the run's ``name``)."""
    api_key_env: str | None = None
    """``engine: openai``: environment variable holding the server's API key (never the key itself)."""
    timeout: Positive | None = None
    """``engine: openai``: seconds one request may take (default 120); the task fails and is retried after."""
    vllm: VLLMConfig | None = None
    """``engine: vllm``: the vLLM engine's settings (None: the defaults of each field)."""

    _paths = field_validator("path", "tokenizer_path")(_resolve_path)
    _preset = field_validator("init_preset")(lambda v: _check_name("model_preset", v))
    _engine = field_validator("engine")(lambda v: _check_name("engine", v))

    @model_validator(mode="after")
    def _exists(self) -> ModelConfig:
        if self.init_preset is None and not Path(self.path).exists():
            raise ValueError(
                f"model.path {self.path!r} does not exist. Build a tiny test model with "
                f"`trine init-model tiny-1m {self.path}` or set model.init_preset to build it automatically."
            )
        return self

    @model_validator(mode="after")
    def _vllm(self) -> ModelConfig:
        if self.engine not in VLLM_ENGINES:
            if self.vllm is not None:
                raise ValueError(
                    f"model.vllm is read only by model.engine: vllm (engine is {self.engine!r}); remove it or "
                    "set engine: vllm"
                )
            return self
        if self.device == "cpu" or self.device.startswith("cpu:"):
            raise ValueError(
                f"model.engine: vllm samples on a CUDA GPU but model.device is {self.device!r}; set model.device: "
                "auto or cuda, or use model.engine: hf on a CPU"
            )
        return self

    @model_validator(mode="after")
    def _remote(self, info: ValidationInfo) -> ModelConfig:
        remote = ("base_url", "served_model", "api_key_env", "timeout")
        if self.engine != "openai":
            given = [k for k in remote if getattr(self, k) is not None]
            if given:
                raise ValueError(
                    f"model.{given[0]} is read only by model.engine: openai (engine is {self.engine!r}); "
                    "remove it or set engine: openai"
                )
            return self
        problems = [
            f"model.engine: openai needs model.{key} ({what})"
            for key, what in (
                ("base_url", "the server's /v1 URL, e.g. http://127.0.0.1:8000/v1"),
                ("served_model", "the model name the server serves, as /v1/models lists it"),
            )
            if not getattr(self, key)
        ]
        if self.base_url and not self.base_url.startswith(("http://", "https://")):
            problems.append(f"model.base_url={self.base_url!r}: expected http(s)://host:port/v1")
        if (info.context or {}).get("mode") == "sync":
            problems.append(
                "model.engine: openai samples a server that loads its own weights; mode sync would hand the "
                "engine the trainer's weights: set mode: async with launch: processes and run `trine serve` on "
                "the run directory, or use model.engine: hf"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


class SamplingConfig(Section):
    temperature: NonNeg = 1.0
    """Sampling temperature (0 = greedy). Logprobs are computed at this temperature."""
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    """Nucleus sampling threshold (1 = off)."""
    top_k: NonNegInt = 0
    """Top-k truncation (0 = off, the right default for RL)."""
    max_tokens: Count = 64
    """Maximum new tokens per response."""
    stop: list[str] = []
    """Stop strings."""
    stop_token_ids: list[NonNegInt] = []
    """Extra stop token ids besides eos."""
    seed: NonNegInt | None = None
    """Per-request seed (None: the engine's seeded generator)."""
    ignore_eos: bool = False
    """Generate past eos up to max_tokens (fixed-length sampling for benchmarks)."""


class TasksetConfig(Section):
    path: str | None = None
    """A local .jsonl/.json/.parquet file, a directory of them, or a ``datasets`` save_to_disk directory
    (None: the rows come from ``generator``)."""
    generator: str | None = None
    """Instead of ``path``, rows made in memory by a task generator (:mod:`trine.tasks.generators`):
    ``reasoning_gym`` (reasoning-gym's procedural generators; needs the ``envs`` extra), ``arithmetic``
    (Trine's ``a+b=`` sums) or ``package.module:function`` returning row dicts."""
    generator_args: dict[str, Any] = {}
    """Keyword arguments of ``generator``; for ``reasoning_gym``: ``dataset`` (the generator's name, e.g.
    ``leg_counting``), ``size`` (rows), ``seed`` and the generator's own settings. A missing ``seed`` is
    hashed from the taskset's ``name`` (train and eval sets then differ). docs/environments.md."""
    name: str = "train"
    """Name used in task ids and metric keys (``eval/<name>/accuracy``)."""
    split: str | None = None
    """Split of a saved DatasetDict."""
    prompt_key: str = "question"
    """Row field holding the prompt text."""
    answer_key: str | None = "answer"
    """Row field holding the reference answer (None: no answer)."""
    messages_key: str | None = None
    """Row field holding a whole chat (list of {role, content}) instead of prompt_key."""
    response_key: str | None = None
    """For supervised (``train`` mode) stages: the field holding the target response (default: the answer)."""
    chosen_key: str = "chosen"
    """For preference (DPO) stages: the field holding the preferred response."""
    rejected_key: str = "rejected"
    """For preference (DPO) stages: the field holding the dispreferred response."""
    system_prompt: str | None = None
    """System message prepended to every prompt."""
    prompt_template: str | None = None
    """Python format string filled from the row, e.g. ``"What is {question}?"``."""
    id_key: str | None = None
    """Row field holding a stable task id (default: name/row-index)."""
    workflow: str = "single_turn"
    """Workflow name or ``package.module:Class``."""
    workflow_args: dict[str, Any] = {}
    """Keyword arguments of the workflow."""
    reward: str = "exact_match"
    """Reward function name or ``package.module:function``."""
    reward_args: dict[str, Any] = {}
    """Keyword arguments of the reward function."""
    repeat: Count = 8
    """Group size: rollouts per task."""
    sampling: SamplingConfig = SamplingConfig()
    """How responses are sampled for this taskset."""
    on_bad_row: Literal["error", "skip"] = "error"
    """A row missing a mapped field: stop with an error naming file, row and key, or skip and count it."""
    limit: Count | None = None
    """Use only the first N rows."""
    weight: Positive | None = None
    """Share of each batch when several tasksets are mixed (``tasks.mix``); None: by taskset size."""

    _paths = field_validator("path")(_resolve_path)
    _workflow = field_validator("workflow")(lambda v: _check_name("workflow", v))
    _reward = field_validator("reward")(lambda v: _check_name("reward", v))
    _generator = field_validator("generator")(lambda v: _check_name("generator", v))

    @field_validator("path")
    @classmethod
    def _exists(cls, v: str | None) -> str | None:
        if v is not None and not Path(v).exists():
            raise ValueError(
                f"taskset file {v!r} does not exist; check the path (relative paths are resolved "
                "against the config file's directory)."
            )
        return v

    @property
    def origin(self) -> str:
        """Where the rows come from, for messages: the path, or ``generator NAME``."""
        return self.path if self.path is not None else f"generator {self.generator}"

    @model_validator(mode="after")
    def _one_source(self) -> TasksetConfig:
        if (self.path is None) == (self.generator is None):
            given = "both path and generator are set" if self.path else "neither path nor generator is set"
            raise ValueError(
                f"a taskset reads its rows from path (a local data file) or makes them with generator (e.g. "
                f"reasoning_gym with generator_args {{dataset: leg_counting}}), but {given}; give one"
            )
        if self.generator is None and self.generator_args:
            raise ValueError("generator_args is set without a generator; remove it or set generator")
        return self

    @model_validator(mode="after")
    def _one_prompt(self) -> TasksetConfig:
        if self.messages_key is not None and self.prompt_template is not None:
            raise ValueError(
                "messages_key and prompt_template are both set; give one: a chat field, or a template "
                "for a text prompt"
            )
        return self


class TasksConfig(Section):
    train: TasksetConfig | None = None
    """The taskset explored (RL) or trained on (``train`` mode); not used with ``source: buffer`` or ``serve``."""
    source: Literal["taskset", "buffer", "serve"] = "taskset"
    """Where ``mode: train`` gets its batches. ``taskset``: rows of ``tasks.train`` (SFT rows, or DPO pairs
    from its ``chosen_key`` / ``rejected_key``). ``buffer``: rows that land in the persistent buffer
    (``buffer.storage: sql`` or ``file``; another run's with ``buffer.url``; the annotated preference pairs
    with ``buffer.storage_args: {table: preferences}``), with no extra step: each step takes
    ``batch_size`` rows (pairs for DPO) by ``buffer.get``, waiting up to ``buffer.get_timeout`` seconds
    for them. The stage ends after ``total_steps``, or earlier when no batch arrives within that time (the
    run summary's ``ended`` says so; a last partial batch stays in the buffer). ``serve``: the tasks are the
    calls of agents to ``trine serve`` (mode async, ``launch: processes``, ``buffer.storage: sql``, no
    taskset): run ``trine serve CONFIG`` and ``trine train CONFIG``, which takes ``trainer.batch_size`` rewarded
    rows per step (docs/serve.md)."""
    eval: list[TasksetConfig] = []
    """Tasksets evaluated every ``eval.every`` steps."""
    mix: list[TasksetConfig] = []
    """More tasksets explored alongside ``train``, mixed into each batch by their ``weight``."""
    selector: Literal["sequential", "shuffle", "random", "easy_to_hard"] | None = None
    """Order within a taskset (None: ``shuffle`` decides between shuffle and sequential)."""
    difficulty_key: str | None = None
    """Row field holding a difficulty score, for ``selector: easy_to_hard``."""
    descending: bool = False
    """``easy_to_hard`` ordered hard to easy instead."""
    curriculum: dict[str, Any] | None = None
    """Online curriculum (a simplified BOTS): pick tasks whose estimated pass rate is near
    ``target_pass_rate`` (also ``prior_pass_rate``, ``prior_strength``, ``forgetting``); ``{}`` for defaults."""
    expert: TasksetConfig | None = None
    """Expert (supervised) rows mixed into RL batches by the ``mix`` algorithm (prompt + answer/response)."""
    batch_size: Count = 8
    """Tasks per explorer batch (each yields ``repeat`` experiences); one batch per training step."""
    total_steps: Count | None = None
    """Training steps of this stage; None: as many as ``epochs`` passes over the taskset allow."""
    epochs: Count | None = None
    """Passes over the taskset; None with total_steps set: repeat as needed."""
    shuffle: bool = True
    """Shuffle the taskset every epoch (seeded)."""

    @model_validator(mode="after")
    def _length(self, info: ValidationInfo) -> TasksConfig:
        if self.total_steps is None and self.epochs is None and self.source == "taskset":
            raise ValueError("set tasks.total_steps or tasks.epochs so the stage knows when to stop")
        problems = []
        if self.total_steps is not None and self.epochs is not None:
            problems.append(
                f"tasks.total_steps={self.total_steps} and tasks.epochs={self.epochs} are both set, but "
                "total_steps alone decides the length (epochs would be ignored); keep one (in a stage "
                "that inherits the other from the top level, set it to null)"
            )
        if self.selector != "easy_to_hard" and (self.difficulty_key is not None or self.descending):
            problems.append(
                f"tasks.difficulty_key/descending only apply to selector: easy_to_hard "
                f"(selector is {self.selector!r}); set the selector or remove them"
            )
        if self.selector == "easy_to_hard" and self.difficulty_key is None:
            problems.append(
                "tasks.selector: easy_to_hard needs tasks.difficulty_key, the row field to sort by"
            )
        mode = (info.context or {}).get("mode", "sync")
        problems += argument_problems(self, mode) + source_problems(self, mode)
        if self.curriculum is not None and self.selector not in (None, "shuffle"):
            problems.append(
                f"tasks.curriculum picks tasks online, so tasks.selector={self.selector!r} would be ignored; "
                "drop one of the two"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


class AuxiliaryModelConfig(Section):
    """A model that workflows and rewards call by name (a judge, a second agent): a local model sampled by
    its own engine (``path``) or an OpenAI-compatible endpoint (``base_url`` + ``model``)."""

    path: str | None = None
    """Local directory of a Hugging Face causal LM (sampled by its own ``hf`` engine)."""
    base_url: str | None = None
    """OpenAI-compatible server, e.g. ``http://127.0.0.1:8000/v1`` (vLLM, SGLang, ``trine serve``)."""
    model: str | None = None
    """Model name at ``base_url``."""
    api_key_env: str | None = None
    """Environment variable holding the endpoint's API key (the key never goes into the config)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights dtype of a local model."""
    timeout: Positive = 60.0
    """Seconds one request to it may take."""

    _paths = field_validator("path")(_resolve_path)

    @model_validator(mode="after")
    def _one_source(self) -> AuxiliaryModelConfig:
        if (self.path is None) == (self.base_url is None):
            raise ValueError(
                "an auxiliary model needs exactly one of path (a local model directory) or base_url (an "
                "OpenAI-compatible endpoint, with model)"
            )
        if self.base_url is not None and not self.model:
            raise ValueError(f"auxiliary model at base_url={self.base_url!r} needs model (its name there)")
        if self.base_url is not None and not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url={self.base_url!r}; expected http(s)://host:port/v1")
        if self.path is not None and not Path(self.path).exists():
            raise ValueError(f"auxiliary model path {self.path!r} does not exist")
        return self


class ExplorerConfig(Section):
    timeout: Positive = 600.0
    """Seconds a task's workflow may run before it is cancelled and retried/skipped."""
    max_retries: NonNegInt = 1
    """Retries of a task whose workflow raised, timed out or returned nothing."""
    max_concurrency: Count = 256
    """Tasks running at once."""
    reward_timeout: Positive = 30.0
    """Seconds one reward call may take once it has started; after that the call's thread is abandoned
    and replaced by a fresh one (``explorer/reward_timeouts``) and the call fails: the built-in
    workflows mark that answer ``reward_error`` (kept out of the loss), a workflow that lets it
    propagate has its task skipped (``explorer/skipped_reward_timeout``)."""
    blocking_threads: Annotated[int, Field(ge=1, le=1024)] = 32
    """Most blocking calls (reward functions, environment construction/reset/step) that run at once,
    each in its own worker thread. A call abandoned by a timeout keeps its thread until it returns
    (counted in ``explorer/stuck_threads``) and a fresh worker takes its place."""
    max_skip_ratio: Annotated[float, Field(ge=0, le=1)] = 0.5
    """Stop the run (status ``failed``) with an error naming the reasons, with an example of each, when more
    than this share of the answers of the last 10 training batches of the stage (all of them, early on)
    failed: the ``repeat`` answers of each skipped task (its workflow raised, timed out or returned
    nothing valid) and answers with a failure status (``reward_error``: the reward raised or timed out;
    ``env_error``, ``tool_error``, ``timeout``), which are not trained on. Evaluation is not counted.
    1.0 turns the check off."""
    warn_skip_ratio: Annotated[float, Field(ge=0, le=1)] = 0.1
    """Log a warning with the reasons when more than this share of one batch's answers failed (as
    ``max_skip_ratio`` counts them)."""
    max_batch_size: Count = 256
    """Rows the rollout engine samples in one batch."""
    prefix_cache_tokens: NonNegInt = 32768
    """Tokens of KV cache the ``hf`` engine keeps from finished rows, so that the next turn of a multi-turn
    conversation prefills only its new tokens (0: off). On a GPU each token costs ``2 × layers ×
    kv_heads × head_dim × bytes`` of memory; cleared whenever the weights change."""
    dump_rollouts: bool = False
    """Append every sampled trajectory (text, reward) to ``rollouts.jsonl`` in the run directory."""
    oversample: Annotated[float, Field(ge=1)] = 1.0
    """Mode async: tasks kept in flight per batch (× ``tasks.batch_size``); a batch is the first
    ``tasks.batch_size`` of them to finish, the slower ones carry over to later batches."""
    tail_seconds: Positive | None = None
    """Mode async (tail batch): a task that has run longer than this stops counting as in flight, so
    another starts in its place and batches go on without it; it joins a later batch when it ends
    (``explorer/tail_deferred``). None: a task holds its place until it ends."""
    partial_rollout: bool = False
    """Mode async: load new weights as soon as the trainer pushes them, between two tokens of running
    generations, which go on under the new weights; every token keeps the version and behaviour
    logprob it was sampled with (``info["token_versions"]``; the loss uses those logprobs). Off: new
    weights are loaded between generations."""
    instances: Count = 1
    """Explorer processes ``trine run`` starts with ``launch: processes`` (``trine explore
    --explorer-id i --explorers n`` each). They pull tasks from one shared stream as they have room
    (a fast explorer takes more), through the buffer's task ledger."""
    lease_seconds: Positive = 60.0
    """Explorer processes: how long an explorer's claim on a task lasts unless renewed. A running explorer
    renews its claims every third of this; the claims of one that died or hangs expire after it and the
    other explorers take those tasks."""
    auxiliary_models: dict[str, AuxiliaryModelConfig] = {}
    """Models that workflows (an ``auxiliary_models`` parameter) and rewards (a ``models`` parameter, e.g.
    ``llm_judge``) call by name: ``{judge: {path: ...}}`` or ``{judge: {base_url: ..., model: ...}}``."""
    teacher: str | None = None
    """Local model directory of a teacher whose logprobs on the samples are stored for on-policy
    distillation (``algorithm.name: distill``)."""

    _teacher = field_validator("teacher")(_resolve_path)
