"""From config sections to objects: the wiring that ``loop.py`` runs.

Every component receives only its own section's values as plain keyword arguments.
"""

from __future__ import annotations

import copy
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trine import registry
from trine.config import RunConfig, TasksetConfig

log = logging.getLogger("trine")


@dataclass
class Stage:
    """Everything one stage of a run needs, built from its config."""

    cfg: RunConfig
    algorithm: Any
    trainer: Any
    scheduler: Any
    eval_sets: list[Any]
    buffer: Any = None
    engine: Any = None
    explorer: Any = None
    eval_explorer: Any = None
    """Explorer over the trainer's own weights (the explorer itself unless it samples a snapshot)."""
    sync: Any = None
    gate: Any = field(default_factory=threading.Lock)
    """Held by the explorer while it explores a batch; taken to checkpoint a consistent state."""
    total_steps: int = 0
    step: int = 0
    """Steps of this stage already done (non-zero after a resume)."""
    pending: list[tuple[int, int, dict[str, float]]] = field(default_factory=list)
    """Explored batches not yet trained: (batch index, experiences, explorer metrics)."""
    expert: Any = None
    """Scheduler of expert rows mixed into each batch (MIX)."""
    operators: Any = None
    """Operator pipeline between explorer and buffer (``buffer.operators``)."""

    def train(self, experiences: list[Any]) -> dict[str, float]:
        """``trainer.step`` on the worker thread of the engine over the trainer's weights, so one
        thread does all the torch work (:meth:`trine.models.engine.HFEngine.call` says why)."""
        engine = getattr(self.eval_explorer, "model", None)
        if getattr(engine, "model", None) is not self.trainer.model or not hasattr(engine, "call"):
            return self.trainer.step(experiences)  # no engine, or one over a snapshot (sync_offset)
        return engine.call(self.trainer.step, experiences)


def load_policy(cfg: RunConfig, path: str | None = None) -> tuple[Any, Any]:
    """Load the model and tokenizer (building a tiny preset model first if asked)."""
    from trine.models import init_model, load_model, load_tokenizer
    from trine.models.loading import resolve_device

    m = cfg.model
    if path is None and m.init_preset and not Path(m.path).exists():
        init_model(m.init_preset, m.path, seed=cfg.seed)
    source = path or m.path
    device = resolve_device(m.device)
    model = load_model(source, dtype=m.dtype, device=device, trust_remote_code=m.trust_remote_code)
    tokenizer = load_tokenizer(path or m.tokenizer_path or m.path, trust_remote_code=m.trust_remote_code)
    return model, tokenizer


def build_algorithm(cfg: RunConfig) -> Any:
    a = cfg.algorithm
    preset = registry.resolve("algorithm", a.name)
    overrides = a.model_dump(exclude={"name"})
    return preset.with_overrides(**overrides)


def build_taskset(ts: TasksetConfig, extra_workflow_args: dict[str, Any] | None = None) -> Any:
    from trine.tasks import TaskSet

    kwargs = ts.model_dump(exclude={"response_key", "chosen_key", "rejected_key", "weight"})
    kwargs["sampling"] = ts.sampling.model_dump()
    kwargs["workflow_args"] = {**ts.workflow_args, **(extra_workflow_args or {})}
    return TaskSet(**kwargs)


def build_task_scheduler(cfg: RunConfig, tasksets: list[Any]) -> Any:
    """The ``tasks → explorer`` scheduler: one taskset, several mixed by weight, or a curriculum."""
    from trine.tasks import build_scheduler

    t = cfg.tasks
    weights = None
    if len(tasksets) > 1 and any(x.weight is not None for x in [t.train, *t.mix]):
        weights = [1.0 if x.weight is None else x.weight for x in [t.train, *t.mix]]
    return build_scheduler(
        tasksets,
        weights=weights,
        selector=t.selector,
        difficulty_key=t.difficulty_key,
        descending=t.descending,
        curriculum=t.curriculum,
        seed=cfg.seed,
        epochs=t.epochs if t.total_steps is None else None,
        shuffle=t.shuffle,
    )


