"""The studio's config editor: validate as ``trine validate`` does, the typed schema, templates, start a run.

- ``POST /api/config/validate {"yaml", "template"?}``: the YAML is parsed (a syntax error is one error at
  its line), validated by :func:`trine.config.validate_dict` (relative paths against the studio's root, or
  the directory of the ``--config`` file the text came from: ``template: "file:N"``) and, when
  that passes, its data and model files are checked by :func:`trine.inspect.preflight.check`: exactly what
  ``trine validate`` reports, every error at once, each with its key path and line
  (:mod:`trine.studio.yaml_lines`).
- ``GET /api/config/schema``: every field of :class:`trine.config.RunConfig` and its sections as a dotted
  path with its type, default and docstring.
- ``GET /api/config/templates`` and ``GET /api/config/template?id=``: the resolved config of each run
  (``run:NAME``) and each ``--config`` file of the studio's command line (``file:N``), with a fresh
  run name to start it under (:func:`fresh_name`: ``NAME-2`` when ``NAME`` is taken).
- ``POST /api/config/start {"yaml", "name"}``: validate, write the resolved config to
  ``RUNS/NAME/launch.yaml`` and start ``trine run`` on it as a detached process that outlives the studio.
  The run is named ``NAME`` (its config's ``name`` and ``run_dir`` are set to it, whatever the template
  said); a ``NAME`` already taken is refused (409) with a free name to use instead, and a config that
  would write outside the runs directory, reach a database elsewhere or start a program is refused (422,
  every key at once: :mod:`trine.studio.confine`) before anything is written.

Import paths (``"package.module:attr"``) are never loaded from the browser: validation runs under
:func:`trine.registry.no_imports`, and a run started here refuses them too (``$TRINE_NO_IMPORTS``), so
only built-in names and those registered by the studio's own ``--plugin`` files are valid.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import yaml
from fastapi import APIRouter, Depends, HTTPException
from pydantic import BaseModel
from pydantic_core import PydanticUndefined, to_jsonable_python

from trine.studio.confine import write_problems
from trine.studio.paths import check_name, run_path, run_problem
from trine.studio.settings import StudioSettings, studio
from trine.studio.yaml_lines import compose, locate, split_error, syntax_error

router = APIRouter()

REASON = "the studio: start this config with `trine run` from a shell"
"""Why import paths are refused in configs from the browser (:func:`trine.registry.no_imports`)."""
RUN_FILES = ("config.yaml", "status.json", "launch.yaml")
"""Files that mean a run directory is taken (``launch.yaml``: started from the studio, not yet running)."""


class YamlBody(BaseModel):
    yaml: str
    template: str | None = None
    """The template the text came from: a ``file:N`` one resolves relative paths against its own
    directory (as ``trine run`` does); anything else against the studio's root."""


class StartBody(YamlBody):
    name: str


def base_dir(template: str | None, settings: StudioSettings) -> Path:
    """Where relative paths of a config from ``template`` resolve: a ``--config`` file's directory,
    else the studio's root."""
    kind, _, key = (template or "").partition(":")
    if kind == "file" and key.isdigit() and int(key) < len(settings.config_files):
        return Path(settings.config_files[int(key)]).absolute().parent
    return Path(settings.root)


def validate_text(text: str, root: Path) -> tuple[dict[str, Any], list[Any]]:
    """``({"ok", "errors", "stages"}, validated stages)`` for config text, as ``trine validate`` checks it
    (relative paths resolve against ``root``; import paths refused)."""
    from trine.config import ConfigError, load_yaml, validate_dict
    from trine.registry import no_imports

    try:
        tree = compose(text)  # first: it bounds the text's size and depth before anything expands it
        data = load_yaml(text)
    except yaml.YAMLError as err:
        return {"ok": False, "errors": [syntax_error(err)], "stages": []}, []
    if data is None:
        data = {}
    if not isinstance(data, dict):
        found = {
            "path": None,
            "line": 1,
            "message": f"expected a mapping of config keys at the top level, "
            f"got {type(data).__name__}; write `key: value` lines (e.g. `tasks:`)",
        }
        return {"ok": False, "errors": [found], "stages": []}, []
    with no_imports(REASON):
        stages, lines = validate_dict(data, base_dir=root)
        if not lines:
            try:
                _preflight(stages)
            except ConfigError as err:
                lines = list(err.errors)
            except FileNotFoundError as err:
                lines = [str(err)]
    errors = [_error(tree, line) for line in lines]
    names = [s.stage for s in stages]
    return {"ok": not errors, "errors": errors, "stages": names}, stages


