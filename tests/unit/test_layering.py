"""DESIGN §2's rules of the house about imports, checked on the source with ``ast``.

Every module of the ``trine`` package is parsed (nothing is imported) and each of its imports,
top-level or inside a function, is resolved to the ``trine`` module it names. The package's top-level
names fall into four groups:

- **stages** (the parts of the loop) import none of each other: only the base modules, their own
  package and, for the trainer, the ``algorithms`` library;
- **base** modules (the nouns, config, registry, rollout models, helpers) import only base modules;
- the **algorithms** library (pure math under the trainer) imports only base modules;
- **wiring** modules build and run the stages and may import anything; ``build`` is the top of the
  wiring below the entry points, so only entry points import it (helpers do not reach back into it).

Only ``distributed/`` imports ``ray``, and optional or slow-to-import libraries are imported inside
functions, never at module top level (``trine --help`` must answer in about a second).

Today's exceptions are listed in ``ALLOWED`` with their reason; the list may only shrink: a new
violation fails, and so does an entry whose import has gone (remove the entry).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import trine

PACKAGE = Path(trine.__file__).resolve().parent

# Top-level names of the package (module trine/x.py or package trine/x/), by group. `monitor` counts
# as a stage (docs/architecture.md: it imports no other part); `trine` is the lazy public facade.
STAGES = {"workflows", "buffer", "trainer", "sync", "tasks", "explorer", "rewards", "monitor"}
MEETS = {
    "explorer": {"workflows", "tasks", "rewards", "buffer", "sync"},
    "trainer": {"algorithms", "buffer", "sync"},
}
"""Where the two sides meet (DESIGN §2): the explorer side may use workflows, tasks, rewards and the buffer
and sync protocols; the trainer side the ``algorithms`` library and the buffer and sync protocols."""
BASE = {
    "types",
    "config",
    "registry",
    "models",
    "blocking",
    "status",
    "tools",
    "feedback",
    "sqlstore",
    "threads",
}
LIBRARIES = {"algorithms": {"trainer"}}  # library -> the stages that may import it
ENTRY_POINTS = {"trine", "loop", "modes", "launch", "cli", "inspect", "serve", "studio", "distributed"}
WIRING = ENTRY_POINTS | {"build", "rundir", "stage"}

RAY_OWNER = "distributed"
# Packages of an optional extra that are themselves imported only inside functions (the `studio` command):
# their modules may import that extra's libraries at top level (FastAPI routers are declared there).
LAZY_PACKAGES = {"studio": {"fastapi", "uvicorn", "starlette"}}
# Optional extras and libraries too slow for `trine --help`: imported inside functions only.
LAZY_ONLY = {
    "ray", "vllm", "wandb", "mlflow", "peft", "fastapi", "uvicorn", "mcp", "data_juicer", "openai",
    "psycopg", "aiohttp", "trl", "math_verify", "matplotlib", "datasets",
}  # fmt: skip

# (importing module, imported module) -> why it is still there and what removes it. Only shrinks.
ALLOWED: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    """One import statement's target, resolved to a module name."""

    module: str  # the importing module, e.g. "trine.buffer.sql"
    target: str  # the imported module, e.g. "trine.types" or "ray.util"
    line: int
    top_level: bool  # False inside a function, or under ``if TYPE_CHECKING:``
    runs: bool = True  # False under ``if TYPE_CHECKING:`` (never executed)


