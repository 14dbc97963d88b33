"""Optional extras a config needs, found when it is validated rather than as a traceback once the model
has loaded.

Each optional feature names the modules it imports and the extra of ``pyproject.toml`` that installs
them (:data:`EXTRAS`). The modules are looked up with :func:`importlib.util.find_spec`, so nothing is
imported. :func:`extras_problems` is one of the cross-section checks :mod:`trine.config` runs, so a
missing extra is reported with every other problem of the config, naming the key, the missing package
and the fix (:func:`install`, the one spelling of the install command). :func:`command_problem` is the
same check for a command's own extra (``trine serve``, ``trine studio``), run before anything heavy loads.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import TYPE_CHECKING

from trine.config.engines import VLLM_ENGINES

if TYPE_CHECKING:
    from trine.config import RunConfig

EXTRAS: dict[str, tuple[str, ...]] = {
    "agents": ("mcp", "openai"),
    "serve": ("fastapi", "uvicorn", "openai"),
    "studio": ("fastapi", "uvicorn"),
    "ray": ("ray",),
    "lora": ("peft",),
    "vllm": ("vllm",),
    "envs": ("gymnasium", "textarena", "reasoning_gym", "websockets", "httpx"),
    "postgres": ("psycopg",),
    "data": ("data_juicer", "ray", "aiohttp"),
}
"""The extras of ``pyproject.toml`` (``[project.optional-dependencies]``), as the modules they make
importable (tests/unit/config/test_config_extras.py keeps the two in step)."""

NAMED: dict[tuple[str, str], tuple[str | None, tuple[str, ...]]] = {
    ("engine", "vllm"): ("vllm", ("vllm",)),
    ("engine", "openai"): ("agents", ("openai",)),
    ("environment", "textarena"): ("envs", ("textarena",)),
    ("environment", "gym"): ("envs", ("gymnasium",)),
    ("generator", "reasoning_gym"): ("envs", ("reasoning_gym",)),
    ("reward", "reasoning_gym"): ("envs", ("reasoning_gym",)),
    ("operator", "data_juicer"): ("data", ("data_juicer", "ray", "aiohttp")),
    ("monitor", "wandb"): (None, ("wandb",)),
    ("monitor", "mlflow"): (None, ("mlflow",)),
}
"""Built-in names (registry kind, name) that need an extra: ``(extra, modules)``; extra None: a package
with no extra of its own, installed by name."""

PACKAGES = {"data_juicer": "py-data-juicer", "psycopg": "psycopg[binary]", "psycopg2": "psycopg2-binary"}
"""The pip name of a module whose distribution is called otherwise."""


def install(extra: str) -> str:
    """The command that installs ``extra`` into the editable checkout (the spelling the docs use)."""
    return f'pip install -e ".[{extra}]"'


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here (found, not imported)."""
    try:
        return find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing(key: str, modules: tuple[str, ...], extra: str | None, instead: str | None = None) -> str | None:
    """The problem when one of ``modules`` is not installed: ``key`` (the setting that needs it), the
    missing packages, the install command of ``extra`` (None: the packages by name) and ``instead``, the
    other way out (``"use model.engine: hf"``), if there is one."""
    absent = [m for m in modules if not installed(m)]
    if not absent:
        return None
    fix = install(extra) if extra else "pip install " + " ".join(PACKAGES.get(m, m) for m in absent)
    verb = "is" if len(absent) == 1 else "are"
    other = f" (or {instead})" if instead else ""
    return f"{key} needs {' and '.join(absent)}, which {verb} not installed: {fix}{other}"


COMMANDS: dict[str, tuple[str, tuple[str, ...]]] = {
    "trine serve": ("serve", ("fastapi", "uvicorn")),
    "trine studio": ("studio", ("fastapi", "uvicorn")),
}
"""Commands that need an extra: ``(extra, the modules the command itself imports)``."""


def command_problem(command: str) -> str | None:
    """Why ``command`` (a key of :data:`COMMANDS`) cannot run here, or None: checked first thing."""
    extra, modules = COMMANDS[command]
    return missing(command, modules, extra)


