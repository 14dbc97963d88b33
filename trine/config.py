"""Typed configuration: one section per package, YAML plus dotted overrides, all errors at once.

Defaults live only here, each with a docstring under the field. ``load_config(path, overrides)``
reads YAML, applies ``key.sub=value`` overrides, validates the base config and every stage, and
raises :class:`ConfigError` listing *every* problem with its key path (unknown keys come with the
closest valid name; unknown workflow/reward/algorithm names with the list of valid ones).
Relative paths in the file are resolved against the config file's directory.
"""

from __future__ import annotations

import copy
import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator, model_validator

from trine import registry


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, validate_assignment=True)


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

    _paths = field_validator("path", "tokenizer_path")(_resolve_path)
    _preset = field_validator("init_preset")(lambda v: _check_name("model_preset", v))

    @model_validator(mode="after")
    def _exists(self) -> ModelConfig:
        if self.init_preset is None and not Path(self.path).exists():
            raise ValueError(
                f"model.path {self.path!r} does not exist. Build a tiny test model with "
                f"`trine init-model tiny-1m {self.path}` or set model.init_preset to build it automatically."
            )
        return self


class SamplingConfig(Section):
    temperature: float = 1.0
    """Sampling temperature (0 = greedy). Logprobs are computed at this temperature."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1 = off)."""
    top_k: int = 0
    """Top-k truncation (0 = off, the right default for RL)."""
    max_tokens: int = 64
    """Maximum new tokens per response."""
    stop: list[str] = []
    """Stop strings."""
    stop_token_ids: list[int] = []
    """Extra stop token ids besides eos."""
    seed: int | None = None
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
    repeat: int = 8
    """Group size: rollouts per task."""
    sampling: SamplingConfig = SamplingConfig()
    """How responses are sampled for this taskset."""
    on_bad_row: Literal["error", "skip"] = "error"
    """A row missing a mapped field: stop with an error naming file, row and key, or skip and count it."""
    limit: int | None = None
    """Use only the first N rows."""
    weight: float | None = None
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
    batch_size: int = 8
    """Tasks per explorer batch (each yields ``repeat`` experiences); one batch per training step."""
    total_steps: int | None = None
    """Training steps of this stage; None: as many as ``epochs`` passes over the taskset allow."""
    epochs: int | None = None
    """Passes over the taskset; None with total_steps set: repeat as needed."""
    shuffle: bool = True
    """Shuffle the taskset every epoch (seeded)."""

    @model_validator(mode="after")
    def _length(self) -> TasksConfig:
        if self.total_steps is None and self.epochs is None:
            raise ValueError(
                "set tasks.total_steps or tasks.epochs (or both) so the stage knows when to stop"
            )
        return self


class ExplorerConfig(Section):
    timeout: float = 600.0
    """Seconds a task's workflow may run before it is cancelled and retried/skipped."""
    max_retries: int = 1
    """Retries of a task whose workflow raised, timed out or returned nothing."""
    max_concurrency: int = 256
    """Tasks running at once."""
    reward_timeout: float = 30.0
    """Seconds one reward call may take (its thread is abandoned after that)."""
    max_batch_size: int = 256
    """Rows the rollout engine samples in one batch."""
    dump_rollouts: bool = False
    """Append every sampled trajectory (text, reward) to ``rollouts.jsonl`` in the run directory."""
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
    reuse_limit: int = 1
    """Times an experience may be handed out (priority sampler)."""
    reuse_decay: float = 1.0
    """Priority = policy_version - use_count × reuse_decay."""
    cooldown: int = 0
    """Gets an experience waits after each use before it is eligible again."""
    max_staleness: int | None = None
    """Drop (and count) experiences more than this many versions older than the trainer's."""
    pending_timeout: float | None = None
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

    get_timeout: float = 600.0
    """Seconds the trainer waits for a batch before failing with a clear error."""

    _storage = field_validator("storage")(lambda v: _check_name("storage", v))


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
    kl_coef: float | None = None
    """KL-to-reference loss coefficient (> 0 loads a frozen reference model)."""
    kl_estimator: Literal["k1", "k2", "k3", "low_var_kl", "abs", "mse"] | None = None
    """KL estimator for the KL loss."""
    kl_mode: Literal["loss", "reward"] | None = None
    """Where the KL to the reference goes: a loss term, or a per-token penalty inside the reward."""
    kl_target: float | None = None
    """Adaptive KL coefficient: steer towards this KL per token (None: fixed coefficient)."""
    kl_horizon: float | None = None
    """Adaptive KL horizon in samples."""
    entropy_coef: float | None = None
    """Entropy bonus coefficient."""
    critic_args: dict[str, Any] | None = None
    """Arguments of the critic's value loss (e.g. ``clip_eps``), for algorithms with a critic."""
    dynamic_sampling: bool | None = None
    """Drop groups whose rewards all agree and draw more tasks until the batch is full (DAPO)."""
    max_extra_draws: int | None = None
    """Dynamic sampling: at most this many extra task draws per batch."""
    overlong_buffer: float | None = None
    """Overlong reward shaping over the last N tokens before max_tokens (< 1: a fraction of max_tokens; 0: off)."""
    overlong_penalty: float | None = None
    """Overlong reward shaping: the penalty at max_tokens."""
    expert_ratio: float | None = None
    """MIX: expert rows per rollout row (from ``tasks.expert``)."""

    _name = field_validator("name")(lambda v: _check_name("algorithm", v))
    _adv = field_validator("advantage")(lambda v: _check_name("advantage", v))
    _loss = field_validator("loss")(lambda v: _check_name("loss", v))