def group(module: str) -> str:
    """The top-level name a ``trine`` module belongs to: ``trine.buffer.sql`` -> ``buffer``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "trine"


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (PACKAGE.parent / rel).with_suffix(".py").is_file() or (
        PACKAGE.parent / rel / "__init__.py"
    ).is_file()


def _target(base: str, name: str) -> str:
    """What ``from base import name`` imports: the submodule if there is one, the facade's source module
    for names ``trine/__init__`` re-exports, else ``base`` itself."""
    if _is_module(f"{base}.{name}"):
        return f"{base}.{name}"
    if base == "trine" and name in trine._EXPORTS:
        return trine._EXPORTS[name]
    return base


def imports(module: str, source: str, is_package: bool = False) -> list[Import]:
    """Every import in ``source`` (the text of ``module``), resolved, with whether it runs at import time."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, top: bool, runs: bool = True) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for stmt in child.body:  # never runs: counts for layering, not as a top-level import
                    visit(ast.Module(body=[stmt], type_ignores=[]), False, False)
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), top, runs)
                continue
            here = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                found.extend(Import(module, a.name, child.lineno, here, runs) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(parts + ([child.module] if child.module else []))
                for alias in child.names:
                    found.append(Import(module, _target(base, alias.name), child.lineno, here, runs))
            visit(child, here, runs)

    visit(ast.parse(source), True)
    return found


def problems(imp: Import) -> list[str]:
    """The rules ``imp`` breaks, each as a message that names the rule and the fix."""
    where = f"{imp.module}:{imp.line} imports {imp.target}"
    library = imp.target.split(".")[0]
    out: list[str] = []
    own_extra = LAZY_PACKAGES.get(group(imp.module), set())
    if library in LAZY_ONLY and imp.top_level and library not in own_extra:
        out.append(f"{where} at module top level; import {library} inside the function that needs it")
    if library == "ray" and group(imp.module) != RAY_OWNER:
        out.append(f"{where}; only trine/{RAY_OWNER}/ may import ray (put the Ray adapter there)")
    if library != "trine":
        return out
    src, dst = group(imp.module), group(imp.target)
    if dst in LAZY_PACKAGES and src != dst and imp.top_level:
        out.append(f"{where} at module top level; trine.{dst} needs an extra: import it inside the function")
    for name in (src, dst):
        if name not in STAGES | BASE | set(LIBRARIES) | WIRING:
            out.append(
                f"trine.{name} is in no group of tests/unit/test_layering.py; add it to STAGES, BASE, "
                "LIBRARIES or WIRING (DESIGN §2 says which)"
            )
    if out or src == dst or dst in BASE:
        return out
    if dst == "build" and src not in ENTRY_POINTS:
        out.append(f"{where}; only entry points {sorted(ENTRY_POINTS)} use the builder: take plain arguments")
    elif src in STAGES and dst not in MEETS.get(src, set()):
        out.append(
            f"{where}; stage {src!r} may import only {sorted(BASE)} and its own package: let the wiring "
            "(roles, build) pass it in, or move the shared piece into a base module"
        )
    elif src in BASE or src in LIBRARIES:
        out.append(f"{where}; {src!r} is a base module/library and may import only {sorted(BASE)}: invert it")
    return out


def package_imports() -> list[Import]:
    """The resolved imports of every module of the installed ``trine`` package."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        module = ".".join(parts[:-1] if is_package else parts)
        found.extend(imports(module, path.read_text(), is_package))
    return found


def violations(found: list[Import], allowed: dict[tuple[str, str], str]) -> list[str]:
    """New violations in ``found``, plus entries of ``allowed`` that match no import any more."""
    out, used = [], set()
    for imp in found:
        for message in problems(imp):
            if (imp.module, imp.target) in allowed:
                used.add((imp.module, imp.target))
            else:
                out.append(message)
    for key in sorted(set(allowed) - used):
        out.append(f"{key[0]} no longer imports {key[1]} against the rules: remove {key} from ALLOWED")
    return out


def test_package_keeps_the_import_rules():
    found = package_imports()
    assert len({imp.module for imp in found}) > 40, "the scan found too few modules; is PACKAGE right?"
    assert violations(found, ALLOWED) == []


def _check(module: str, source: str, allowed: dict[tuple[str, str], str] | None = None) -> list[str]:
    return violations(imports(module, source), allowed or {})


def test_check_catches_stage_to_stage_imports_top_level_and_local():
    assert _check("trine.trainer.trainer", "from trine.workflows import Workflow\n") == [
        "trine.trainer.trainer:1 imports trine.workflows; stage 'trainer' may import only "
        f"{sorted(BASE)} and its own package: let the wiring (roles, build) pass it in, or move the "
        "shared piece into a base module"
    ]
    local = "def f():\n    from trine.explorer import Explorer\n"
    assert "trine.buffer.sql:2 imports trine.explorer" in _check("trine.buffer.sql", local)[0]
    relative = "from ..buffer import memory\n"
    assert "imports trine.buffer.memory" in _check("trine.sync.base", relative)[0]
    facade = "from trine import Workflow\n"  # through trine/__init__'s lazy re-exports
    assert "imports trine.workflows" in _check("trine.buffer.sql", facade)[0]
    typing_only = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trine.sync import X\n"
    assert "imports trine.sync" in _check("trine.buffer.sql", typing_only)[0]
    assert _check("trine.monitor.tracking", typing_only.replace("trine.sync", "wandb")) == []
    algorithms = "from trine.algorithms import grpo_advantages\n"  # a library of the trainer only
    assert "stage 'buffer' may import only" in _check("trine.buffer.sql", algorithms)[0]
    assert "'models' is a base module" in _check("trine.models.engine", "from trine.buffer import x\n")[0]


def test_check_allows_what_design_allows():
    ok = "from trine import registry\nfrom trine.models.batching import x\nfrom trine.types import Task\n"
    assert _check("trine.buffer.mappers", ok) == []
    assert _check("trine.trainer.trainer", "from trine.algorithms.losses import cispo_loss\n") == []
    assert (
        _check("trine.loop", "from trine import build\nfrom trine.buffer import x\nimport trine.trainer\n")
        == []
    )


def test_check_catches_ray_heavy_imports_and_unknown_groups():
    assert (
        "only trine/distributed/ may import ray"
        in _check("trine.buffer.sql", "def f():\n    import ray\n")[0]
    )
    assert _check("trine.distributed.actors", "def f():\n    import ray.util\n") == []
    assert "at module top level" in _check("trine.distributed.actors", "import ray\n")[0]
    assert "import wandb inside" in _check("trine.monitor.tracking", "import wandb\n")[0]
    assert _check("trine.monitor.tracking", "def f():\n    import wandb\n") == []
    assert "add it to STAGES" in _check("trine.newpart", "from trine.types import Task\n")[0]
    assert "only entry points" in _check("trine.explorer.shaping", "from trine.build import Stage\n")[0]


def test_allow_list_only_shrinks():
    key = ("trine.explorer.shaping", "trine.build")
    assert _check("trine.explorer.shaping", "from trine import build\n", {key: "reason"}) == []
    assert (
        "remove ('trine.explorer.shaping', 'trine.build') from ALLOWED"
        in _check("trine.explorer.shaping", "", {key: "r"})[0]
    )


def circles(found: list[Import]) -> list[list[str]]:
    """The import circles among ``trine`` modules (imports that run, at the top or inside a function; a
    package counts as its ``__init__``), each as its modules in order: Tarjan's strongly connected
    components of more than one module."""
    graph: dict[str, set[str]] = {}
    for imp in found:
        if imp.runs and imp.target.startswith("trine.") and imp.target != imp.module:
            graph.setdefault(imp.module, set()).add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def test_no_import_circles():
    """No module reaches itself through the imports it runs (in functions too): a circle hidden behind an
    in-function import is still a circle. A package's ``__init__`` that re-exports its modules is the only
    exception: the modules below it may not import the package back."""
    assert circles(package_imports()) == []


def test_circles_finds_one_through_a_function():
    found = (
        imports("trine.config.checks", "def f():\n    from trine.models import x\n")
        + imports("trine.models", "from trine.config import RunConfig\n", is_package=True)
        + imports("trine.config", "from trine.config.checks import f\n", is_package=True)
    )
    assert circles(found) == [["trine.config", "trine.config.checks", "trine.models"]]


def test_config_imports_no_models():
    """The config is the base every part reads: it names engines and presets as strings, never imports
    model code (which imports torch and transformers)."""
    found = [
        imp for imp in package_imports() if group(imp.module) == "config" and group(imp.target) == "models"
    ]
    assert found == [], [f"{imp.module}:{imp.line} imports {imp.target}" for imp in found]
