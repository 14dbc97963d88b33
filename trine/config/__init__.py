"""Typed configuration (DESIGN §2 "Config mirrors the layout"): one section per package, YAML plus dotted
overrides, every error at once.

- :mod:`trine.config.run`: :class:`RunConfig` (the top level and its derived plan), validation, loading;
- the sections, a docstring under every field: :mod:`~trine.config.rollout` (model, sampling, tasks,
  explorer), :mod:`~trine.config.learn` (buffer, algorithm, trainer, sync, eval, monitor),
  :mod:`~trine.config.serve`, :mod:`~trine.config.cluster`, over :mod:`~trine.config.base`;
- :mod:`~trine.config.checks` (checks across sections), :mod:`~trine.config.extras` (the optional extras a
  config needs), :mod:`~trine.config.overrides` (YAML, dotted overrides, stage merging),
  :mod:`~trine.config.format` (how errors and types are written).

This package imports no stage and no model code: it is the base every part reads.
"""

from trine.config.algorithm import AlgorithmConfig, AlgorithmRecord
from trine.config.base import Count, NonNeg, NonNegInt, Positive, Section
from trine.config.cluster import ClusterConfig
from trine.config.engines import VLLM_ENGINES
from trine.config.learn import (
    BufferConfig,
    BufferRules,
    EvalConfig,
    MonitorConfig,
    SyncConfig,
    TrainerConfig,
)
from trine.config.overrides import ConfigError, apply_overrides, load_yaml, merge
from trine.config.rollout import (
    AuxiliaryModelConfig,
    ExplorerConfig,
    ModelConfig,
    SamplingConfig,
    TasksConfig,
    TasksetConfig,
    VLLMConfig,
)
from trine.config.run import RunConfig, _format, load_config, read_yaml, reference_markdown, validate_dict
from trine.config.serve import ServeConfig

__all__ = [
    "VLLM_ENGINES", "AlgorithmConfig", "AlgorithmRecord", "AuxiliaryModelConfig", "BufferConfig",
    "BufferRules", "ClusterConfig", "ConfigError", "Count", "EvalConfig", "ExplorerConfig", "ModelConfig",
    "MonitorConfig", "NonNeg", "NonNegInt", "Positive", "RunConfig", "SamplingConfig", "Section",
    "ServeConfig", "SyncConfig", "TasksConfig", "TasksetConfig", "TrainerConfig", "VLLMConfig", "_format",
    "apply_overrides", "load_config", "load_yaml", "merge", "read_yaml", "reference_markdown",
    "validate_dict",
]  # fmt: skip
