"""From config sections to objects: the wiring that ``loop.py`` runs.

Every component receives only its own section (the trainer, the buffer's sampling rules, an engine's
``from_config``) or plain arguments. Each role is built whole: every field goes to its constructor, and
nothing is assigned to a built object afterwards.
"""

from __future__ import annotations

import copy
import inspect
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trine import registry
from trine.config import ExplorerConfig, RunConfig, TasksetConfig, TrainerConfig
from trine.explorer.evaluator import Evaluator
from trine.explorer.side import ExpertRows, ExplorerSide, Shaping, StaleRetry
from trine.stage import Stage
from trine.trainer.side import TrainerSide
from trine.trainer.sources import BufferSource, SupervisedSource

log = logging.getLogger("trine")


def load_policy(
    cfg: RunConfig,
    path: str | None = None,
    *,
    weights: bool = True,
    say: Callable[[str], None] | None = None,
) -> tuple[Any, Any]:
    """Load the model and tokenizer (building a tiny preset model first if asked). ``path``: a
    checkpoint's weights; with ``trainer.lora`` and an adapter saved in the checkpoint, the base model
    from ``model.path`` instead, marked with ``trine_adapter_dir`` for the trainer to resume.
    ``weights=False``: the tokenizer only, model None (an explorer whose engine loads the weights itself:
    :func:`engine_weights` ``"copy"``). ``say``: told what is being built or loaded (a command's console),
    before it starts."""
    from trine.models import init_model, load_model, load_tokenizer
    from trine.models.loading import resolve_device

    m = cfg.model
    say = say or (lambda _: None)
    if path is None and m.init_preset and not Path(m.path).exists():
        say(f"building model {m.init_preset} in {m.path} ...")
        init_model(m.init_preset, m.path, seed=cfg.seed)
    if not weights:
        return None, load_tokenizer(path or m.tokenizer_path or m.path, trust_remote_code=m.trust_remote_code)
    if path is not None and not (Path(path) / "config.json").is_file():  # a trainer rank's checkpoint
        from trine.trainer.ranks import leader_checkpoint

        path = leader_checkpoint(path)
    source = path or m.path
    adapter = Path(path) / "adapter" if path is not None else None
    if adapter is not None and cfg.trainer.lora is not None and adapter.is_dir():
        source = m.path  # a LoRA checkpoint: the frozen base and the adapter trained on it
    device = resolve_device(m.device)
    say(f"loading model {source} on {device} ...")
    resumed = str(adapter) if source != path and adapter is not None and adapter.is_dir() else None
    model = load_model(
        source, dtype=m.dtype, device=device, trust_remote_code=m.trust_remote_code, adapter_dir=resumed
    )
    tokenizer = load_tokenizer(path or m.tokenizer_path or m.path, trust_remote_code=m.trust_remote_code)
    return model, tokenizer


ROUTED: dict[type[BaseModel], dict[str, str]] = {
    TrainerConfig: {
        "save_every": "the checkpoint cadence (trine.loop)",
        "keep_checkpoints": "the checkpoint writer (trine.rundir)",
        "critic_lr": "the critic (trine.trainer.critic)",
        "critic_warmup_steps": "the critic (trine.trainer.critic)",
        "batch_size": "the trainer side (trine.trainer.side.TrainerSide)",
        "lora": "the policy preparation (trine.trainer.policy)",
        "gradient_checkpointing": "the policy preparation (trine.trainer.policy)",
        "fsdp": "the policy preparation (trine.trainer.policy)",
        "ref_offload": "the reference model (trine.trainer.policy)",
    },
    TasksetConfig: {
        "response_key": "supervised rows (trine.tasks.supervised)",
        "chosen_key": "preference pairs (trine.tasks.supervised)",
        "rejected_key": "preference pairs (trine.tasks.supervised)",
        "weight": "the task scheduler's mixing weights",
    },
}
"""Fields of a config section that its main object does not read, and who reads them instead: the
``trainer`` section's fields that :class:`~trine.trainer.Trainer` (which takes the section) leaves to
others, the ``tasks.*`` fields that :class:`~trine.tasks.TaskSet` takes no parameter for
(tests/unit/config/test_declarations.py keeps the first in step with what the Trainer reads)."""


