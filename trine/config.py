"""Typed configuration: one section per package, YAML plus dotted overrides, all errors at once.

Defaults live only here, each with a docstring under the field. ``load_config(path, overrides)``
reads YAML, applies ``key.sub=value`` overrides, validates the base config and every stage, and
raises :class:`ConfigError` listing *every* problem with its key path (unknown keys come with the
closest valid name; unknown workflow/reward/algorithm names with the list of valid ones; numbers
outside their range with the range).
Relative paths in the file are resolved against the config file's directory.

Rules:

- **Stages win over the top level.** Each entry of ``stages`` is merged over the top-level
  settings, so a key a stage sets replaces the top-level value for that stage. In the YAML file
  this is normal (a default at the top, a stage-specific value below), and the top-level value is
  still validated. A *command-line* override of a top-level key that a stage sets would change
  nothing for that stage, so it is an error naming each ``stages.<i>.<key>``; override
  ``stages.<i>.<key>=value`` instead.
- **Types are strict.** ``"yes"`` is not a bool and ``"4"`` is not an int (write ``true``/``4``
  without quotes); ints are accepted for floats, YAML lists for tuples, and ``3e-4`` is read as
  a float (YAML 1.2), not as the string PyYAML would make of it.
- **Conflicting settings are errors**, e.g. ``tasks.epochs`` with ``tasks.total_steps``, or a
  setting that only applies to another mode or option.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from trine import registry
from trine.config_checks import algorithm_problems, argument_problems, auxiliary_problems, mode_problems
from trine.config_format import format_error, section_reference
from trine.config_overrides import (  # noqa: F401 - re-exported: trine.config is where callers look
    ConfigError,
    apply_overrides,
    load_yaml,
    merge,
    shadowed_overrides,
    shadowed_paths,
)

# Numeric ranges shared by many fields (the bounds appear in error messages and the reference).
Count = Annotated[int, Field(ge=1)]
"""An integer >= 1."""
NonNegInt = Annotated[int, Field(ge=0)]
"""An integer >= 0."""
Positive = Annotated[float, Field(gt=0)]
TrajectoryStatus = Literal["ok", "truncated", "timeout", "env_error", "tool_error", "reward_error"]
"""One of :data:`trine.types.TRAJECTORY_STATUSES`."""
"""A number > 0."""
NonNeg = Annotated[float, Field(ge=0)]
"""A number >= 0."""
Beta = Annotated[float, Field(ge=0, lt=1)]
"""An AdamW beta, in [0, 1)."""


class Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        use_attribute_docstrings=True,
        validate_assignment=True,
        strict=True,
        allow_inf_nan=False,
    )


def _check_name(kind: str, value: str | None) -> str | None:
    if value is not None:
        problem = registry.check(kind, value)
        if problem:
            raise ValueError(problem)
    return value


def _resolve_path(value: str | None, info: ValidationInfo) -> str | None:
    if value is None:
        return None
    base = (info.context or {}).get("base_dir")
    path = Path(value).expanduser()
    if not path.is_absolute() and base is not None:
        path = Path(base) / path
    return str(path)


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
    """Rollout engine: ``hf`` (batched sampling from the local HF model, CPU or GPU) or
    ``package.module:Class`` (see ``trine.models.protocol``)."""

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
    path: str
    """A local .jsonl/.json/.parquet file, a directory of them, or a ``datasets`` save_to_disk directory."""
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

    @field_validator("path")
    @classmethod
    def _exists(cls, v: str) -> str:
        if not Path(v).exists():
            raise ValueError(
                f"taskset file {v!r} does not exist; check the path (relative paths are resolved "
                "against the config file's directory)."
            )
        return v

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
    """The taskset explored (RL) or trained on (``train`` mode)."""
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
        if self.total_steps is None and self.epochs is None:
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
        problems += argument_problems(self, mode)
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
    """Seconds one reward call may take once it has started; after that the task is skipped
    (``explorer/reward_timeouts``, ``explorer/skipped_reward_timeout``) and the call's thread is
    abandoned and replaced by a fresh one."""
    blocking_threads: Annotated[int, Field(ge=1, le=1024)] = 32
    """Most blocking calls (reward functions, environment construction/reset/step) that run at once,
    each in its own worker thread. A call abandoned by a timeout keeps its thread until it returns
    (counted in ``explorer/stuck_threads``) and a fresh worker takes its place."""
    max_skip_ratio: Annotated[float, Field(ge=0, le=1)] = 0.5
    """Stop the run with an error naming the skip reasons when more than this share of the tasks of
    the last 10 training batches of the stage (all of them, early on) were skipped; evaluation is
    not counted. 1.0 turns the check off."""
    warn_skip_ratio: Annotated[float, Field(ge=0, le=1)] = 0.1
    """Log a warning with the skip reasons when one batch skips more than this share of its tasks."""
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
    --explorer-id i --explorers n`` each; they split the tasks without overlap)."""
    auxiliary_models: dict[str, AuxiliaryModelConfig] = {}
    """Models that workflows (an ``auxiliary_models`` parameter) and rewards (a ``models`` parameter, e.g.
    ``llm_judge``) call by name: ``{judge: {path: ...}}`` or ``{judge: {base_url: ..., model: ...}}``."""
    teacher: str | None = None
    """Local model directory of a teacher whose logprobs on the samples are stored for on-policy
    distillation (``algorithm.name: distill``)."""

    _teacher = field_validator("teacher")(_resolve_path)