def warm() -> None:
    """Import what the first validation needs (the built-in tables pull in torch: ~1.5 s once), so that
    the editor's first check is as fast as the next ones; call it where the studio starts serving."""
    from trine import registry

    for kind in registry.BUILTINS:
        registry.builtins(kind)


def _preflight(stages: list[Any]) -> None:
    """:func:`trine.inspect.preflight.check`, without letting its passed-list keep every config edited here."""
    from trine.inspect import preflight

    try:
        preflight.check(stages)
    finally:  # it remembers each passed stage list so that a run checks once; the editor checks often
        preflight._passed[:] = [done for done in preflight._passed if done is not stages]


def _error(tree: yaml.Node | None, line: str) -> dict[str, Any]:
    path, message = split_error(line)
    return {"path": path, "line": locate(tree, path, message), "message": message}


@router.post("/config/validate")
def validate(body: YamlBody, settings: StudioSettings = Depends(studio)) -> dict[str, Any]:
    """Every error of the config text, each with its key path and line; ``ok`` when there are none."""
    return validate_text(body.yaml, base_dir(body.template, settings))[0]


@router.get("/config/schema")
def schema() -> dict[str, Any]:
    """Every section and field of the run config as dotted paths: type, default, docstring."""
    return {"fields": schema_fields()}


def _section_of(annotation: Any) -> type[BaseModel] | None:
    """The config section class in a field's type (``X``, ``X | None``, ``list[X]``), if any."""
    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _default(field: Any) -> Any:
    value = field.get_default(call_default_factory=True)
    if value is PydanticUndefined or isinstance(value, BaseModel):
        return None
    return to_jsonable_python(value, fallback=repr)


@functools.lru_cache(maxsize=1)
def schema_fields() -> dict[str, dict[str, Any]]:
    """``{"trainer.lr": {"type", "default", "doc", "section"}}`` for :class:`trine.config.RunConfig`.

    A section used in several places (``tasks.train``, ``tasks.eval``) is listed under each; a list of
    sections (``tasks.eval``) lists its items' fields without an index (``tasks.eval.path``). Entries of
    ``stages`` are partial run configs: look their keys up without the ``stages.N.`` prefix.
    """
    from trine.config import RunConfig
    from trine.config.format import type_name

    fields: dict[str, dict[str, Any]] = {}
    pending: list[tuple[str, type[BaseModel], tuple[type, ...]]] = [("", RunConfig, (RunConfig,))]
    while pending:
        prefix, model, above = pending.pop(0)
        for name, field in model.model_fields.items():
            nested = _section_of(field.annotation)
            fields[prefix + name] = {
                "type": type_name(field.annotation, list(field.metadata)),
                "default": _default(field),
                "doc": field.description or "",
                "section": nested is not None,
            }
            if nested is not None and nested not in above:
                pending.append((f"{prefix}{name}.", nested, (*above, nested)))
    return fields


def _run_templates(runs_dir: Path) -> list[dict[str, str]]:
    if not runs_dir.is_dir():
        return []
    found = []
    for path in sorted(runs_dir.iterdir()):
        try:
            check_name(path.name)
        except HTTPException:
            continue  # hidden or odd names are not runs the studio can name
        if run_problem(runs_dir, path) is not None:
            continue  # it or a link in it leads out of the runs directory: not read
        if (path / "config.yaml").is_file():
            found.append({"id": f"run:{path.name}", "label": f"run {path.name}"})
    return found


@router.get("/config/templates")
def templates(settings: StudioSettings = Depends(studio)) -> dict[str, Any]:
    """The configs the editor can start from: each run's resolved config and each ``--config`` file."""
    files = [{"id": f"file:{i}", "label": f"file {p}"} for i, p in enumerate(settings.config_files)]
    return {"templates": _run_templates(Path(settings.runs_dir)) + files}


def fresh_name(runs_dir: Path, wanted: str) -> str:
    """``wanted`` when no directory of that name is under ``runs_dir``, else the first free ``wanted-2``,
    ``wanted-3``, ... (``run-2`` taken: ``run-3``, not ``run-2-2``)."""
    if not (Path(runs_dir) / wanted).exists():
        return wanted
    numbered = re.fullmatch(r"(.+)-(\d+)", wanted)
    stem, n = (numbered[1], int(numbered[2])) if numbered else (wanted, 1)
    while (Path(runs_dir) / f"{stem}-{n + 1}").exists():
        n += 1
    return f"{stem}-{n + 1}"


def _config_name(text: str, default: str) -> str:
    """The ``name`` a config text gives its run, else ``default``, else ``run`` (the first of them that
    is a usable run name)."""
    try:
        named = (yaml.safe_load(text) or {}).get("name")
    except (yaml.YAMLError, AttributeError):
        named = None
    for name in (named, default):
        if isinstance(name, str):
            try:
                return check_name(name)
            except HTTPException:
                pass
    return "run"