def section_kwargs(section: BaseModel, target: Callable[..., Any]) -> dict[str, Any]:
    """The fields of ``section`` that ``target`` takes as keyword arguments. Every other field must be
    named in :data:`ROUTED`, so a new config field reaches its component or fails loudly here."""
    params = inspect.signature(target).parameters
    routed = ROUTED.get(type(section), {})
    values = section.model_dump()
    lost = [k for k in values if k not in params and k not in routed]
    if lost:
        raise TypeError(
            f"{type(section).__name__} fields {lost} reach neither {target.__qualname__}() nor a reader "
            "named in trine.build.ROUTED; add the parameter or route the field there."
        )
    return {k: v for k, v in values.items() if k in params}


def build_algorithm(cfg: RunConfig) -> Any:
    a = cfg.algorithm
    preset = registry.resolve("algorithm", a.name)
    overrides = a.model_dump(exclude={"name"})
    return preset.with_overrides(**overrides)


def build_taskset(ts: TasksetConfig, extra_workflow_args: dict[str, Any] | None = None) -> Any:
    from trine.tasks import TaskSet

    kwargs = section_kwargs(ts, TaskSet)
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


def build_stage(
    cfg: RunConfig, model: Any, tokenizer: Any, run_dir: Path, part: str = "all", source: Any = None
) -> Stage:
    """Build the roles of one stage around ``model``: the trainer side, and the explorer side (modes
    ``sync`` and ``async``) or the supervised source (mode ``train``), plus evaluation.
    ``part="trainer"``: a trainer process whose explorers are other processes (``trine train``);
    ``source``: a trainer-only stage on it (:func:`build_trainer_stage`)."""
    if source is not None:
        return build_trainer_stage(cfg, model, tokenizer, source)
    algorithm = build_algorithm(cfg)
    if cfg.tasks.source == "buffer":
        return _buffer_stage(cfg, algorithm, model, tokenizer, run_dir)
    if cfg.tasks.source == "serve":  # the agents' calls to `trine serve` are the tasks: a trainer process
        assert part == "trainer" and cfg.tasks.total_steps is not None, "config checks refuse anything else"
        trainer = _trainer(cfg, algorithm, model, tokenizer, cfg.tasks.total_steps)
        side, evaluator = _trainer_process(cfg, trainer, model, tokenizer, run_dir)
        return Stage(cfg=cfg, trainer=side, total_steps=cfg.tasks.total_steps, evaluator=evaluator)
    scheduler = _scheduler(cfg, algorithm, run_dir)
    total = cfg.tasks.total_steps or scheduler.total_batches(cfg.tasks.batch_size)
    trainer = _trainer(cfg, algorithm, model, tokenizer, total)
    if cfg.mode == "train":
        source = SupervisedSource(scheduler, cfg.tasks.batch_size, _rows(cfg, algorithm, tokenizer))
        evaluator, on_worker = _evaluation(cfg, model, tokenizer)
        side = TrainerSide(trainer, None, None, on_worker=on_worker)
        return Stage(cfg=cfg, trainer=side, total_steps=total, source=source, evaluator=evaluator)
    if part == "trainer":
        side, evaluator = _trainer_process(cfg, trainer, model, tokenizer, run_dir)
        return Stage(cfg=cfg, trainer=side, total_steps=total, evaluator=evaluator)
    return _explored_stage(cfg, algorithm, scheduler, trainer, model, tokenizer, run_dir, total)


