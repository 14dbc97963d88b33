"""Where a run started from the studio may write: inside the runs directory, nowhere else.

:func:`write_problems` is what ``POST /api/config/start`` checks after validation and before anything
is written; every offending key comes back at once, as ``<key path>: <message>`` lines (the editor
places them like validation errors). A config from the browser may not make a run write outside the
runs directory, reach a database elsewhere, or start a program.

What is checked, for each stage (``stages.N.`` in front of the key with several stages):

- ``run_dir``: not checked, *set*: the studio runs every config in ``RUNS/NAME`` (checkpoints,
  ``metrics.jsonl``, ``tensorboard/``, ``plots/``, ``rollouts.jsonl``, ``weights/``, the default
  ``buffer.db`` / ``buffer.jsonl`` and ``annotations.db`` all go there).
- ``buffer.url`` and every path-like typed field not listed below as a read (``*path``, ``*dir``,
  ``*url``, ...; a new one is a write until it is listed): a ``sqlite:///`` file or plain path must
  resolve inside the runs directory; any other database URL (``postgresql://``) is refused.
- ``model.path`` when ``model.init_preset`` is set and the path does not exist: the run builds the
  model there, a write.
- free-form arguments (``workflow_args``, ``reward_args``, ``buffer.storage_args``,
  ``buffer.operators``, ``tasks.curriculum``, ``algorithm.*_args``, ``model.vllm.engine_args``, ...):
  their values cannot be told read from write, so every string under a path-like key (``path``,
  ``dir``, ``file``, ``url``, ``queue``, ``db``, ``cwd``, ...) is treated as a write (``http(s)://``
  endpoints excepted), and a ``command`` (an MCP server's) is refused: a config from the browser
  starts no program, as it imports no code.

Reads are not confined: ``model.path`` (an existing model), ``model.tokenizer_path``, the tasksets'
``path``, ``explorer.teacher`` and the auxiliary models' ``path`` are read where they are, and
``model.base_url`` / the auxiliary ``base_url`` are servers the run asks for samples.
"""

from __future__ import annotations

import re
import typing
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from trine.studio.paths import location_problem

PATH_LIKE = re.compile(
    r"(^|_)(path|paths|dir|dirs|directory|file|files|filename|url|uri|queue|db|database|cwd)($|_)", re.I
)
"""Keys whose string values name a place on disk (or a database)."""
READS = ("model.path", "model.tokenizer_path", "tasks.*.path", "explorer.auxiliary_models.*.path")
"""Typed path fields that a run only reads (``model.path`` is a write when ``init_preset`` builds it)."""
ENDPOINTS = ("model.base_url", "explorer.auxiliary_models.*.base_url")
"""Typed URL fields naming servers the run talks to, not places it writes."""
SET_BY_STUDIO = ("run_dir",)
"""Fields the studio sets itself (the run's directory is ``RUNS/NAME``)."""
WHY_NO_COMMAND = (
    "starts a program; a config from the studio starts none (as it imports no code): start this config "
    "with `trine run` from a shell"
)


def write_problems(stages: list[Any], runs_dir: Path, root: Path) -> list[str]:
    """Every place the validated ``stages`` would write outside ``runs_dir``, as ``key: message`` lines
    (relative paths resolve against ``root``, where the run runs); [] when there is none."""
    lines: list[str] = []
    for i, stage in enumerate(stages):
        prefix = f"stages.{i}." if len(stages) > 1 else ""
        for key, message in _stage_problems(stage, Path(runs_dir), Path(root)):
            lines.append(f"{prefix}{key}: {message}")
    return lines


def _stage_problems(stage: Any, runs_dir: Path, root: Path) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []

    def check(key: str, value: str, *, network: bool = False) -> None:
        problem = location_problem(value, runs_dir, root, network=network)
        if problem is not None:
            found.append((key, problem))

    model = stage.model
    if model.init_preset and not _exists(model.path):
        problem = location_problem(model.path, runs_dir, root)
        if problem is not None:
            found.append(
                (
                    "model.path",
                    f"{model.path!r} does not exist, so init_preset builds the model there, outside the runs "
                    f"directory {runs_dir}: build it first (`trine init-model {model.init_preset} PATH`) "
                    "or give a path under the runs directory",
                )
            )
    for key, value, free in _strings(stage, ""):
        if free:
            command = re.match(r"^(.*?\.command)(\.\d+)?$", key)
            if command:
                found.append((command[1], WHY_NO_COMMAND))
            elif PATH_LIKE.search(_last_name(key)):
                check(key, value, network=True)
        elif _matches(key, SET_BY_STUDIO + READS + ENDPOINTS) or not PATH_LIKE.search(_last_name(key)):
            continue
        else:
            check(key, value)
    return _first_per_key(found)


def _exists(path: str) -> bool:
    try:
        return Path(path).exists()
    except (ValueError, OSError):  # a NUL byte, a name too long: nothing is there
        return False


def _last_name(key: str) -> str:
    """The last non-index part of a key path (``mcp_servers.0.url`` -> ``url``, ``paths.1`` -> ``paths``)."""
    parts = [p for p in key.split(".") if not p.isdigit()]
    return parts[-1] if parts else ""


def _matches(key: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatchcase(key, pattern) for pattern in patterns)


def _first_per_key(found: list[tuple[str, str]]) -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    for key, message in found:
        seen.setdefault(key, message)
    return list(seen.items())


def _free(annotation: Any) -> bool:
    """Whether a field's type holds ``Any`` (free-form arguments: ``dict[str, Any]``, ``list[dict]``)."""
    return annotation is Any or any(_free(arg) for arg in typing.get_args(annotation))


def _strings(value: Any, key: str) -> list[tuple[str, str, bool]]:
    """``(key path, string, in free-form arguments)`` for every string in a validated config section:
    typed sections are walked by field, dicts and lists by key and index; ``stages`` (empty in a
    validated stage) is skipped."""
    out: list[tuple[str, str, bool]] = []
    pending: list[tuple[Any, str, bool]] = [(value, key, False)]
    while pending:
        item, at, loose = pending.pop()
        if isinstance(item, BaseModel):
            for name, field in type(item).model_fields.items():
                if name != "stages" or at:
                    pending.append((getattr(item, name), f"{at}{name}.", loose or _free(field.annotation)))
            continue
        path = at.rstrip(".")
        if isinstance(item, str):
            out.append((path, item, loose))
        elif isinstance(item, dict):
            pending.extend((v, f"{path}.{k}.", loose) for k, v in item.items())
        elif isinstance(item, (list, tuple)):
            pending.extend((v, f"{path}.{j}.", loose) for j, v in enumerate(item))
    return sorted(out)
