"""Checks of the files a run will read — tasksets and models — before anything is written.

``trine validate`` and ``trine run`` (and :func:`trine.loop.run`) call :func:`check` after the
config is valid: every taskset is loaded with the same :class:`~trine.tasks.TaskSet` code the run
uses (so a malformed line, a missing mapped field or an empty file is found here, with its file and
line), supervised stages' target fields are looked up, every model directory is checked for
config.json, tokenizer files and weights whose safetensors header matches the file size, the policy's
tokenizer must have a vocabulary and round-trip the first training prompt
(:mod:`trine.inspect.tokenizer_check`: a directory without ``tokenizer.json`` loads as a 3-token
tokenizer that encodes every prompt as nothing), and a SQL buffer's URL must parse, name an installed
driver and reach its database (:mod:`trine.inspect.buffer_check`: a PostgreSQL server is connected to, a
SQLite file's directory must be creatable). Everything found is raised at once as one
:class:`PreflightError`, before anything is written; nothing here imports torch or transformers. A model
that ``model.init_preset`` will build on first run is not checked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from trine.config import ConfigError, RunConfig, TasksetConfig
from trine.inspect.buffer_check import buffer_problems
from trine.inspect.tokenizer_check import tokenizer_problems

_passed: list[list[RunConfig]] = []  # stage lists already checked (by identity): not checked twice


class PreflightError(ConfigError):
    """Every problem found in the data and model files of a run, one per line, each with its key path."""

    def __init__(self, errors: list[str]):
        super().__init__(errors, where="the run's data and model files (nothing was written)")


def check(stages: list[RunConfig]) -> None:
    """Raise :class:`PreflightError` listing every problem in the stages' tasksets and models."""
    if any(stages is done for done in _passed):
        return
    errors: list[str] = []
    seen: set[str] = set()
    loaded: dict[str, Any] = {}  # stages mostly share tasksets: each is read once
    for index, cfg in enumerate(stages):
        prefix = f"stages.{index}." if len(stages) > 1 else ""
        for key, ts in _tasksets(cfg):
            found = _taskset_problems(cfg, key, ts, loaded)
            errors += [f"{prefix}{e}" for e in found if _first(seen, f"{key}:{e}")]
        for key, path, tokenizer in _models(cfg):
            found = _model_problems(path, tokenizer)
            if not found and key == "model.path" and _first(seen, f"tokenizer:{tokenizer or path}"):
                found = tokenizer_problems(cfg, _first_task(cfg, loaded))
            errors += [f"{prefix}{key}: {e}" for e in found if _first(seen, e)]
        errors += [f"{prefix}{e}" for e in buffer_problems(cfg) if _first(seen, e)]
    if errors:
        raise PreflightError(errors)
    _passed.append(stages)


def _first(seen: set[str], text: str) -> bool:
    """True the first time ``text`` is seen (stages share tasksets: each problem is reported once)."""
    if text in seen:
        return False
    seen.add(text)
    return True


def _tasksets(cfg: RunConfig) -> list[tuple[str, TasksetConfig]]:
    t = cfg.tasks
    found = [("tasks.train", t.train)] if t.train is not None else []
    found += [(f"tasks.mix.{i}", ts) for i, ts in enumerate(t.mix)]
    found += [(f"tasks.eval.{i}", ts) for i, ts in enumerate(t.eval)]
    return found + ([("tasks.expert", t.expert)] if t.expert is not None else [])


def _taskset_problems(cfg: RunConfig, key: str, ts: TasksetConfig, loaded: dict[str, Any]) -> list[str]:
    """Load the taskset as the run will; then check the fields a supervised stage trains on."""
    tasks = _load(ts, loaded)
    if isinstance(tasks, Exception):
        return [f"{key} ({ts.origin}): {tasks}"]
    if key == "tasks.expert":
        return _missing_field(tasks, key, "response_key", ts.response_key)
    if key != "tasks.train" or cfg.mode != "train":
        return []
    from trine import registry

    if registry.resolve("algorithm", cfg.algorithm.name).pairwise:
        return _missing_field(tasks, key, "chosen_key", ts.chosen_key) + _missing_field(
            tasks, key, "rejected_key", ts.rejected_key
        )
    return _missing_field(tasks, key, "response_key", ts.response_key)


def _load(ts: TasksetConfig, loaded: dict[str, Any]) -> Any:
    """The taskset as the run loads it, or the exception loading it raised (each read once)."""
    from trine.tasks import TaskSet

    kwargs = ts.model_dump(exclude={"response_key", "chosen_key", "rejected_key", "weight"})
    kwargs["sampling"] = ts.sampling.model_dump()
    fingerprint = json.dumps(kwargs, sort_keys=True, default=str)
    if fingerprint not in loaded:
        try:
            loaded[fingerprint] = TaskSet(**kwargs)
        except Exception as err:  # enrich: any failure to read the data becomes one line naming the key
            loaded[fingerprint] = err
    return loaded[fingerprint]


def _first_task(cfg: RunConfig, loaded: dict[str, Any]) -> tuple[str, Any] | None:
    """``(key, task)``: the first row of the first taskset that loads (``tasks.train`` first), if any."""
    for key, ts in _tasksets(cfg):
        tasks = _load(ts, loaded)
        if not isinstance(tasks, Exception) and len(tasks):
            return key, tasks[0]
    return None


def _missing_field(tasks: Any, key: str, setting: str, field: str | None) -> list[str]:
    """A problem if rows lack ``field`` (None: the answer is the target, already checked)."""
    if field is None:
        return []
    missing = [t for t in tasks if not _ends_with_reply(t.question) and t.raw.get(field) is None]
    if not missing:
        return []
    return [
        f"{key}.{setting}: {len(missing)} of {len(tasks)} rows have no field {field!r} (first: task "
        f"{missing[0].task_id!r}, keys {sorted(missing[0].raw)}); set {setting} to the right field"
    ]


def _ends_with_reply(question: Any) -> bool:
    """A chat prompt ending with an assistant message carries its own target."""
    return isinstance(question, list) and bool(question) and question[-1].get("role") == "assistant"


def _models(cfg: RunConfig) -> list[tuple[str, str, str | None]]:
    m = cfg.model
    found = []
    if not (m.init_preset and not Path(m.path).exists()):
        found.append(("model.path", m.path, m.tokenizer_path))
    if cfg.explorer.teacher is not None:
        found.append(("explorer.teacher", cfg.explorer.teacher, None))
    return found


def _model_problems(path: str, tokenizer: str | None) -> list[str]:
    from trine.models.loading import check_model_files

    if not Path(path).exists():
        return [f"{path!r} does not exist; give a local model directory"]
    return check_model_files(path, tokenizer)