@router.get("/config/template")
def template(id: str, settings: StudioSettings = Depends(studio)) -> dict[str, Any]:  # noqa: A002 - API name
    """The YAML text of template ``id`` (``run:NAME`` or ``file:N``) and a fresh ``name`` to start it as
    (:func:`fresh_name` of the run's name, or of the file's ``name``); 404 for an unknown one."""
    kind, _, key = id.partition(":")
    runs_dir = Path(settings.runs_dir)
    if kind == "run":
        path = run_path(runs_dir, key) / "config.yaml"
        if not path.is_file():
            raise HTTPException(404, f"run {key!r} has no config.yaml yet; pick another template")
        return {"yaml": path.read_text(), "name": fresh_name(runs_dir, key)}
    if kind == "file" and key.isdigit() and int(key) < len(settings.config_files):
        file = Path(settings.config_files[int(key)])
        text = file.read_text()
        return {"yaml": text, "name": fresh_name(runs_dir, _config_name(text, file.stem))}
    raise HTTPException(
        404, f"unknown template {id!r}; expected 'run:NAME' or 'file:N' from GET /api/config/templates"
    )


@router.post("/config/start")
def start(body: StartBody, settings: StudioSettings = Depends(studio)) -> dict[str, Any]:
    """Validate, write ``RUNS/NAME/launch.yaml`` and start ``trine run`` on it, detached: ``{name, pid}``
    (and ``note`` when the config's own ``name`` was another: the run is named ``NAME``)."""
    result, stages = validate_text(body.yaml, base_dir(body.template, settings))
    if not result["ok"]:
        raise HTTPException(422, {"errors": result["errors"]})
    runs_dir = Path(settings.runs_dir).absolute()
    run_dir = run_path(runs_dir, body.name, must_exist=False)
    taken = [f for f in RUN_FILES if (run_dir / f).exists()]
    if taken:
        raise HTTPException(
            409,
            f"run {body.name!r} already exists under {runs_dir} (it has {', '.join(taken)}); starting there "
            f"would write into that run: pick another name, e.g. {fresh_name(runs_dir, body.name)!r}",
        )
    outside = write_problems(stages, runs_dir, Path(settings.root))
    if outside:
        tree = compose(body.yaml)
        raise HTTPException(422, {"errors": [_error(tree, line) for line in outside]})
    from trine.rundir import _resolved_config

    said = stages[0].name
    stages = [s.model_copy(update={"name": body.name}) for s in stages]  # the run is NAME, not the template's
    run_dir.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_dump(_resolved_config(stages, run_dir), sort_keys=False)
    launch = run_dir / "launch.yaml"
    try:
        with launch.open("x") as handle:  # exclusive: two starts of one name cannot both go on
            handle.write(config)
    except FileExistsError:
        raise HTTPException(
            409,
            f"run {body.name!r} was just started; pick another name, e.g. {fresh_name(runs_dir, body.name)!r}",
        ) from None
    out: dict[str, Any] = {"name": body.name, "pid": launch_run(launch, settings)}
    if said != body.name:
        out["note"] = f"named {body.name!r} (the config said name: {said!r}); it writes to {run_dir}"
    return out


def launch_run(launch: Path, settings: StudioSettings) -> int:
    """Start ``trine run launch.yaml`` in its own session (it outlives the studio; Ctrl-C in the studio's
    terminal does not reach it), output to ``launch.log`` beside it; returns its pid. The ``wandb`` and
    ``mlflow`` sinks keep their local files in the run directory (``WANDB_DIR``, ``MLFLOW_TRACKING_URI``),
    unless the studio's own environment says otherwise."""
    from trine.registry import NO_IMPORTS_ENV

    command = [sys.executable, "-m", "trine.cli", "run", str(launch)]
    for plugin in settings.plugins:
        command += ["--plugin", str(Path(plugin).absolute())]
    env = {**os.environ, NO_IMPORTS_ENV: REASON}
    env.setdefault("WANDB_DIR", str(launch.parent))
    env.setdefault("MLFLOW_TRACKING_URI", (launch.parent / "mlruns").absolute().as_uri())
    with (launch.parent / "launch.log").open("ab") as log:
        process = subprocess.Popen(  # noqa: S603 - our own interpreter and arguments, no shell
            command,
            cwd=settings.root,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )
    # reap it when it ends (no zombie while the studio keeps running)
    threading.Thread(target=process.wait, name=f"trine-run-{process.pid}", daemon=True).start()
    return process.pid