def build_explorer_process(
    cfg: RunConfig, model: Any, tokenizer: Any, run_dir: Path, index: int, count: int, buffer: Any = None
) -> ExplorerSide:
    """The explorer side of explorer process ``index`` of ``count`` (``trine explore``): tasks claimed from
    the run's SQL buffer's task ledger (or through ``buffer``: a Ray buffer writer, which numbers the task
    stream itself), the trainer's weights (:func:`process_sync`); its batch count goes on from its last
    incarnation's (the buffer counts the batches it put)."""
    from trine.explorer.claims import TaskClaims, TaskStream

    algorithm = build_algorithm(cfg)
    scheduler = _scheduler(cfg, algorithm, run_dir)
    engine = _engine(cfg, model, tokenizer)
    rollouts = run_dir / "explorers" / str(index) / "rollouts.jsonl" if cfg.explorer.dump_rollouts else None
    sync = process_sync(cfg, run_dir, f"explorer-{index}")
    explorer = _explorer(cfg, engine, rollouts)
    name = f"explorer-{index}"
    side = _make_explorer_side(
        cfg, algorithm, scheduler, explorer, sync, run_dir, tokenizer, buffer, producer=name
    )
    stream = (
        None if buffer is not None else TaskStream(scheduler, cfg.tasks.batch_size, name)
    )  # Ray: the writer's
    side.claims = TaskClaims(side.buffer, stream, name, cfg.explorer.lease_seconds)
    return side


def task_stream(cfg: RunConfig, run_dir: Path, owner: str) -> Any:
    """The run's task stream, numbered for the task ledger of explorer processes
    (:class:`trine.explorer.claims.TaskStream`), as ``owner`` draws it."""
    from trine.explorer.claims import TaskStream

    return TaskStream(_scheduler(cfg, build_algorithm(cfg), run_dir), cfg.tasks.batch_size, owner)


def engine_class(cfg: RunConfig, *, local: bool = False) -> Any:
    """The table entry of the configured rollout engine (``model.engine``: :data:`trine.models.ENGINES`, a
    plugin or an import path); ``local``: the ``hf`` engine whatever the config says."""
    return registry.resolve("engine", "hf" if local else cfg.model.engine)


def engine_weights(cfg: RunConfig) -> str:
    """Where the configured engine's weights live (its class's ``weights``, :mod:`trine.models.protocol`):
    ``given`` (the model it is built on), ``copy`` (its own, built from ``model.path``) or ``server``."""
    return getattr(engine_class(cfg), "weights", "given")


def process_sync(cfg: RunConfig, run_dir: Path, role: str) -> Any:
    """The weight sync of a trainer (``role="trainer"``) or explorer process (``explorer-<i>``):
    ``published`` through ``<run_dir>/weights``, or ``broadcast`` over torch.distributed from the trainer,
    which listens at ``sync.address`` (None: a free port on loopback, written to
    ``<run_dir>/weights/broadcast.json`` for the explorers of this machine)."""
    from trine.sync import PublishedWeights

    s = cfg.sync
    if cfg.sync_method == "published":  # an engine on a server loads the published weights itself
        return PublishedWeights(run_dir / "weights", keep=s.keep, load=engine_weights(cfg) != "server")
    from trine.sync.broadcast import BroadcastReceiver, BroadcastSender, host_port
    from trine.sync.rendezvous import read_address, recorded_address, write_address

    if role == "trainer":
        host, port = host_port(s.address or "127.0.0.1:0")
        sender = BroadcastSender(host, port, s.bucket_mb, s.broadcast_backend, s.broadcast_timeout)
        if s.address is None:
            write_address(run_dir / "weights", sender.address)
        return sender
    if s.address is not None:
        return BroadcastReceiver(s.address, role, s.broadcast_backend, s.broadcast_timeout)
    directory = run_dir / "weights"
    address = read_address(directory, s.wait_timeout)
    find = lambda: recorded_address(directory)  # noqa: E731 - a restarted trainer records a new port
    return BroadcastReceiver(address, role, s.broadcast_backend, s.broadcast_timeout, find=find)


def build_server(
    cfg: RunConfig, model: Any, tokenizer: Any, run_dir: Path, index: int = 0
) -> tuple[Any, Any, Any]:
    """What ``trine serve`` wires (:mod:`trine.launch.serve`): the rollout engine, the session store
    writing into the run's SQL buffer, and the weights the trainer publishes."""
    from trine.serve.sessions import SessionStore
    from trine.sync import PublishedWeights

    engine = _engine(cfg, model, tokenizer, local=True)  # the server samples its own weights
    store = SessionStore(build_buffer(cfg, run_dir), tokenizer, session_timeout=cfg.serve.session_timeout)
    return engine, store, PublishedWeights(run_dir / "weights", keep=cfg.sync.keep)