class TrainerConfig(Section):
    lr: float = 1e-5
    """Peak learning rate of AdamW."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    eps: float = 1e-8
    """AdamW epsilon."""
    lr_schedule: Literal["constant", "cosine"] = "constant"
    """LR after warmup: constant, or cosine decay to ``min_lr_ratio × lr`` at the last step."""
    warmup_steps: int = 0
    """Optimizer steps of linear warmup."""
    min_lr_ratio: float = 0.0
    """Final LR as a fraction of lr (cosine)."""
    grad_clip: float = 1.0
    """Max global gradient norm (0 = no clipping)."""
    micro_batch_tokens: int = 8192
    """Padded tokens per micro-batch (forward/backward); sequences are bucketed by length."""
    mini_batches: int = 1
    """Optimizer steps per batch (the batch is split into this many mini-batches)."""
    update_epochs: int = 1
    """Passes over the batch per training step."""
    recompute_logprobs: bool = False
    """Recompute old logprobs with the trainer instead of using the rollout engine's."""
    fused_adamw: bool = False
    """The policy's AdamW as torch's fused kernel (the default of HF Trainer / TRL): one pass over all
    parameters, ~4x faster optimizer step on CPU. Off by default because its float rounding differs
    from the unfused AdamW: runs with it are not bit-comparable with runs without it."""
    save_every: int = 0
    """Save a checkpoint every N steps (0: only at the end of each stage)."""
    keep_checkpoints: int = 2
    """Number of most recent checkpoints kept."""
    critic_lr: float | None = None
    """Learning rate of the critic (algorithms with a critic, e.g. ppo); None: the policy's lr."""
    critic_warmup_steps: int = 0
    """Steps during which only the critic is trained (the policy waits for useful values)."""


class SyncConfig(Section):
    sync_interval: int = 1
    """Batches explored per weight version (k): weights are pushed to the explorer every k steps."""
    sync_offset: int = 0
    """Batches the explorer runs ahead of the trainer (m); m > 0 explores from a weight snapshot."""