def extras_problems(cfg: RunConfig) -> list[str]:
    """The optional packages that ``cfg``'s settings need and that are not installed, one problem each."""
    engine = "vllm" if cfg.model.engine in VLLM_ENGINES else cfg.model.engine
    found = [_named("engine", engine, f"model.engine: {cfg.model.engine}", "use model.engine: hf")]
    if cfg.cluster.backend == "ray":
        found.append(missing("cluster.backend: ray", ("ray",), "ray", "set cluster.backend: local"))
    if cfg.trainer.lora is not None:
        found.append(missing("trainer.lora", ("peft",), "lora", "remove trainer.lora"))
    for sink in cfg.monitor.sinks:
        found.append(_named("monitor", sink, f"monitor.sinks: {sink}", f"remove {sink} from monitor.sinks"))
    for i, spec in enumerate(cfg.buffer.operators):
        name = spec.get("name")
        what = f"buffer.operators.{i}: {name}"
        found.append(_named("operator", name, what, "remove the operator") if isinstance(name, str) else None)
    if cfg.buffer.storage in ("sql", "sqlite") and cfg.buffer.url:
        found.append(_driver_problem(cfg.buffer.url))
    for name, aux in cfg.explorer.auxiliary_models.items():
        if aux.base_url is not None:
            key = f"explorer.auxiliary_models.{name}.base_url (an OpenAI-compatible endpoint)"
            found.append(missing(key, ("openai",), "agents", "give the model a local path"))
    found += _taskset_problems(cfg)
    return [p for p in found if p]


def _named(kind: str, name: str, key: str, instead: str) -> str | None:
    extra, modules = NAMED.get((kind, name), (None, ()))
    return missing(key, modules, extra, instead) if modules else None


def _driver_problem(url: str) -> str | None:
    """A PostgreSQL ``buffer.url`` whose driver is not installed (SQLAlchemy's default is psycopg2; the
    ``postgres`` extra installs psycopg 3: ``postgresql+psycopg://``)."""
    dialect, _, driver = url.partition("://")[0].partition("+")
    if dialect != "postgresql":
        return None
    driver = driver or "psycopg2"
    if driver == "psycopg":
        return missing(
            "buffer.url (postgresql+psycopg)",
            ("psycopg",),
            "postgres",
            "remove buffer.url for SQLite in the run directory",
        )
    return missing(
        f"buffer.url (postgresql with the {driver} driver)",
        (driver,),
        None,
        f"write postgresql+psycopg://... and {install('postgres')}",
    )


def _taskset_problems(cfg: RunConfig) -> list[str | None]:
    """MCP servers and third-party environments of the tasksets whose workflows this mode runs."""
    t = cfg.tasks
    explored = (
        [] if cfg.mode == "train" else [("train", t.train), *((f"mix.{i}", m) for i, m in enumerate(t.mix))]
    )
    found: list[str | None] = []
    for key, ts in [*explored, *((f"eval.{i}", e) for i, e in enumerate(t.eval))]:
        if ts is None:
            continue
        args = ts.workflow_args
        if args.get("mcp_servers"):
            where = f"tasks.{key}.workflow_args.mcp_servers"
            found.append(missing(where, ("mcp",), "agents", "offer Python functions as tools instead"))
        env = args.get("env")
        if isinstance(env, str):
            where = f"tasks.{key}.workflow_args.env: {env}"
            found.append(_named("environment", env, where, "use another environment"))
        found.append(_named("reward", ts.reward, f"tasks.{key}.reward: {ts.reward}", "use another reward"))
    every = [("train", t.train), *((f"mix.{i}", m) for i, m in enumerate(t.mix)), ("expert", t.expert)]
    for key, ts in [*every, *((f"eval.{i}", e) for i, e in enumerate(t.eval))]:
        if ts is not None and ts.generator is not None:  # rows are made in every mode
            where = f"tasks.{key}.generator: {ts.generator}"
            found.append(_named("generator", ts.generator, where, "give the taskset a path instead"))
    return found
