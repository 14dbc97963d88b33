"""The studio's experience browser: list with filters and paging, facets, one experience.

The buffer is the run's own (:func:`trine.buffer.inspect.run_buffer_config`, ``stage`` picks the stage
of a multi-stage run). A SQL buffer is queried in place, read-only, with SQLAlchemy Core
(:mod:`trine.studio.experience_sql`): filters, order and paging run in the database, ``total`` is a
``COUNT(*)``, and 100k rows stay responsive. A file buffer's log is replayed with
:func:`trine.buffer.inspect.read_rows` (cached until the file changes) and filtered here; an in-memory
buffer shows what the run's last checkpoint kept. A run without a config, a database that is not there
yet or cannot be read give a ``note``, never an error page.

Statuses shown: ``pending``, ``ready``, ``trained`` (handed to the trainer), ``stale`` (dropped by the
staleness rule), ``expired`` (pending past its timeout, dropped) and ``rolled_back``.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import yaml
from fastapi import APIRouter, Depends, HTTPException, Request

from trine.studio.experience_rows import STATUSES, Filters, NoSource, file_source, memory_source
from trine.studio.paths import run_path
from trine.studio.settings import StudioSettings, studio

router = APIRouter()

ORDERS = ("seq", "-seq", "reward", "-reward")
MAX_LIMIT = 500
_NUMBERS = {  # numeric query parameter (a Filters field of that name) -> its type
    "reward_min": float,
    "reward_max": float,
    "version_min": int,
    "version_max": int,
    "step_min": int,
    "step_max": int,
}


def _number(name: str, value: str, kind: type) -> float | int:
    what = "an integer" if kind is int else "a number"
    try:
        out = kind(value)
    except ValueError:
        raise HTTPException(
            400, f"{name}={value!r}: expected {what} (e.g. {name}=1); fix it or leave {name} out"
        ) from None
    if isinstance(out, float) and not math.isfinite(out):
        raise HTTPException(400, f"{name}={value!r}: expected a finite number; fix it or leave {name} out")
    return out


def parse_filters(params: dict[str, str]) -> Filters:
    """Filters from query parameters; HTTP 400 naming the parameter, the value and what is expected."""
    f = Filters()
    for name in ("status", "kind", "task", "finish_reason"):
        value = params.get(name) or None
        setattr(f, name, value)
    if f.status is not None and f.status not in STATUSES:
        raise HTTPException(400, f"status={f.status!r}: expected one of {', '.join(STATUSES)}")
    for name, kind in _NUMBERS.items():
        if params.get(name, "") != "":
            setattr(f, name, _number(name, params[name], kind))
    for lo, hi in (("reward_min", "reward_max"), ("version_min", "version_max"), ("step_min", "step_max")):
        if getattr(f, lo) is not None and getattr(f, hi) is not None and getattr(f, lo) > getattr(f, hi):
            raise HTTPException(
                400, f"{lo}={getattr(f, lo)} is above {hi}={getattr(f, hi)}: expected {lo} <= {hi}"
            )
    if params.get("offset", "") != "":
        f.offset = int(_number("offset", params["offset"], int))
        if f.offset < 0:
            raise HTTPException(400, f"offset={f.offset}: expected 0 or more")
    if params.get("limit", "") != "":
        f.limit = int(_number("limit", params["limit"], int))
        if not 1 <= f.limit <= MAX_LIMIT:
            raise HTTPException(400, f"limit={f.limit}: expected 1 to {MAX_LIMIT} rows per page")
    f.order = params.get("order") or "seq"
    if f.order not in ORDERS:
        raise HTTPException(400, f"order={f.order!r}: expected one of {', '.join(ORDERS)}")
    return f


# -- which buffer -----------------------------------------------------------------------------------


def source_for(run_dir: Path, stage: str | None) -> Any:
    """The run's buffer as a source (:class:`~trine.studio.experience_sql.SqlSource`, :class:`ListSource`
    or :class:`NoSource`); HTTP 400 for an unknown ``stage``."""
    from pydantic import ValidationError

    from trine import registry
    from trine.buffer.inspect import run_buffer_config

    if not (run_dir / "config.yaml").is_file():
        return NoSource(
            "none",
            [],
            f"{run_dir.name} has no config.yaml yet (the run is starting, or was "
            "not written by `trine run`): its buffer cannot be located",
        )
    try:
        with registry.no_imports(
            "the studio (it reads a run's buffer; it never imports the code a config names)"
        ):
            config = run_buffer_config(run_dir, stage)
    except ValueError as err:
        if "import paths are not loaded from" in str(err):  # the storage or a plugin named by import path
            return NoSource(
                "none",
                [],
                "the buffer section of its config.yaml names code by import path (a storage or plugin); "
                "the studio imports no code named in a config: load it with `trine studio --plugin FILE`",
            )
        if stage is not None and "--stage" in str(err):
            raise HTTPException(400, str(err).replace("--stage", "stage")) from None
        return NoSource("none", [], str(err))
    except (yaml.YAMLError, ValidationError, AttributeError, TypeError) as err:
        return NoSource("none", [], f"{run_dir.name}/config.yaml cannot be read: {err}")
    if config.storage not in registry.builtins("storage"):
        return NoSource(
            "none",
            [],
            f"buffer.storage={config.storage!r} is not a built-in storage or a plugin "
            "loaded with `trine studio --plugin`; the studio imports no code named in a config",
        )
    return _open_source(run_dir, config, stage)


def _open_source(run_dir: Path, config: Any, stage: str | None) -> Any:
    from trine.buffer.files import FileBuffer
    from trine.buffer.memory import MemoryBuffer
    from trine.buffer.open import storage_arguments, storage_class
    from trine.buffer.sql import SQLBuffer, normalize_url
    from trine.studio.experience_sql import sql_source

    cls = storage_class(config)
    args = storage_arguments(config, run_dir)
    if issubclass(cls, SQLBuffer):
        return sql_source(
            normalize_url(args.get("url", "sqlite:///buffer.db")), args.get("table", "experiences")
        )
    if issubclass(cls, FileBuffer):
        return file_source(run_dir, Path(args.get("path", "buffer.jsonl")), stage)
    if issubclass(cls, MemoryBuffer):
        return memory_source(run_dir)
    return NoSource(
        "none",
        [],
        f"buffer.storage={config.storage!r} ({cls.__name__}) is not a SQL, file or "
        "memory storage; the studio reads only those",
    )


# -- the endpoints ----------------------------------------------------------------------------------


def _source(settings: StudioSettings, name: str, stage: str | None) -> tuple[Path, Any]:
    run_dir = run_path(settings.runs_dir, name)
    return run_dir, source_for(run_dir, stage or None)


@router.get("/runs/{name}/experiences")
def list_experiences(
    name: str, request: Request, settings: StudioSettings = Depends(studio)
) -> dict[str, Any]:
    """A page of the run's experiences matching the filters (see the module docstring)."""
    filters = parse_filters(dict(request.query_params))
    _, source = _source(settings, name, request.query_params.get("stage"))
    start = time.perf_counter()
    total, rows = source.page(filters)
    return {
        "source": source.source,
        "total": total,
        "offset": filters.offset,
        "limit": filters.limit,
        "query_ms": round((time.perf_counter() - start) * 1000, 2),
        "rows": rows,
        "note": source.note,
    }


@router.get("/runs/{name}/experiences/facets")
def experience_facets(
    name: str, stage: str | None = None, settings: StudioSettings = Depends(studio)
) -> dict[str, Any]:
    """The statuses (with counts), kinds, finish reasons, tasks and value ranges the filters can take."""
    _, source = _source(settings, name, stage)
    return {**source.facets(), "source": source.source, "note": source.note}


@router.get("/runs/{name}/experiences/{exp_id}")
def one_experience(
    name: str, exp_id: str, stage: str | None = None, settings: StudioSettings = Depends(studio)
) -> dict[str, Any]:
    """One experience: tokens with their flags, logprobs and advantages, turns, its group and steps."""
    from trine.studio.experience_view import experience_detail

    run_dir, source = _source(settings, name, stage)
    found = source.one(exp_id)
    if found is None:
        raise HTTPException(
            404,
            f"no experience {exp_id!r} in the buffer of run {name!r} (source {source.source}"
            + (f": {source.note}" if source.note else "")
            + "); take an id from the experience list",
        )
    return experience_detail(source, found, run_dir, stage or None)