def build_stage(cfg: RunConfig, model: Any, tokenizer: Any, run_dir: Path) -> Stage:
    """Build the trainer, task scheduler, buffer and explorer of one stage around ``model``."""
    from trine.tasks import TaskScheduler
    from trine.trainer import Trainer

    algorithm = build_algorithm(cfg)
    train_set = build_taskset(cfg.tasks.train, extra_workflow_args=algorithm.rollout_args)
    if train_set.skipped_rows:
        log.warning(
            "taskset %s: skipped %d bad row(s) (tasks.train.on_bad_row=skip)",
            train_set.name,
            train_set.skipped_rows,
        )
    mixed = [build_taskset(m, extra_workflow_args=algorithm.rollout_args) for m in cfg.tasks.mix]
    scheduler = build_task_scheduler(cfg, [train_set, *mixed])
    total = cfg.tasks.total_steps or scheduler.total_batches(cfg.tasks.batch_size)
    ref_model = _frozen_copy(model) if algorithm.needs_ref else None
    t = cfg.trainer
    critic = None
    if algorithm.needs_critic:
        from trine.trainer.critic import Critic, ValueModel

        critic = Critic(
            ValueModel.from_policy(model),
            lr=t.critic_lr or t.lr,
            grad_clip=t.grad_clip,
            warmup_steps=t.critic_warmup_steps,
            betas=t.betas,
            weight_decay=t.weight_decay,
        )
    trainer = Trainer(
        model,
        algorithm,
        pad_token_id=tokenizer.pad_token_id,
        ref_model=ref_model,
        critic=critic,
        total_steps=total,
        max_response_length=cfg.tasks.train.sampling.max_tokens,
        seed=cfg.seed,
        teacher=_teacher(cfg) if "teacher_logprobs" in algorithm.loss_inputs else None,
        **t.model_dump(exclude={"save_every", "keep_checkpoints", "critic_lr", "critic_warmup_steps"}),
    )
    stage = Stage(
        cfg=cfg,
        algorithm=algorithm,
        trainer=trainer,
        scheduler=scheduler,
        total_steps=total,
        eval_sets=[build_taskset(e) for e in cfg.tasks.eval],
    )
    if cfg.tasks.expert is not None and algorithm.expert_ratio > 0:
        stage.expert = TaskScheduler(
            build_taskset(cfg.tasks.expert), shuffle=True, seed=cfg.seed, epochs=None
        )
    if cfg.mode == "sync" or stage.eval_sets:
        _build_explorer(stage, model, tokenizer, run_dir)
    return stage


def _build_explorer(stage: Stage, model: Any, tokenizer: Any, run_dir: Path) -> None:
    """Rollout engine, explorer, weight sync and buffer. With ``sync.method: copy`` the engine samples
    a snapshot copy of the weights and evaluation gets its own engine over the trainer's weights."""
    from trine.sync import SYNC_METHODS

    cfg = stage.cfg
    method = cfg.sync.resolved_method if cfg.mode == "sync" else "shared"
    snapshot = method == "copy"
    stage.engine = _engine(cfg, _frozen_copy(model) if snapshot else model, tokenizer)
    stage.sync = SYNC_METHODS[method]()
    rollouts = run_dir / "rollouts.jsonl" if cfg.explorer.dump_rollouts else None
    stage.explorer = stage.eval_explorer = _explorer(cfg, stage.engine, rollouts)
    if snapshot and stage.eval_sets:
        stage.eval_explorer = _explorer(cfg, _engine(cfg, model, tokenizer), None)
    stage.buffer = build_buffer(cfg, run_dir)
    if cfg.buffer.operators:
        from trine.buffer import build_pipeline

        stage.operators = build_pipeline(cfg.buffer.operators)


def _engine(cfg: RunConfig, model: Any, tokenizer: Any) -> Any:
    """The configured rollout engine (``model.engine``) over ``model``."""
    engine_class = registry.resolve("engine", cfg.model.engine)
    return engine_class(model, tokenizer, max_batch_size=cfg.explorer.max_batch_size, seed=cfg.seed)


def build_buffer(cfg: RunConfig, run_dir: Path) -> Any:
    """The configured storage, by the route ``trine buffer`` takes too (:func:`trine.buffer.open_buffer`)."""
    from trine.buffer import open_buffer

    return open_buffer(cfg.buffer, run_dir)


def _teacher(cfg: RunConfig) -> Any:
    if cfg.explorer.teacher is None:
        return None
    from trine.models import load_model
    from trine.models.loading import resolve_device

    teacher = load_model(cfg.explorer.teacher, dtype=cfg.model.dtype, device=resolve_device(cfg.model.device))
    return teacher.requires_grad_(False)


def _explorer(cfg: RunConfig, engine: Any, rollouts: Path | None) -> Any:
    from trine.explorer import Explorer

    e = cfg.explorer
    return Explorer(
        engine,
        timeout=e.timeout,
        max_retries=e.max_retries,
        max_concurrency=e.max_concurrency,
        reward_timeout=e.reward_timeout,
        rollouts_path=rollouts,
        blocking_threads=e.blocking_threads,
        max_skip_ratio=e.max_skip_ratio,
        warn_skip_ratio=e.warn_skip_ratio,
    )


def _frozen_copy(model: Any) -> Any:
    copied = copy.deepcopy(model)
    copied.eval()
    copied.requires_grad_(False)
    return copied


def set_threads(n: int | None) -> None:
    if n:
        torch.set_num_threads(n)