class BufferConfig(Section):
    storage: str = "memory"
    """Storage: ``memory``, ``sql`` (SQLAlchemy: SQLite or PostgreSQL), ``file`` (jsonl log) or ``package.module:Class``."""
    url: str | None = None
    """Database URL of the ``sql`` storage (default: ``sqlite:///<run_dir>/buffer.db``; PostgreSQL:
    ``postgresql+psycopg://user:password@host/db``)."""
    sampler: Literal["fifo", "priority"] = "fifo"
    """``fifo``: each experience once, oldest first. ``priority``: replay — fresher, less-used first,
    each up to ``reuse_limit`` times, not again for ``cooldown`` gets."""
    reuse_limit: Count = 1
    """Times an experience may be handed out (priority sampler)."""
    reuse_decay: NonNeg = 1.0
    """Priority = policy_version - use_count × reuse_decay."""
    cooldown: NonNegInt = 0
    """Gets an experience waits after each use before it is eligible again."""
    max_staleness: NonNegInt | None = None
    """Drop (and count) experiences more than this many versions older than the trainer's."""
    pending_timeout: Positive | None = None
    """Seconds a pending (reward=None) experience may wait for its reward."""
    pending_action: Literal["drop", "default"] = "drop"
    """What happens to pending experiences after ``pending_timeout``: dropped, or given ``default_reward``."""
    default_reward: float = 0.0
    """Reward given to timed-out pending experiences with ``pending_action: default``."""
    whole_groups: bool = False
    """Hand out a group only once every member has its reward (group advantages need them all)."""
    storage_args: dict[str, Any] = {}
    """Extra keyword arguments of the storage class."""
    operators: list[dict[str, Any]] = []
    """Operator pipeline applied to explored experiences before they are stored, e.g.
    ``[{name: invalid_reward}, {name: length, max_length: 512}, {name: diversity, model: path, weight: 0.5}]``."""

    @field_validator("operators")
    @classmethod
    def _operators(cls, v: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for i, spec in enumerate(v):
            if not isinstance(spec, dict) or "name" not in spec:
                raise ValueError(f"operators[{i}] must be a mapping with a 'name', got {spec!r}")
            _check_name("operator", spec["name"])
        return v

    get_timeout: Positive = 600.0
    """Seconds the trainer waits for a batch before failing with a clear error."""

    _storage = field_validator("storage")(lambda v: _check_name("storage", v))

    @model_validator(mode="after")
    def _ignored(self) -> BufferConfig:
        problems = []
        if self.sampler == "fifo" and (self.reuse_limit != 1 or self.cooldown or self.reuse_decay != 1.0):
            problems.append(
                f"buffer.reuse_limit={self.reuse_limit}, cooldown={self.cooldown} and reuse_decay="
                f"{self.reuse_decay} only apply to sampler: priority (fifo hands each experience out once); "
                "set sampler: priority or remove them"
            )
        if self.pending_timeout is None and (self.pending_action != "drop" or self.default_reward != 0):
            problems.append(
                "buffer.pending_action/default_reward only apply once buffer.pending_timeout is set; "
                "set pending_timeout (seconds) or remove them"
            )
        elif self.pending_action == "drop" and self.default_reward != 0:
            problems.append(
                f"buffer.default_reward={self.default_reward} only applies with pending_action: default"
            )
        if self.url is not None and self.storage not in ("sql", "sqlite"):
            problems.append(
                f"buffer.url only applies to storage: sql (storage is {self.storage!r}); "
                "pass a plugin storage's arguments in buffer.storage_args"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


class AlgorithmConfig(Section):
    name: str = "grpo"
    """Preset name (``grpo``, ``sft``, ...) or ``package.module:ALGO``; fields below override it."""
    advantage: str | None = None
    """Override the advantage function (name or import path)."""
    loss: str | None = None
    """Override the policy loss (name or import path)."""
    advantage_args: dict[str, Any] | None = None
    """Extra keyword arguments of the advantage function (merged over the preset's)."""
    loss_args: dict[str, Any] | None = None
    """Extra keyword arguments of the loss (e.g. clip_low, clip_high; merged over the preset's)."""
    loss_agg: (
        Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] | None
    ) = None
    """Loss aggregation; normalized over the whole step, not per micro-batch."""
    kl_coef: NonNeg | None = None
    """KL-to-reference loss coefficient (> 0 loads a frozen reference model)."""
    kl_estimator: Literal["k1", "k2", "k3", "low_var_kl", "abs", "mse"] | None = None
    """KL estimator for the KL loss."""
    kl_mode: Literal["loss", "reward"] | None = None
    """Where the KL to the reference goes: a loss term, or a per-token penalty inside the reward."""
    kl_target: Positive | None = None
    """Adaptive KL coefficient: steer towards this KL per token (None: fixed coefficient)."""
    kl_horizon: Positive | None = None
    """Adaptive KL horizon in samples."""
    entropy_coef: NonNeg | None = None
    """Entropy bonus coefficient."""
    critic_args: dict[str, Any] | None = None
    """Arguments of the critic's value loss (e.g. ``clip_eps``), for algorithms with a critic."""
    dynamic_sampling: bool | None = None
    """Drop groups whose rewards all agree and draw more tasks until the batch is full (DAPO)."""
    max_extra_draws: NonNegInt | None = None
    """Dynamic sampling: at most this many extra task draws per batch."""
    overlong_buffer: NonNeg | None = None
    """Overlong reward shaping over the last N tokens before max_tokens (< 1: a fraction of max_tokens; 0: off)."""
    overlong_penalty: NonNeg | None = None
    """Overlong reward shaping: the penalty at max_tokens."""
    expert_ratio: NonNeg | None = None
    """MIX: expert rows per rollout row (from ``tasks.expert``)."""

    _name = field_validator("name")(lambda v: _check_name("algorithm", v))
    _adv = field_validator("advantage")(lambda v: _check_name("advantage", v))
    _loss = field_validator("loss")(lambda v: _check_name("loss", v))


class TrainerConfig(Section):
    lr: Positive = 1e-5
    """Peak learning rate of AdamW."""
    weight_decay: NonNeg = 0.0
    """AdamW weight decay."""
    betas: tuple[Beta, Beta] = (0.9, 0.999)
    """AdamW betas."""
    eps: Positive = 1e-8
    """AdamW epsilon."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """LR after warmup: constant, or cosine decay to ``min_lr_ratio × lr`` at the last step."""
    warmup_steps: NonNegInt = 0
    """Optimizer steps of linear warmup."""
    min_lr_ratio: Annotated[float, Field(ge=0, le=1)] = 0.0
    """Final LR as a fraction of lr (cosine)."""
    grad_clip: NonNeg = 1.0
    """Max global gradient norm (0 = no clipping)."""
    micro_batch_tokens: Count = 8192
    """Padded tokens per micro-batch (forward/backward); sequences are bucketed by length."""
    mini_batches: Count = 1
    """Optimizer steps per batch (the batch is split into this many mini-batches)."""
    update_epochs: Count = 1
    """Passes over the batch per training step."""
    recompute_logprobs: bool = False
    """Recompute old logprobs with the trainer instead of using the rollout engine's."""
    train_statuses: list[TrajectoryStatus] = ["ok", "truncated"]
    """Trajectory statuses the loss trains on; experiences with another status (``timeout``,
    ``env_error``, ``tool_error``, ``reward_error``) stay in the buffer for inspection but out of the
    loss (``trainer/excluded_status``)."""
    fused_adamw: bool = False
    """The policy's AdamW as torch's fused kernel (the default of HF Trainer / TRL): one pass over all
    parameters, ~4x faster optimizer step on CPU. Off by default because its float rounding differs
    from the unfused AdamW: runs with it are not bit-comparable with runs without it."""
    save_every: NonNegInt = 0
    """Save a checkpoint every N steps (0: only at the end of each stage)."""
    keep_checkpoints: NonNegInt = 2
    """Number of most recent checkpoints kept (0: keep all)."""
    critic_lr: Positive | None = None
    """Learning rate of the critic (algorithms with a critic, e.g. ppo); None: the policy's lr."""
    critic_warmup_steps: NonNegInt = 0
    """Steps during which only the critic is trained (the policy waits for useful values)."""
    batch_size: Count | None = None
    """Experiences the trainer takes from the buffer per step. None: one explored batch, whole (what
    sync mode trains on: ``tasks.batch_size`` tasks × ``repeat``, fewer if tasks were skipped or
    filtered). A number is for ``mode: async``, where explorer and trainer run at their own pace."""

    @field_validator("betas", mode="before")
    @classmethod
    def _betas_list(cls, v: Any) -> Any:
        return tuple(v) if isinstance(v, list) else v  # YAML has lists, not tuples

    @model_validator(mode="after")
    def _schedule(self) -> TrainerConfig:
        if self.lr_schedule == "constant" and self.min_lr_ratio != 0:
            raise ValueError(
                f"trainer.min_lr_ratio={self.min_lr_ratio} only applies to lr_schedule: cosine; "
                "set lr_schedule: cosine or remove min_lr_ratio"
            )
        return self


class SyncConfig(Section):
    sync_interval: Count = 1
    """Batches explored per weight version (k): weights are pushed to the explorer every k steps."""
    sync_offset: NonNegInt = 0
    """Batches the explorer runs ahead of the trainer (m); m > 0 explores from a weight snapshot."""
    method: Literal["shared", "copy", "published"] | None = None
    """How weights reach the explorer: ``shared`` (the engine samples the trainer's own weights, no
    copy), ``copy`` (the engine samples a snapshot, refreshed from in-memory copies every
    ``sync_interval`` steps) or ``published`` (the trainer publishes each version into
    ``<run_dir>/weights``, explorer processes load the newest). None: ``published`` with ``launch:
    processes``, ``shared`` in mode sync with ``sync_offset`` 0, else ``copy`` (``RunConfig.sync_method``,
    the one place this is decided)."""
    keep: Count = 2
    """Published versions kept in ``<run_dir>/weights`` (``published``)."""
    wait_timeout: Positive | None = 600.0
    """Seconds a process waits for the other side (an explorer for the trainer's first weights, the
    trainer for the first experiences) before it stops with an error; None: forever."""

    @model_validator(mode="after")
    def _method_fits(self) -> SyncConfig:
        if self.method == "shared" and self.sync_offset > 0:
            raise ValueError(
                f"sync.method 'shared' with sync.sync_offset={self.sync_offset}: an explorer that runs "
                "ahead of the trainer cannot sample the weights the trainer is changing; set "
                "sync.method: copy (or leave it unset), or sync.sync_offset: 0"
            )
        return self


class EvalConfig(Section):
    every: NonNegInt = 0
    """Evaluate every N training steps (0: only at the start and end of each stage)."""
    at_start: bool = True
    """Evaluate before a stage's first step."""
    greedy: bool = True
    """Report greedy accuracy (``eval/<name>/accuracy``)."""
    k: NonNegInt = 8
    """Samples per task at the taskset's temperature for ``avg@k`` and ``pass@k`` (0: off)."""
    success_threshold: float = 1.0
    """A sample counts as correct when its reward is at least this."""


class MonitorConfig(Section):
    sinks: list[str] = ["console", "jsonl", "tensorboard"]
    """Metric sinks: console, jsonl, tensorboard, wandb, mlflow or ``package.module:Class``."""
    plot: bool = True
    """Write PNG curves into ``<run_dir>/plots`` at the end of the run."""

    @field_validator("sinks")
    @classmethod
    def _sinks(cls, v: list[str]) -> list[str]:
        for name in v:
            _check_name("monitor", name)
        return v


class RunConfig(Section):
    name: str = "run"
    """Run name; the run directory defaults to ``runs/<name>``."""
    stage: str = "main"
    """Name of this stage (shown in metrics, checkpoints and plots)."""
    run_dir: str | None = None
    """Where config, metrics, checkpoints and plots go."""
    mode: Literal["sync", "async", "train"] = "sync"
    """``sync``: explore and train alternately (RL); ``async``: explorer and trainer run concurrently,
    meeting only at the buffer and at weight sync (``buffer.max_staleness`` bounds how old a trained
    experience may be); ``train``: train from the taskset only (SFT, DPO)."""
    launch: Literal["thread", "processes"] = "thread"
    """How mode ``async`` runs: ``thread`` (the explorer in a thread of this process) or ``processes``
    (``trine run`` starts ``trine train`` and ``explorer.instances`` × ``trine explore``, sharing the run
    directory, a SQL buffer and the published weights)."""
    seed: NonNegInt = 42
    """Seed of every random stream (task order, sampling, mini-batch shuffles)."""
    num_threads: Count | None = None
    """torch CPU threads (None: torch's default)."""
    resume: bool = True
    """Continue from the last checkpoint in the run directory if there is one."""
    stop_after_steps: Count | None = None
    """Checkpoint and stop once this many steps (counted over all stages) are done; run again to
    continue (for time-limited jobs)."""
    model: ModelConfig = ModelConfig(init_preset="tiny-1m")
    """The policy model (``trine.models``)."""
    tasks: TasksConfig = TasksConfig(total_steps=1)
    """Tasksets and how many steps to run (``trine.tasks``)."""
    explorer: ExplorerConfig = ExplorerConfig()
    """Running workflows with the rollout engine (``trine.explorer``, ``trine.models.engine``)."""
    buffer: BufferConfig = BufferConfig()
    """Experience storage between explorer and trainer (``trine.buffer``)."""
    algorithm: AlgorithmConfig = AlgorithmConfig()
    """Advantage, loss, KL and entropy settings (``trine.algorithms``)."""
    trainer: TrainerConfig = TrainerConfig()
    """Optimizer, schedule, micro-batching, checkpoints (``trine.trainer``)."""
    sync: SyncConfig = SyncConfig()
    """How often and how far ahead the explorer gets new weights (``trine.sync``)."""
    eval: EvalConfig = EvalConfig()
    """Evaluation on ``tasks.eval``."""
    monitor: MonitorConfig = MonitorConfig()
    """Metric sinks and plots (``trine.monitor``)."""
    stages: list[dict[str, Any]] = []
    """Stages run in order, each a partial config (with a ``stage`` name) merged over the top-level
    settings and starting from the previous stage's weights (e.g. an SFT warm-up then GRPO)."""

    @property
    def sync_method(self) -> str:
        """The weight-sync method in use: ``sync.method``, or ``published`` between processes, ``copy``
        when the explorer may run ahead of the trainer (mode async, ``sync_offset`` > 0), else ``shared``."""
        if self.sync.method is not None:
            return self.sync.method
        if self.launch == "processes":
            return "published"
        return "copy" if self.mode == "async" or self.sync.sync_offset > 0 else "shared"

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        if self.tasks.train is None:
            raise ValueError("tasks.train is required: the taskset to explore (or to train on in train mode)")
        problems = mode_problems(self) + auxiliary_problems(self)
        if self.mode == "train" and (
            self.sync.sync_offset or self.sync.sync_interval != 1 or self.sync.method is not None
        ):
            problems.append(
                "sync settings only apply to mode 'sync' or 'async' (there is no explorer in mode 'train'); "
                "remove them or set mode: sync"
            )
        algo = (
            None
            if registry.check("algorithm", self.algorithm.name)
            else registry.resolve("algorithm", self.algorithm.name)
        )
        if algo is not None and self.mode != "train" and not algo.from_rollouts:
            problems.append(
                f"algorithm {self.algorithm.name!r} trains from data, not rollouts; "
                "set mode: train for it, or pick an RL algorithm such as grpo"
            )
        if algo is not None:
            problems += algorithm_problems(self, algo)
        if algo is not None and self.mode == "train" and algo.from_rollouts:
            problems.append(
                f"mode 'train' needs a supervised algorithm such as sft, not {self.algorithm.name!r}; "
                "set mode: sync to learn from rollouts"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _format(err: dict[str, Any], prefix: str, loc_root: tuple = ()) -> str:
    return format_error(err, prefix, RunConfig, loc_root)


def _section(model: type[BaseModel], name: str) -> type[BaseModel] | None:
    """The section class of field ``name`` of ``model`` (``TasksetConfig`` for ``train``), if any."""
    ann = model.model_fields[name].annotation
    return next((c for c in (ann, *get_args(ann)) if isinstance(c, type) and issubclass(c, BaseModel)), None)


def _check_shadowed(base: dict[str, Any], raw: dict[str, Any], context: dict) -> list[str]:
    """Validate the top-level values a stage replaces, which its own validation never sees.

    Each is assigned to a default instance of its section, so field types, ranges and names are
    checked; checks across fields are left to the stages that use the value.
    """
    errors = []
    for path in shadowed_paths(base, raw):
        owner: type[BaseModel] = RunConfig
        depth = 0
        while path[depth] in owner.model_fields and depth < len(path) - 1:
            nested = _section(owner, path[depth])
            if nested is None:
                break  # a dict or list field: its whole top-level value is checked
            owner, depth = nested, depth + 1
        if path[depth] not in owner.model_fields:
            continue  # an unknown key: the stage reports it
        value: Any = base
        for part in path[: depth + 1]:
            value = value[part]
        try:
            owner.__pydantic_validator__.validate_assignment(
                owner.model_construct(), path[depth], value, context=context
            )
        except ValidationError as err:
            errors += [_format(e, "", path[:depth]) for e in err.errors() if e["loc"]]
    return errors


def validate_dict(
    data: dict[str, Any], base_dir: str | Path | None = None
) -> tuple[list[RunConfig], list[str]]:
    """Validate a raw config dict; returns (one config per stage, errors).

    Without ``stages`` the config is its own single stage. With ``stages``, each entry is merged
    over the top-level settings and validated on its own (errors carry ``stages.<i>.`` paths);
    top-level values that stages replace are validated too (errors carry their top-level path).
    """
    errors: list[str] = []
    context = {"base_dir": str(base_dir) if base_dir else None}

    def check(raw: dict[str, Any], prefix: str) -> RunConfig | None:
        try:  # the mode tells which tasksets run workflows (their arguments are checked)
            return RunConfig.model_validate(raw, context={**context, "mode": raw.get("mode", "sync")})
        except ValidationError as err:
            errors.extend(_format(e, prefix) for e in err.errors())
            return None

    stage_raws = data.get("stages") or []
    if not isinstance(stage_raws, list):
        return [], ["stages: expected a list of partial configs, one per stage"]
    if not stage_raws:
        config = check(data, "")
        return ([config] if config else []), errors
    base = {k: v for k, v in data.items() if k != "stages"}
    stages = []
    for i, raw in enumerate(stage_raws):
        if not isinstance(raw, dict) or "stage" not in raw:
            errors.append(f"stages.{i}: each stage must be a mapping with a 'stage' name")
            continue
        if "stages" in raw:
            errors.append(f"stages.{i}.stages: stages cannot be nested")
            continue
        stage = check(merge(base, raw), f"stages.{i}.")
        if stage is not None:
            stages.append(stage)
        errors += [e for e in _check_shadowed(base, raw, context) if e not in errors]
    names = [s.stage for s in stages]
    errors.extend(f"stages: stage name {n!r} is used twice" for n in sorted(set(names)) if names.count(n) > 1)
    return stages, errors


def read_yaml(path: str | Path) -> dict[str, Any]:
    """The YAML mapping in ``path``; :class:`ConfigError` if it is missing, not YAML or not a mapping."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError([f"config file {str(path)!r} does not exist"])
    try:
        data = load_yaml(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError([f"{path}: not valid YAML: {err}"]) from err
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: expected a mapping at the top level, got {type(data).__name__}"])
    return data


def load_config(path: str | Path, overrides: list[str] | None = None) -> list[RunConfig]:
    """Read, override and validate a YAML config; raise :class:`ConfigError` with every problem.

    A command-line override of a top-level key that a stage sets is an error (see the module
    docstring), reported with everything else.
    """
    path = Path(path)
    data = apply_overrides(read_yaml(path), overrides or [])
    errors = shadowed_overrides(data, overrides or [])
    stages, more = validate_dict(data, base_dir=path.absolute().parent)  # absolute paths out
    if errors or more:
        raise ConfigError(errors + more)
    return stages


def reference_markdown() -> str:
    """The config reference (every section, field, type, default and docstring) as Markdown."""
    return section_reference(RunConfig)