def _scheduler(cfg: RunConfig, algorithm: Any, run_dir: Path | None = None) -> Any:
    """The explored tasksets' scheduler; ``run_dir`` reaches the workflows that declare a ``run_dir``
    parameter (:func:`_run_dir_args`)."""

    def extra(ts: TasksetConfig) -> dict[str, Any]:
        return {**algorithm.rollout_args, **_run_dir_args(ts, run_dir)}

    train_set = build_taskset(cfg.tasks.train, extra_workflow_args=extra(cfg.tasks.train))
    if train_set.skipped_rows:
        log.warning(
            "taskset %s: skipped %d bad row(s) (tasks.train.on_bad_row=skip)",
            train_set.name,
            train_set.skipped_rows,
        )
    mixed = [build_taskset(m, extra_workflow_args=extra(m)) for m in cfg.tasks.mix]
    return build_task_scheduler(cfg, [train_set, *mixed])


def _run_dir_args(ts: TasksetConfig, run_dir: Path | None) -> dict[str, Any]:
    """``{"run_dir": <absolute run directory>}`` when the taskset's workflow class declares a ``run_dir``
    parameter (``human_feedback``: its annotation queue's default home), else ``{}``."""
    if run_dir is None:
        return {}
    try:
        params = inspect.signature(registry.resolve("workflow", ts.workflow)).parameters
    except (TypeError, ValueError):
        return {}
    return {"run_dir": str(Path(run_dir).absolute())} if "run_dir" in params else {}


def _buffer_stage(cfg: RunConfig, algorithm: Any, model: Any, tokenizer: Any, run_dir: Path) -> Stage:
    """``mode: train`` with ``tasks.source: buffer``: the trainer on the rows of the configured buffer
    (:class:`~trine.trainer.sources.BufferSource`), ``tasks.batch_size`` rows (pairs for a pairwise algorithm, given
    out whole: ``whole_groups``) per step, plus evaluation."""
    from trine.buffer import open_buffer
    from trine.buffer.open import SQL_STORAGES

    total = cfg.tasks.total_steps
    assert total is not None  # checked by the config (tasks.source: buffer needs total_steps)
    section = cfg.buffer.model_copy(update={"whole_groups": True}) if algorithm.pairwise else cfg.buffer
    extra = {"rewind": "reads"} if cfg.buffer.storage in SQL_STORAGES else {}  # rows put since stay
    rows = cfg.tasks.batch_size * (2 if algorithm.pairwise else 1)
    source = BufferSource(
        open_buffer(section, run_dir, **extra), rows, cfg.buffer.get_timeout, algorithm.pairwise
    )
    trainer = _trainer(cfg, algorithm, model, tokenizer, total)
    evaluator, on_worker = _evaluation(cfg, model, tokenizer)
    side = TrainerSide(trainer, None, None, on_worker=on_worker)
    return Stage(cfg=cfg, trainer=side, total_steps=total, source=source, evaluator=evaluator)


def _evaluation(cfg: RunConfig, model: Any, tokenizer: Any) -> tuple[Evaluator | None, Any]:
    """A stage without an explorer (mode train, a trainer process): evaluation of ``tasks.eval`` with its
    own engine over the trainer's weights (None without eval tasksets), and the worker the trainer's step
    runs on (that engine's, :func:`_worker_of`; None: inline)."""
    if not cfg.tasks.eval:
        return None, None
    evaluator = build_evaluator(cfg, _explorer(cfg, _engine(cfg, model, tokenizer), None))
    return evaluator, _worker_of(evaluator.explorer.model, model)


