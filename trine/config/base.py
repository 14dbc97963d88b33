"""The base of the typed config sections: strict pydantic settings, shared number ranges, name and
path checks (see :mod:`trine.config`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
)

from trine import registry
from trine.config.overrides import (  # noqa: F401 - re-exported: trine.config is where callers look
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
"""A number > 0."""
TrajectoryStatus = Literal["ok", "truncated", "timeout", "env_error", "tool_error", "reward_error"]
"""One of :data:`trine.types.TRAJECTORY_STATUSES`."""
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
