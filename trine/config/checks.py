"""Checks across config sections: settings that the mode or the algorithm does not read or cannot honour,
and workflow / reward arguments that their function does not take. :mod:`trine.config` calls them from
its validators, so every problem is reported with the rest."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from trine import registry
from trine.config.arguments import arguments_problems
from trine.config.devices import loaded_dtype
from trine.config.engines import VLLM_ENGINES, engine_problems
from trine.config.serve import serve_run_problems, serve_source_problems

if TYPE_CHECKING:
    from trine.config import RunConfig, TasksConfig


def argument_problems(tasks: TasksConfig, mode: str, algo: Any = None) -> list[str]:
    """``workflow_args``/``reward_args`` that the workflow or reward does not take, by name or by the type
    of their value (:mod:`trine.config.arguments`; they would otherwise fail every task at run time).
    Only tasksets this mode runs workflows on are checked: the explored ones in modes sync and async
    (with ``algo``'s rollout arguments, if given) and eval sets."""
    tasksets = [] if algo else [(f"eval.{i}", ts, {}) for i, ts in enumerate(tasks.eval)]
    if mode != "train":
        extra = algo.rollout_args if algo else {}
        explored = [("train", tasks.train), *((f"mix.{i}", m) for i, m in enumerate(tasks.mix))]
        tasksets = [(key, ts, extra) for key, ts in explored if ts is not None] + tasksets
    problems = []
    for key, ts, extra in tasksets:
        if extra:
            what = f"tasks.{key}.workflow_args with algorithm {algo.name!r}'s rollout arguments {extra}"
            given = _workflow_given(ts.workflow)
            problems.append(
                registry.check_arguments(
                    "workflow", ts.workflow, {**ts.workflow_args, **extra}, what, reward=None, **given
                )
            )
            continue
        what = f"{key}.workflow_args"
        found = arguments_problems(
            "workflow", ts.workflow, ts.workflow_args, what, reward=None, **_workflow_given(ts.workflow)
        )
        problems += found or [_value_problems(ts.workflow, ts.workflow_args, what)]
        reward_given = _given("reward", ts.reward, "models")
        problems += arguments_problems(
            "reward", ts.reward, ts.reward_args, f"{key}.reward_args", "", None, **reward_given
        )
    return [p for p in problems if p]


def _workflow_given(name: str) -> dict[str, Any]:
    """What the wiring passes a workflow besides its ``workflow_args``: ``auxiliary_models`` (the explorer)
    and ``run_dir`` (:mod:`trine.build`, e.g. ``human_feedback``'s default queue), when it declares them."""
    return {**_given("workflow", name, "auxiliary_models"), **_given("workflow", name, "run_dir")}


def _value_problems(name: str, args: dict[str, Any], what: str) -> str | None:
    """The workflow's own check of its argument values (a class's ``argument_problems(**args)``), if any."""
    if registry.check("workflow", name) is not None:
        return None
    check = getattr(registry.resolve("workflow", name), "argument_problems", None)
    problems = check(**args) if callable(check) else []
    return f"{what}: " + "; ".join(problems) if problems else None


def _given(kind: str, name: str, param: str) -> dict[str, Any]:
    """``{param: None}`` when the ``kind`` called ``name`` declares ``param``, which the explorer passes
    itself (a workflow's ``auxiliary_models``, a reward's ``models``), so the check does not ask for it."""
    if registry.check(kind, name) is not None:
        return {}
    try:
        return {param: None} if param in inspect.signature(registry.resolve(kind, name)).parameters else {}
    except (TypeError, ValueError):
        return {}


def trainer_problems(cfg: RunConfig) -> list[str]:
    """``trainer:`` settings the model or the installed transformers cannot honour (missing extras:
    :mod:`trine.config.extras`)."""
    t, problems = cfg.trainer, []
    if t.precision == "bf16":
        dtype = loaded_dtype(cfg.model.dtype, cfg.model.device)
        if dtype != "float32":
            problems.append(
                f"trainer.precision: bf16 keeps float32 master weights under bfloat16 autocast, but model.dtype "
                f"{cfg.model.dtype!r} loads the weights as {dtype}; set model.dtype: float32 (or precision: fp32 "
                "to train in the model's own dtype)"
            )
    if cfg.model.engine in VLLM_ENGINES and cfg.sync.method == "shared":
        problems.append(
            "sync.method 'shared' with model.engine: vllm: the vLLM engine holds its own copy of the weights and "
            "never sees the trainer's; set sync.method: copy (the default for vllm) or remove it"
        )
    vllm = cfg.model.vllm
    if vllm is not None and vllm.enable_sleep_mode and cfg.mode != "sync":
        problems.append(
            f"model.vllm.enable_sleep_mode puts the engine to sleep while the trainer steps on its GPU, which "
            f"only mode sync does (mode is {cfg.mode!r}: explorer and trainer overlap); set mode: sync or "
            "enable_sleep_mode: false"
        )
    if vllm is not None and vllm.enable_sleep_mode and vllm.sleep_level == 2 and cfg.sync.sync_interval != 1:
        problems.append(
            f"model.vllm.sleep_level: 2 drops the engine's weights each step, so new ones must arrive every step; "
            f"sync.sync_interval is {cfg.sync.sync_interval}: set it to 1 or use sleep_level: 1"
        )
    if t.packed:
        from transformers import masking_utils

        if not hasattr(masking_utils, "find_packed_sequence_indices"):
            problems.append(
                "trainer.packed needs transformers >= 4.54 (packed-sequence attention masks); upgrade "
                "transformers or set trainer.packed: false"
            )
    return problems


def auxiliary_problems(cfg: RunConfig) -> list[str]:
    """Auxiliary models named in ``reward_args`` / ``workflow_args`` (``judge: ...``) that
    ``explorer.auxiliary_models`` does not define."""
    known = set(cfg.explorer.auxiliary_models)
    tasksets = [("train", cfg.tasks.train), *((f"eval.{i}", t) for i, t in enumerate(cfg.tasks.eval))]
    problems = []
    for key, ts in tasksets:
        if ts is None:
            continue
        for section, args, kind, name, param in (
            ("reward_args", ts.reward_args, "reward", ts.reward, "models"),
            ("workflow_args", ts.workflow_args, "workflow", ts.workflow, "auxiliary_models"),
        ):
            if not _given(kind, name, param):
                continue
            for arg in ("judge", "model", "partner"):
                value = args.get(arg)
                if isinstance(value, str) and value not in known:
                    problems.append(
                        f"tasks.{key}.{section}[{arg!r}]={value!r} names no auxiliary model; define it under "
                        f"explorer.auxiliary_models (defined: {sorted(known) or 'none'})"
                    )
    return problems


def mode_problems(cfg: RunConfig) -> list[str]:
    """Settings that the run's mode does not read, or cannot honour."""
    problems = engine_problems(cfg)
    if cfg.trainer.batch_size is not None and cfg.mode != "async":
        problems.append(
            f"trainer.batch_size={cfg.trainer.batch_size}: mode {cfg.mode!r} trains on one explored batch "
            "per step (batch_size: null); change tasks.batch_size to change it, split it with "
            "trainer.mini_batches, or set mode: async"
        )
    problems += _produce_problems(cfg)
    if cfg.mode == "async" and cfg.sync.sync_offset:
        problems.append(
            f"sync.sync_offset={cfg.sync.sync_offset} is for mode sync; in mode async the explorer runs "
            "freely, bounded by buffer.max_staleness: remove sync_offset"
        )
    problems += _process_problems(cfg) + feedback_problems(cfg) + serve_run_problems(cfg)
    if cfg.sync.method == "shared" and cfg.mode == "async":
        problems.append(
            "sync.method 'shared' with mode async: an explorer that runs ahead of the trainer cannot "
            "sample the weights the trainer is changing; set sync.method: copy (or leave it unset)"
        )
    return problems


def source_problems(tasks: TasksConfig, mode: str) -> list[str]:
    """``tasks.source: buffer`` (a trainer-only stage on the rows of a persistent buffer): mode train, a
    step count, no taskset to train on. ``tasks.source: serve``: :func:`trine.config.serve.serve_source_problems`."""
    if tasks.source == "serve":
        return serve_source_problems(tasks, mode)
    if tasks.source != "buffer":
        return []
    problems = []
    if mode != "train":
        problems.append(
            f"tasks.source: buffer trains on the rows of a buffer with no explorer, which is mode train (mode is "
            f"{mode!r}); set mode: train, or remove tasks.source to explore tasks.train"
        )
    if tasks.total_steps is None:
        problems.append(
            "tasks.source: buffer needs tasks.total_steps (the most steps; the stage ends earlier when no batch "
            "arrives within buffer.get_timeout)"
            + (f"; tasks.epochs={tasks.epochs} does not apply to a buffer: remove it" if tasks.epochs else "")
        )
    if tasks.train is not None:
        problems.append(
            "tasks.train is not read with tasks.source: buffer (the batches come from the buffer); remove it (a "
            "stage that inherits it from the top level sets tasks.train: null)"
        )
    return problems


def feedback_problems(cfg: RunConfig) -> list[str]:
    """Where rewards or rows come from another process, the buffer must be one that process reaches: a
    buffer source (``tasks.source: buffer``), and workflows whose rewards people give (``human_feedback``,
    any class with ``rewards_from_outside = True``): a SQL buffer, items that expire before their rows."""
    b = cfg.buffer
    problems = []
    if cfg.tasks.source == "buffer" and b.storage == "memory":
        problems.append(
            "tasks.source: buffer trains on stored rows, but buffer.storage is 'memory' (empty in a new process); "
            "set buffer.storage: sql (with buffer.url / storage_args.table naming the rows, e.g. "
            "{table: preferences}) or file"
        )
    explored = [] if cfg.mode == "train" else [("train", cfg.tasks.train), *enumerate(cfg.tasks.mix)]
    explored = [(f"mix.{k}" if isinstance(k, int) else k, ts) for k, ts in explored if ts is not None]
    evals = [(f"eval.{i}", ts) for i, ts in enumerate(cfg.tasks.eval)]
    for key, ts in explored + evals:
        if not _from_outside(ts.workflow):
            continue
        where = f"tasks.{key}.workflow {ts.workflow!r}"
        if key.startswith("eval."):
            problems.append(
                f"{where} leaves rewards to people, but evaluation scores answers now; give the eval taskset a "
                "workflow with a reward (e.g. single_turn)"
            )
            continue
        if b.storage in ("memory", "file"):
            problems.append(
                f"{where} leaves rewards pending until people answer, and another process (trine studio, trine "
                f"annotate land) writes them into the run's buffer; buffer.storage {b.storage!r} lives in this "
                "process only: set buffer.storage: sql"
            )
        args = ts.workflow_args
        if args.get("ask") == "pair" and ts.repeat % 2:
            problems.append(
                f"tasks.{key}.repeat={ts.repeat} with workflow_args.ask: pair: responses are compared 0-1, 2-3, "
                "...; set an even repeat"
            )
        timeout = args.get("timeout", 3600.0)
        if (
            b.pending_timeout is not None
            and isinstance(timeout, (int, float))
            and b.pending_timeout < timeout
        ):
            problems.append(
                f"buffer.pending_timeout={b.pending_timeout} gives up on a pending experience before its "
                f"annotation item expires (tasks.{key}.workflow_args.timeout={timeout}), so late answers are lost; "
                "set pending_timeout >= timeout"
            )
    return problems


def _from_outside(name: str) -> bool:
    """Whether the workflow called ``name`` declares ``rewards_from_outside`` (unknown names: False)."""
    if registry.check("workflow", name) is not None:
        return False
    try:
        return bool(getattr(registry.resolve("workflow", name), "rewards_from_outside", False))
    except (ImportError, AttributeError, ValueError):
        return False


def _produce_problems(cfg: RunConfig) -> list[str]:
    """The streaming explorer's produce strategies: mode async only; partial rollout trains on the
    behaviour logprobs, so they must not be recomputed, and needs an engine that can do it."""
    e = cfg.explorer
    chosen = {
        "explorer.oversample": e.oversample if e.oversample != 1 else None,
        "explorer.tail_seconds": e.tail_seconds,
        "explorer.partial_rollout": e.partial_rollout or None,
    }
    chosen = {k: v for k, v in chosen.items() if v is not None}
    problems = [
        f"{key}={value} is read by mode async only (mode {cfg.mode!r} explores whole batches); remove it "
        "or set mode: async"
        for key, value in chosen.items()
        if cfg.mode != "async"
    ]
    if e.partial_rollout and cfg.trainer.recompute_logprobs:
        problems.append(
            "explorer.partial_rollout keeps the logprob each token was sampled with and the loss uses it; "
            "trainer.recompute_logprobs=true would replace them: set one of them to false"
        )
    try:  # the constructor's parameters, read without importing a built-in engine (torch)
        takes = registry.signature("engine", cfg.model.engine).parameters
    except (ValueError, ImportError, AttributeError, TypeError):
        return problems  # reported by the model checks
    if e.partial_rollout and "partial_rollout" not in takes:
        problems.append(
            f"explorer.partial_rollout: engine {cfg.model.engine!r} takes no partial_rollout argument "
            "(it cannot load weights between two tokens); use model.engine: hf or turn it off"
        )
    if "prefix_cache_tokens" not in takes and "prefix_cache_tokens" in e.model_fields_set:
        problems.append(
            f"explorer.prefix_cache_tokens: engine {cfg.model.engine!r} keeps no prefix cache (it takes no "
            "prefix_cache_tokens argument); remove the setting"
        )
    return problems


def algorithm_problems(cfg: RunConfig, preset: Any) -> list[str]:
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
    if algo.dynamic_sampling and cfg.processes:
        problems.append(
            f"algorithm {algo.name!r} refills batches from the task scheduler (dynamic sampling), which explorer "
            "processes split between them; set algorithm.dynamic_sampling: false or launch: thread"
        )
    if algo.rollout_args:
        problems += argument_problems(cfg.tasks, cfg.mode, algo)
    correcting = [
        f"rollout_is: {algo.rollout_is}" if algo.rollout_is != "off" else "",
        f"rollout_mask_threshold: {algo.rollout_mask_threshold}" if algo.rollout_mask_threshold else "",
    ]
    correcting = [c for c in correcting if c]
    if correcting and not cfg.trainer.recompute_logprobs:
        problems.append(
            f"algorithm.{' and '.join(correcting)} weighs the trainer's logprobs against the rollout engine's; "
            "set trainer.recompute_logprobs: true (without it the trainer trains on the engine's logprobs and "
            "there is nothing to correct)"
        )
    if correcting and algo.advantage is None:
        problems.append(
            f"algorithm.{' and '.join(correcting)} corrects rollouts, but algorithm {algo.name!r} has no "
            "advantages (supervised or pairwise); remove the rollout correction settings"
        )
    return problems


def _process_problems(cfg: RunConfig) -> list[str]:
    """What explorer and trainer processes (``launch: processes``, or Ray actors with ``cluster.backend:
    ray``) need: mode async, a buffer every process can open, weights that reach another process
    (``published`` through the run directory, ``broadcast`` over torch.distributed), tasks split without
    feedback."""
    method = cfg.sync_method
    layout = "cluster.backend: ray" if cfg.cluster.backend == "ray" else "launch: processes"
    if not cfg.processes:
        if method in ("published", "broadcast"):
            return [f"sync.method {method!r} is for launch: processes or cluster.backend: ray"]
        return []
    problems = []
    if cfg.cluster.trainer_ranks > 1 and not cfg.trainer.fsdp:
        problems.append(
            f"cluster.trainer_ranks: {cfg.cluster.trainer_ranks} splits every step between trainer actors over "
            "FSDP2 shards; set trainer.fsdp: true (or trainer_ranks: 1)"
        )
    if cfg.cluster.explorer_dir is not None and method != "broadcast":
        problems.append(
            f"cluster.explorer_dir keeps explorer actors off the run directory, but sync.method {method!r} "
            "reaches them through it; use sync.method: broadcast (the default under Ray)"
        )
    if cfg.cluster.backend == "ray" and "launch" in cfg.model_fields_set and cfg.launch == "thread":
        problems.append(
            "launch: thread with cluster.backend: ray: Ray runs the trainer and the explorers as separate "
            "actors (the processes layout); remove launch, or set cluster.backend: local"
        )
    if cfg.mode != "async":
        problems.append(
            f"{layout} runs mode async (explorer and trainer processes); got mode {cfg.mode!r}. Set mode: "
            "async (with buffer.max_staleness: 0 an explorer never runs ahead of the weights it samples)"
        )
    if cfg.buffer.storage not in ("sql", "sqlite"):
        problems.append(
            f"buffer.storage={cfg.buffer.storage!r} cannot be shared between processes; set buffer.storage: sql "
            "(SQLite in the run directory by default, or PostgreSQL with buffer.url)"
        )
    if method not in ("published", "broadcast"):
        problems.append(
            f"sync.method {method!r} cannot reach another process; use broadcast or published (or remove it)"
        )
    if cfg.tasks.curriculum is not None:
        problems.append(
            f"tasks.curriculum feeds pass rates back to one scheduler; it is not supported with {layout}"
        )
    if cfg.explorer.partial_rollout:
        problems.append(
            "explorer.partial_rollout (new weights between two tokens) is built for mode async in one process "
            "(launch: thread); explorer processes load new weights between generations: remove it or set "
            "launch: thread"
        )
    return problems
