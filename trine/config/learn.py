"""Config sections of the learning side: the buffer (its sampling rules, :class:`BufferRules`), the trainer,
weight sync, evaluation and monitoring (re-exported by :mod:`trine.config`; the algorithm's section:
:mod:`trine.config.algorithm`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    field_validator,
    model_validator,
)

from trine.config.base import (
    Beta,
    Count,
    NonNeg,
    NonNegInt,
    Positive,
    Section,
    TrajectoryStatus,
    _check_name,
)
from trine.config.watch import AlertsConfig, PlateauConfig


class BufferRules(Section):
    """The ``buffer`` keys that say how a buffer hands experiences to the trainer: every storage takes them
    as one value, :class:`trine.buffer.sampling.SamplingRules` (this class with the rules' logic), and
    applies them identically (the order they apply in: :mod:`trine.buffer.sampling`)."""

    sampler: Literal["fifo", "priority"] = "fifo"
    """``fifo``: each experience once, oldest first (put order; with ``max_staleness``, oldest weights
    first). ``priority``: replay — fresher, less-used first, each up to ``reuse_limit`` times, not again
    for ``cooldown`` gets."""
    reuse_limit: Count = 1
    """Times an experience may be handed out (priority sampler)."""
    reuse_decay: NonNeg = 1.0
    """Priority = policy_version - use_count × reuse_decay."""
    cooldown: NonNegInt = 0
    """Gets an experience waits after each use before it is eligible again."""
    max_staleness: NonNegInt | None = None
    """Drop (and count) experiences more than this many versions older than the trainer's."""
    stale_retries: NonNegInt = 2
    """Mode async: a task whose rows were all dropped by ``max_staleness`` is explored again with newer
    weights, up to this many times, then counted lost; never silently lost. Counted in
    ``explorer/tasks_retried`` / ``explorer/tasks_lost`` (one process) or ``buffer/tasks_retried`` /
    ``buffer/tasks_lost`` (explorer processes, through the buffer's task ledger)."""
    pending_timeout: Positive | None = None
    """Seconds a pending (reward=None) experience may wait for its reward."""
    pending_action: Literal["drop", "default"] = "drop"
    """What happens to pending experiences after ``pending_timeout``: dropped, or given ``default_reward``."""
    default_reward: float = 0.0
    """Reward given to timed-out pending experiences with ``pending_action: default``."""
    whole_groups: bool = False
    """Hand out a group only once every member has its reward (group advantages need them all)."""


class BufferConfig(BufferRules):
    """Experience storage between explorer and trainer: the storage, and the sampling rules of
    :class:`BufferRules` (declared there, keys of this section like the others)."""

    storage: str = "memory"
    """Storage: ``memory``, ``sql`` (SQLAlchemy: SQLite or PostgreSQL), ``file`` (jsonl log) or ``package.module:Class``."""
    url: str | None = None
    """Database URL of the ``sql`` storage (default: ``sqlite:///<run_dir>/buffer.db``; PostgreSQL:
    ``postgresql+psycopg://user:password@host/db``)."""
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
    end_after_idle: Positive | None = None
    """Seconds after which a trainer process (``trine train``) whose buffer got no new row and no reward
    ends its stage, finished, with a checkpoint: the agents (``trine serve``) or explorers are done.
    Counted once the stage has trained a step; below ``sync.wait_timeout``. None: wait (up to
    ``sync.wait_timeout``, then fail)."""

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


class LoraConfig(Section):
    rank: Count = 8
    """LoRA rank r of the low-rank update ``W + (α / r) B A``."""
    alpha: Positive = 16.0
    """LoRA scaling α."""
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    """Dropout on the LoRA branch's input."""
    target_modules: str | list[str] = "all-linear"
    """Modules that get adapters: ``all-linear`` (every linear layer but the output head) or names such as
    ``[q_proj, k_proj, v_proj, o_proj]``."""


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
    precision: Literal["fp32", "bf16"] = "fp32"
    """``bf16``: mixed precision — forward and backward under bfloat16 autocast while the weights, the
    optimizer state and the loss math (logprobs, ratios, KL) stay float32 (load the model with
    ``model.dtype: float32``). ``fp32``: everything float32 (the CPU default)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass instead of keeping them (less memory, ~30% more compute)."""
    lora: LoraConfig | None = None
    """Train LoRA adapters (``peft``; ``pip install -e ".[lora]"``) instead of every weight. The
    reference model is the policy with its adapters disabled (no second copy); rollout engines and
    checkpoints get the merged weights, checkpoints also the adapter (``<checkpoint>/adapter``)."""
    fsdp: bool = False
    """Shard parameters, gradients and optimizer state with FSDP2 (``fully_shard`` per decoder layer) over
    the trainer's process group (a one-process group is started when there is none)."""
    ref_offload: bool = False
    """Keep the frozen reference model in CPU memory and move it to the trainer's device only while it
    scores a batch."""
    packed: bool = False
    """Pack each micro-batch's sequences into one row without padding (position ids restart per sequence;
    attention stays within each sequence): no compute on pad tokens. Pays off with
    ``attn_implementation: flash_attention_2`` (varlen kernels); under sdpa / eager the packed row's
    block-diagonal mask makes attention quadratic in the whole micro-batch (``benchmarks/gpu_trainer.py``).
    Needs transformers with packed-sequence masks (>= 4.54)."""
    shared_prompt: bool | Literal["auto"] = "auto"
    """Run each distinct prompt of a micro-batch once for all of its responses (GRPO's ``repeat``
    samples of a task share one prompt) instead of once per sample: the prompt's keys/values are reused
    by its responses and their gradients flow back through them, so logprobs, loss and gradients are
    the per-sample forward's up to float rounding, from fewer tokens (``prompts × (prompt length - 1) +
    rows × longest response`` per micro-batch). A micro-batch holds no more rows than
    ``micro_batch_tokens`` allows the per-sample forward, and keeps each prompt's rows together or
    buckets them by response length, whichever runs fewer tokens (:mod:`trine.models.shared_prompt`).
    ``auto``: per mini-batch, where it runs
    fewer tokens than the per-sample forward (padded or ``packed``) and the model allows it (a
    full-attention KV cache, no gradient checkpointing, no FSDP); ``true``: every step whose prompts
    all hold >= 2 tokens (a model that does not allow it fails when the trainer is built); ``false``:
    never."""
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

    @model_validator(mode="after")
    def _shared_prompt_fits(self) -> TrainerConfig:
        clash = [k for k in ("gradient_checkpointing", "fsdp") if getattr(self, k)]
        if self.shared_prompt is True and clash:
            raise ValueError(
                f"trainer.shared_prompt: true with trainer.{clash[0]}: true; the shared-prompt forward "
                f"runs without {clash[0].replace('_', ' ')}; set trainer.shared_prompt: auto (it then "
                f"stays off) or {clash[0]}: false"
            )
        return self


class SyncConfig(Section):
    sync_interval: Count = 1
    """Batches explored per weight version (k): weights are pushed to the explorer every k steps."""
    sync_offset: NonNegInt = 0
    """Batches the explorer runs ahead of the trainer (m); m > 0 explores from a weight snapshot."""
    method: Literal["shared", "copy", "published", "broadcast"] | None = None
    """How weights reach the explorer: ``shared`` (the engine samples the trainer's own weights, no
    copy), ``copy`` (the engine samples a snapshot, refreshed from in-memory copies every
    ``sync_interval`` steps), ``published`` (the trainer publishes each version into
    ``<run_dir>/weights``, explorer processes load the newest) or ``broadcast`` (the trainer sends each
    version once, down one process group of all explorer processes, over torch.distributed: gloo on CPU,
    NCCL on GPU). None:
    ``broadcast`` with ``cluster.backend: ray``, ``published`` with ``launch: processes``, ``shared`` in
    mode sync with ``sync_offset`` 0, else ``copy`` (``RunConfig.sync_method``, the one place this is
    decided)."""
    keep: Count = 2
    """Published versions kept in ``<run_dir>/weights`` (``published``)."""
    address: str | None = None
    """``broadcast``: ``host:port`` where the trainer listens for explorers. None: a free port, on
    loopback for processes of one machine (recorded in ``<run_dir>/weights/broadcast.json``, read again
    by explorers that lose the trainer: a restarted trainer takes another port), on the trainer's node
    under Ray (the driver picks it)."""
    bucket_mb: Positive = 64.0
    """``broadcast``: tensors travel flattened into buckets of at most this many MB per dtype, cut into
    pieces of at most this size (smaller, down to 1 MB, so that a version makes at least 64 pieces); each
    explorer forwards a piece to the next as soon as it arrived."""
    broadcast_backend: Literal["auto", "gloo", "nccl"] = "auto"
    """``broadcast``: torch.distributed backend; ``auto`` is NCCL where CUDA is available, else gloo."""
    broadcast_timeout: Positive = 60.0
    """``broadcast``: seconds any one step of a transfer may take (forming the group, one piece from one
    process to the next, the explorers' acknowledgements) before the trainer gives the group up and forms
    it again with the explorers that answer (a dead or hung one is dropped; once back, it joins again and
    gets the newest version at once). Give every process of a run the same value."""
    wait_timeout: Positive | None = 600.0
    """Seconds a process waits for the other side (an explorer for the trainer's first weights, the
    trainer for each batch, also in one process) before it stops with an error; None: forever."""

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
    """A rollout counts as a success when its reward (a multi-step rollout: its episode return) is at least
    this: eval's ``accuracy`` and ``avg@k`` / ``pass@k``, training's ``explorer/success_rate`` and the
    scheduler's pass rates. For a return that is a fraction (share of games won), set the share that counts."""
    plateau: PlateauConfig | None = None
    """End the stage early, at an evaluation, once ``plateau.evals`` evaluations in a row brought no gain
    (the next stage then starts; needs ``every`` > 0). None: off."""

    @model_validator(mode="after")
    def _plateau_needs_evals(self) -> EvalConfig:
        if self.plateau is not None and not self.every:
            raise ValueError(
                "eval.plateau needs evaluations during the stage: set eval.every (e.g. 10), or remove "
                "eval.plateau"
            )
        return self


class AlarmsConfig(Section):
    """The run's alarms (:mod:`trine.monitor.alarms`): signs that the policy learns to game its reward,
    each printed once when raised and kept in ``status.json`` (``trine status``, the studio)."""

    enabled: bool = True
    """Watch the logged metrics for the alarms below (false: no alarm at all)."""
    reward_vs_eval: Annotated[float, Field(gt=0)] | None = 0.05
    """Raise ``reward_vs_eval`` when, between the last two evaluations, the training reward rose and the
    eval's main metric (accuracy, else avg@k, else pass@k) fell, each by at least this much (null: off)."""
    truncation: Annotated[float, Field(gt=0, le=1)] | None = 0.9
    """Raise ``truncation`` when ``explorer/truncated_fraction`` averages at least this over the last
    ``window`` steps (null: off)."""
    length: Annotated[float, Field(gt=0, le=1)] | None = 0.95
    """Raise ``length`` when single-turn responses average at least this fraction of the train taskset's
    ``sampling.max_tokens`` over the last ``window`` steps (null: off)."""
    window: Annotated[int, Field(ge=1)] = 5
    """Training steps averaged by the ``truncation`` and ``length`` alarms."""


class MonitorConfig(Section):
    sinks: list[str] = ["console", "jsonl", "tensorboard"]
    """Metric sinks: console, jsonl, tensorboard, wandb, mlflow or ``package.module:Class``."""
    plot: bool = True
    """Write PNG curves into ``<run_dir>/plots`` at the end of the run."""
    alarms: AlarmsConfig = AlarmsConfig()
    """Alarms on reward hacking and truncation during the run."""
    stuck_after: Annotated[float, Field(gt=1)] = 10.0
    """A run whose step has not advanced for this many times its median step time (the last 20 steps) is
    reported ``stuck`` (status.json, ``trine status``, the studio, ``alerts``), never stopped; evaluations
    and checkpoint saves do not count."""
    stuck_min_seconds: Positive = 300.0
    """Never ``stuck`` before this many seconds without a step (before the first step, when there is no
    median yet, this alone)."""
    alerts: AlertsConfig = AlertsConfig()
    """Alerts (a webhook and/or a command) on failed, stuck, finished, stopped and alarm."""

    @field_validator("sinks")
    @classmethod
    def _sinks(cls, v: list[str]) -> list[str]:
        for name in v:
            _check_name("monitor", name)
        return v
