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

import json
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ValidationError,
    field_validator,
    model_validator,
)

from trine import registry
from trine.config.algorithm import AlgorithmConfig
from trine.config.base import (  # noqa: F401 - re-exported
    Beta,
    Count,
    NonNeg,
    NonNegInt,
    Positive,
    Section,
    TrajectoryStatus,
    _check_name,
    _resolve_path,
)
from trine.config.checks import algorithm_problems, auxiliary_problems, mode_problems, trainer_problems
from trine.config.cluster import ClusterConfig  # noqa: F401
from trine.config.engines import VLLM_ENGINES
from trine.config.extras import extras_problems
from trine.config.format import format_error, section_reference
from trine.config.learn import (  # noqa: F401
    BufferConfig,
    EvalConfig,
    MonitorConfig,
    SyncConfig,
    TrainerConfig,
)
from trine.config.overrides import (  # noqa: F401 - re-exported: trine.config is where callers look
    ConfigError,
    apply_overrides,
    load_yaml,
    merge,
    shadowed_overrides,
    shadowed_paths,
)
from trine.config.plan import Plan, plan_of
from trine.config.rollout import (  # noqa: F401
    AuxiliaryModelConfig,
    ExplorerConfig,
    ModelConfig,
    SamplingConfig,
    TasksConfig,
    TasksetConfig,
    VLLMConfig,
)
from trine.config.serve import ServeConfig  # noqa: F401
from trine.config.watch import watch_problems


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
    num_threads: Count | Literal["auto"] = "auto"
    """torch CPU threads of each process. ``auto``: the cores this process may use minus the load of other
    work (the 1-minute load average at start), divided among the run's processes on this machine, at least
    1; the run prints what it chose and why (``trine.threads``). A number is used as given, with a warning
    when the load says the cores are oversubscribed. CPU results can depend on the thread count (the order
    of floating-point sums), so a run resumed with another count than its checkpoint's says so; set a
    number to reproduce a run exactly."""
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
    serve: ServeConfig = ServeConfig()
    """The OpenAI-compatible server of ``trine serve`` (``trine.serve``)."""
    cluster: ClusterConfig = ClusterConfig()
    """Where the trainer and the explorers run: this machine, or Ray actors (``trine.distributed``)."""
    stages: list[dict[str, Any]] = []
    """Stages run in order, each a partial config (with a ``stage`` name) merged over the top-level
    settings and starting from the previous stage's weights (e.g. an SFT warm-up then GRPO)."""

    @property
    def run_path(self) -> Path:
        """The run directory: ``run_dir``, else ``runs/<name>`` (relative to where trine runs)."""
        return Path(self.run_dir) if self.run_dir else Path("runs") / self.name

    @property
    def trainer_batch_rows(self) -> int:
        """Experiences the trainer takes per step where explorer and trainer run at their own pace (mode
        async): ``trainer.batch_size``, else one explored batch's worth, ``tasks.batch_size`` ×
        ``tasks.train.repeat``. (Modes sync and train take one explored batch whole, whatever its size.)"""
        if self.trainer.batch_size or self.tasks.train is None:  # tasks.source: serve requires batch_size
            return self.trainer.batch_size or self.tasks.batch_size
        return self.tasks.batch_size * self.tasks.train.repeat

    @property
    def processes(self) -> bool:
        """Trainer and explorers are separate processes: ``launch: processes`` or Ray actors."""
        return self.launch == "processes" or self.cluster.backend == "ray"

    @property
    def plan(self) -> Plan:
        """Which wiring drives this stage's roles and which launcher starts it (:mod:`trine.config.plan`)."""
        return plan_of(self)

    @property
    def sync_method(self) -> str:
        """The weight-sync method in use: ``sync.method``, or ``broadcast`` between Ray actors, ``published``
        between processes, ``copy`` when the explorer may run ahead of the trainer (mode async,
        ``sync_offset`` > 0), else ``shared``."""
        if self.sync.method is not None:
            return self.sync.method
        if self.cluster.backend == "ray":
            return "broadcast"
        if self.launch == "processes":
            return "published"
        if self.model.engine in VLLM_ENGINES:  # vLLM holds its own weights: they must be copied in
            return "copy"
        return "copy" if self.mode == "async" or self.sync.sync_offset > 0 else "shared"

    @field_validator("num_threads", mode="before")
    @classmethod
    def _thread_count(cls, v: Any) -> Any:
        if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            return v
        raise ValueError(
            f"{v!r} is not a thread count; expected an integer >= 1 or auto (the free cores, the default): "
            "write e.g. num_threads: 1, or remove the key"
        )

    @model_validator(mode="after")
    def _consistent(self) -> RunConfig:
        if self.tasks.train is None and self.tasks.source == "taskset":
            raise ValueError(
                "tasks.train is required: the taskset to explore (or to train on in train mode; or set "
                "mode: train with tasks.source: buffer to train on the rows of a persistent buffer, or "
                "tasks.source: serve when agents bring their own tasks to `trine serve`)"
            )
        problems = mode_problems(self) + auxiliary_problems(self) + trainer_problems(self)
        problems += extras_problems(self) + watch_problems(self)
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
    loras = {json.dumps(s.trainer.lora.model_dump() if s.trainer.lora else None) for s in stages}
    if len(loras) > 1:
        errors.append(
            "stages: trainer.lora differs between stages; adapters put on the model by one stage stay for the "
            "next, so give every stage the same trainer.lora (or none)"
        )
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