class EvalConfig(Section):
    every: int = 0
    """Evaluate every N training steps (0: only at the start and end of each stage)."""
    at_start: bool = True
    """Evaluate before a stage's first step."""
    greedy: bool = True
    """Report greedy accuracy (``eval/<name>/accuracy``)."""
    k: int = 8
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
    mode: Literal["sync", "train"] = "sync"
    """``sync``: explore and train alternately (RL); ``train``: train from the taskset only (SFT)."""
    seed: int = 42
    """Seed of every random stream (task order, sampling, mini-batch shuffles)."""
    num_threads: int | None = None
    """torch CPU threads (None: torch's default)."""
    resume: bool = True
    """Continue from the last checkpoint in the run directory if there is one."""
    stop_after_steps: int | None = None
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

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        if self.tasks.train is None:
            raise ValueError("tasks.train is required: the taskset to explore (or to train on in train mode)")
        problems = []
        if self.sync.sync_interval < 1 or self.sync.sync_offset < 0:
            problems.append(
                f"sync.sync_interval={self.sync.sync_interval} must be >= 1 and "
                f"sync.sync_offset={self.sync.sync_offset} must be >= 0"
            )
        if self.mode == "train" and (self.sync.sync_offset or self.sync.sync_interval != 1):
            problems.append(
                "sync settings only apply to mode 'sync' (there is no explorer in mode 'train'); "
                "remove them or set mode: sync"
            )
        algo = (
            None
            if registry.check("algorithm", self.algorithm.name)
            else registry.resolve("algorithm", self.algorithm.name)
        )
        if algo is not None and self.mode == "sync" and not algo.from_rollouts:
            problems.append(
                f"algorithm {self.algorithm.name!r} trains from data, not rollouts; "
                "set mode: train for it, or pick an RL algorithm such as grpo"
            )
        if algo is not None:
            problems += _algorithm_problems(self, algo)
        if algo is not None and self.mode == "train" and algo.from_rollouts:
            problems.append(
                f"mode 'train' needs a supervised algorithm such as sft, not {self.algorithm.name!r}; "
                "set mode: sync to learn from rollouts"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self


def _algorithm_problems(cfg: RunConfig, preset: Any) -> list[str]:
    """Overrides that do not fit the algorithm's functions, and data the algorithm needs but lacks."""
    problems = []
    try:
        algo = preset.with_overrides(**cfg.algorithm.model_dump(exclude={"name"}))
        algo.check_args()
    except ValueError as err:
        return [str(err)]
    if algo.expert_ratio > 0 and cfg.tasks.expert is None:
        problems.append(f"algorithm {algo.name!r} mixes expert rows; set tasks.expert to a taskset of them")
    if algo.loss == "distill" and cfg.explorer.teacher is None:
        problems.append("algorithm 'distill' needs a teacher model; set explorer.teacher to its directory")
    return problems


class ConfigError(ValueError):
    """Every problem found in a config, one per line, each with its key path."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__(f"{len(errors)} error(s) in the config:\n" + "\n".join(f"  - {e}" for e in errors))


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    node = data
    parts = key.split(".")
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth]) or "the top level"
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(
                    [
                        f"override {key!r}: {where} is a list of {len(node)}; "
                        f"use an index 0..{len(node) - 1} instead of {part!r}"
                    ]
                )
            index: Any = int(part)
        elif isinstance(node, dict):
            index = part
        else:
            raise ConfigError(
                [f"override {key!r}: {where} is a value, not a mapping; it has no key {part!r}"]
            )
        if depth == len(parts) - 1:
            node[index] = value
        else:
            if isinstance(node, dict) and node.get(part) is None:
                node[part] = {}
            node = node[index]


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides (values parsed as YAML: numbers, bools, lists)."""
    data = copy.deepcopy(data)
    bad = [o for o in overrides if "=" not in o]
    if bad:
        raise ConfigError([f"override {o!r} is not of the form key.sub=value" for o in bad])
    for item in overrides:
        key, _, raw = item.partition("=")
        _set_dotted(data, key.strip(), yaml.safe_load(raw) if raw.strip() else None)
    return data


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge ``override`` into a copy of ``base`` (dicts merge, everything else replaces)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _model_at(loc: tuple) -> type[BaseModel] | None:
    model: Any = RunConfig
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        ann = field.annotation
        candidates = [ann, *getattr(ann, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return model


def _format(err: dict[str, Any], prefix: str) -> str:
    loc = tuple(err["loc"])
    path = prefix + ".".join(str(p) for p in loc) if loc else prefix.rstrip(".") or "<root>"
    if err["type"] == "extra_forbidden":
        parent = _model_at(loc[:-1])
        valid = list(parent.model_fields) if parent else []
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(valid)}"
        return f"{path}: unknown key; {hint}"
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] not in ("value_error", "assertion_error") and "input" in err:
        msg += f" (got {err['input']!r})"
    return f"{path}: {msg}"


def validate_dict(
    data: dict[str, Any], base_dir: str | Path | None = None
) -> tuple[list[RunConfig], list[str]]:
    """Validate a raw config dict; returns (one config per stage, errors).

    Without ``stages`` the config is its own single stage. With ``stages``, each entry is merged
    over the top-level settings and validated on its own (errors carry ``stages.<i>.`` paths).
    """
    errors: list[str] = []
    context = {"base_dir": str(base_dir) if base_dir else None}

    def check(raw: dict[str, Any], prefix: str) -> RunConfig | None:
        try:
            return RunConfig.model_validate(raw, context=context)
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
    names = [s.stage for s in stages]
    errors.extend(f"stages: stage name {n!r} is used twice" for n in sorted(set(names)) if names.count(n) > 1)
    return stages, errors


def load_config(path: str | Path, overrides: list[str] | None = None) -> list[RunConfig]:
    """Read, override and validate a YAML config; raise :class:`ConfigError` with every problem."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError([f"config file {str(path)!r} does not exist"])
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError([f"{path}: not valid YAML: {err}"]) from err
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: expected a mapping at the top level, got {type(data).__name__}"])
    data = apply_overrides(data, overrides or [])
    stages, errors = validate_dict(data, base_dir=path.absolute().parent)  # absolute paths out
    if errors:
        raise ConfigError(errors)
    return stages


def reference_markdown() -> str:
    """The config reference (every section, field, type, default and docstring) as Markdown."""
    sections: list[tuple[str, type[BaseModel]]] = [("(top level)", RunConfig)]
    seen: set[type] = {RunConfig}
    lines: list[str] = []
    while sections:
        title, model = sections.pop(0)
        lines += [f"#### `{title}`", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            ann = field.annotation
            nested = next(
                (
                    c
                    for c in (ann, *getattr(ann, "__args__", ()))
                    if isinstance(c, type) and issubclass(c, BaseModel)
                ),
                None,
            )
            if nested is not None and nested not in seen:
                seen.add(nested)
                sections.append((name if model is RunConfig else f"{title}.{name}", nested))
            type_name = _type_name(ann)
            default = "(section)" if nested is not None else f"`{field.default!r}`"
            doc = (field.description or "").replace("\n", " ").replace("|", "\\|")
            lines.append(f"| `{name}` | {type_name.replace('|', chr(92) + '|')} | {default} | {doc} |")
        lines.append("")
    return "\n".join(lines)


def _type_name(ann: Any) -> str:
    import typing

    if typing.get_origin(ann) is Literal:
        return " / ".join(repr(a) for a in typing.get_args(ann))
    text = getattr(ann, "__name__", None) if not typing.get_args(ann) else None
    text = text or str(ann)
    return text.replace("typing.", "").replace("trine.config.", "")