def _trainer_process(
    cfg: RunConfig, trainer: Any, model: Any, tokenizer: Any, run_dir: Path
) -> tuple[TrainerSide, Evaluator | None]:
    """The trainer side of a trainer process, and its evaluation: the run's SQL buffer (a resume undoes
    only what this process took since its checkpoint) and weights published into ``<run_dir>/weights``."""
    from trine.buffer import open_buffer
    from trine.trainer.ranks import world
    from trine.trainer.rewards import VersionRewards

    size, rank = world()
    if size == 1:
        buffer = open_buffer(cfg.buffer, run_dir, rewind="reads")
        sync = process_sync(cfg, run_dir, "trainer")
    else:  # trainer ranks (torchrun): rank 0 takes the batches for all and sends the weights
        from trine.trainer.ranked import GatherOnly, RankedBuffer

        leader = rank == 0
        device = trainer.device if trainer.device.type == "cuda" else None
        buffer = RankedBuffer(open_buffer(cfg.buffer, run_dir, rewind="reads") if leader else None, device)
        sync = process_sync(cfg, run_dir, "trainer") if leader else GatherOnly()
    evaluator, on_worker = _evaluation(cfg, model, tokenizer)
    side = TrainerSide(
        trainer,
        buffer,
        sync,
        sync_interval=cfg.sync.sync_interval,
        batch_size=cfg.trainer_batch_rows,  # a trainer process runs mode async
        get_timeout=cfg.buffer.get_timeout,
        on_worker=on_worker,
        rewards=VersionRewards(),
    )
    return side, evaluator


def _trainer(cfg: RunConfig, algorithm: Any, model: Any, tokenizer: Any, total: int) -> Any:
    from trine.trainer import Trainer
    from trine.trainer.policy import prepare_policy, reference_model

    t = cfg.trainer
    lora = t.lora.model_dump() if t.lora is not None else None
    ref_model = None
    if algorithm.needs_ref and lora is None:  # a frozen copy of the stage's start, taken before sharding
        ref_model = reference_model(model, _frozen_copy, lora=False, offload=t.ref_offload)
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
    policy = prepare_policy(
        model,
        lora=lora,
        gradient_checkpointing=t.gradient_checkpointing,
        fsdp=t.fsdp,
        adapter_dir=getattr(model, "trine_adapter_dir", None),
        seed=cfg.seed,
    )
    if algorithm.needs_ref and lora is not None:  # the base: the policy with its adapters off
        ref_model = reference_model(policy, _frozen_copy, lora=True, offload=False)
    return Trainer(
        policy,
        algorithm,
        t,
        pad_token_id=tokenizer.pad_token_id,
        ref_model=ref_model,
        critic=critic,
        total_steps=total,
        max_response_length=cfg.tasks.train.sampling.max_tokens if cfg.tasks.train else None,
        seed=cfg.seed,
        teacher=_teacher(cfg) if "teacher_logprobs" in algorithm.loss_inputs else None,
    )


def _rows(cfg: RunConfig, algorithm: Any, tokenizer: Any) -> Callable[[list[Any]], list[Any]]:
    """Tasks → supervised rows or preference pairs (``mode: train``), with the taskset's keys."""
    from trine.tasks.supervised import preference_experiences, sft_experiences

    ts = cfg.tasks.train
    if algorithm.pairwise:
        return lambda tasks: preference_experiences(tasks, tokenizer, ts.chosen_key, ts.rejected_key)
    return lambda tasks: sft_experiences(tasks, tokenizer, ts.response_key)


def _explored_stage(
    cfg: RunConfig,
    algorithm: Any,
    scheduler: Any,
    trainer: Any,
    model: Any,
    tokenizer: Any,
    run_dir: Path,
    total: int,
) -> Stage:
    """Modes sync and async in one process: rollout engine, explorer, weight sync and buffer, as the
    explorer side and the trainer side see them. With ``sync.method: copy`` an engine over the given
    weights samples a snapshot copy of them (in the base architecture: LoRA merged, shards gathered) and
    evaluation gets its own engine over the trainer's weights."""
    from trine.models.export import plain_copy
    from trine.sync import SYNC_METHODS

    snapshot = cfg.sync_method == "copy"
    given = engine_weights(cfg) == "given"  # else the engine holds its own copy of the weights
    engine = _engine(
        cfg, plain_copy(model) if snapshot and given else model, tokenizer, cfg.explorer.partial_rollout
    )
    sync = SYNC_METHODS[cfg.sync_method]()
    rollouts = run_dir / "rollouts.jsonl" if cfg.explorer.dump_rollouts else None
    explorer = _explorer(cfg, engine, rollouts)
    on_trainer_weights = explorer  # evaluation and the trainer's thread use the engine over its weights
    if snapshot and cfg.tasks.eval:
        on_trainer_weights = _explorer(cfg, _engine(cfg, model, tokenizer), None)
    evaluator = build_evaluator(cfg, on_trainer_weights) if cfg.tasks.eval else None
    explorer_side = _make_explorer_side(cfg, algorithm, scheduler, explorer, sync, run_dir, tokenizer)
    on_worker = _worker_of(on_trainer_weights.model, model)
    if cfg.mode == "async" and next(model.parameters()).device.type == "cpu":
        on_worker = getattr(engine, "call", None)  # one torch thread: see HFEngine.call
    trainer_side = TrainerSide(
        trainer,
        explorer_side.buffer,
        sync,
        sync_interval=cfg.sync.sync_interval,
        batch_size=cfg.trainer_batch_rows if cfg.mode == "async" else cfg.trainer.batch_size,
        get_timeout=cfg.buffer.get_timeout,
        on_worker=on_worker,
        colocated=engine if getattr(engine, "enable_sleep_mode", False) else None,  # sleeps during steps
    )
    return Stage(
        cfg=cfg, trainer=trainer_side, total_steps=total, explorer=explorer_side, evaluator=evaluator
    )


def _make_explorer_side(
    cfg: RunConfig,
    algorithm: Any,
    scheduler: Any,
    explorer: Any,
    sync: Any,
    run_dir: Path,
    tokenizer: Any,
    buffer: Any = None,
    producer: str | None = None,
) -> ExplorerSide:
    """The explorer side over ``explorer``: the run's buffer (or ``buffer``), the algorithm's shaping, the
    operators and expert rows. ``producer``: an explorer process's name in a shared buffer, which counts
    the batches it put (the side continues after them)."""
    from trine.buffer import build_pipeline

    a = algorithm
    buffer = build_buffer(cfg, run_dir) if buffer is None else buffer
    shaping = Shaping(
        max_tokens=cfg.tasks.train.sampling.max_tokens,
        batch_size=cfg.tasks.batch_size,
        dynamic_sampling=a.dynamic_sampling,
        max_extra_draws=a.max_extra_draws,
        overlong_buffer=a.overlong_buffer,
        overlong_penalty=a.overlong_penalty,
    )
    operators = build_pipeline(cfg.buffer.operators) if cfg.buffer.operators else None
    expert = _expert(cfg, algorithm, tokenizer)
    return ExplorerSide(
        explorer,
        scheduler,
        buffer,
        sync,
        batch_size=cfg.tasks.batch_size,
        shaping=shaping,
        success_threshold=cfg.eval.success_threshold,
        operators=operators,
        expert=expert,
        producer=producer,
        batches=buffer.produced(producer) if producer is not None else 0,
        stale=_stale_retry(cfg),
    )


def _stale_retry(cfg: RunConfig) -> StaleRetry | None:
    """Mode async with a staleness bound: explore again the tasks whose rows were dropped as stale."""
    b = cfg.buffer
    if cfg.mode != "async" or b.max_staleness is None:
        return None
    return StaleRetry(b.stale_retries, b.max_staleness)


def build_evaluator(cfg: RunConfig, explorer: Any) -> Evaluator:
    """Evaluation of ``cfg``'s eval tasksets (``eval`` section) with ``explorer``'s engine."""
    e = cfg.eval
    tasksets = [build_taskset(t) for t in cfg.tasks.eval]
    return Evaluator(explorer, tasksets, e.k, e.greedy, e.success_threshold, seed=cfg.seed)


def _expert(cfg: RunConfig, algorithm: Any, tokenizer: Any) -> ExpertRows | None:
    """MIX: the expert taskset's rows, ``expert_ratio`` per rollout (None without them)."""
    if cfg.tasks.expert is None or algorithm.expert_ratio <= 0:
        return None
    from trine.tasks import TaskScheduler
    from trine.tasks.supervised import sft_experiences

    expert = cfg.tasks.expert
    scheduler = TaskScheduler(build_taskset(expert), shuffle=True, seed=cfg.seed, epochs=None)
    return ExpertRows(
        scheduler,
        algorithm.expert_ratio,
        lambda tasks: sft_experiences(tasks, tokenizer, expert.response_key),
    )


def _worker_of(engine: Any, model: Any) -> Callable[..., Any] | None:
    """``engine.call`` when ``engine`` samples ``model`` itself (the trainer's step then runs on the
    engine's worker thread: one thread does all the torch work, see ``HFEngine.call``), else None."""
    if getattr(engine, "model", None) is model and hasattr(engine, "call"):
        return engine.call
    return None


def _engine(
    cfg: RunConfig, model: Any, tokenizer: Any, partial_rollout: bool = False, *, local: bool = False
) -> Any:
    """The configured rollout engine (``model.engine``) over ``model``, built by its table entry: the class's
    ``from_config`` (``openai``, ``vllm``), else the constructor convention of :mod:`trine.models.protocol`
    (``partial_rollout``: mode async). ``local``: the ``hf`` engine whatever the config says (``trine serve``
    itself samples the local model for the explorers that call it)."""
    engine = engine_class(cfg, local=local)
    from_config = getattr(engine, "from_config", None)
    if from_config is not None:
        return from_config(model, tokenizer, cfg.model, cfg.explorer, cfg.seed)
    extra: dict[str, Any] = {"partial_rollout": True} if partial_rollout else {}  # mode async
    if cfg.explorer.prefix_cache_tokens != ExplorerConfig().prefix_cache_tokens:
        extra["prefix_cache_tokens"] = cfg.explorer.prefix_cache_tokens  # checked at validate time
    return engine(model, tokenizer, max_batch_size=cfg.explorer.max_batch_size, seed=cfg.seed, **extra)


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


_AUXILIARY: dict[int, tuple[RunConfig, dict[str, Any]]] = {}
"""Auxiliary models by stage config (built once per stage, shared by its explorers)."""


def _auxiliary(cfg: RunConfig) -> dict[str, Any]:
    """``explorer.auxiliary_models``: a local model with its own engine, or an OpenAI-compatible client."""
    if not cfg.explorer.auxiliary_models:
        return {}
    if id(cfg) not in _AUXILIARY:
        from trine.models import load_model, load_tokenizer
        from trine.models.auxiliary import build_auxiliary
        from trine.models.loading import resolve_device

        def local(spec: Any) -> Any:
            model = load_model(spec.path, dtype=spec.dtype, device=resolve_device(cfg.model.device))
            return registry.resolve("engine", "hf")(model, load_tokenizer(spec.path), seed=cfg.seed)

        _AUXILIARY[id(cfg)] = (cfg, build_auxiliary(cfg.explorer.auxiliary_models, local))
    return _AUXILIARY[id(cfg)][1]


def _explorer(cfg: RunConfig, engine: Any, rollouts: Path | None) -> Any:
    from trine.explorer import Explorer

    e = cfg.explorer
    return Explorer(
        engine,
        auxiliary_models=_auxiliary(cfg),
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


def build_eval_explorer(cfg: RunConfig, model: Any, tokenizer: Any) -> Any:
    """An explorer over an engine of ``model`` for evaluation only (no rollouts file): what a run's
    evaluation samples with, for ``trine bench`` on a checkpoint's weights."""
    return _explorer(cfg, _engine(cfg, model, tokenizer), None)


def build_trainer_stage(cfg: RunConfig, model: Any, tokenizer: Any, source: Any) -> Stage:
    """A trainer-only stage on ``source`` (a :class:`~trine.trainer.sources.Source` with a length: the steps of a
    replay, ``trine train --replay``), built as :func:`build_stage` builds the trainer side for ``cfg``
    (same algorithm, trainer settings, seed and schedule length), with no buffer, weight sync, explorer
    or evaluation."""
    algorithm = build_algorithm(cfg)
    total = cfg.tasks.total_steps or _scheduler(cfg, algorithm).total_batches(cfg.tasks.batch_size)
    trainer = _trainer(cfg, algorithm, model, tokenizer, total)
    return Stage(cfg=cfg, trainer=TrainerSide(trainer, None, None), total_steps=len(source), source=source)
