"""Extension by name or import path.

Each pluggable kind has one explicit table of built-ins, living in its own package
(``trine.workflows.WORKFLOWS``, ``trine.rewards.REWARDS``, ...). This module only *looks them up*,
lazily, so that importing it is free. Anything that is not a built-in is given as
``"package.module:attr"`` or registered from a user file loaded with ``--plugin path.py``.

A kind whose built-ins import heavy libraries (torch, transformers, sqlalchemy) declares its table as
a :class:`Table` of import paths: each entry is imported the first time it is looked up, so checking a
name (``trine validate``) imports nothing, and :func:`signature` reads a built-in's parameters from
its source until its module is imported anyway.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import importlib
import importlib.util
import inspect
import os
import sys
from collections import ChainMap
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any

# kind -> "module:attribute" of the dict of built-ins
BUILTINS: dict[str, str] = {
    "workflow": "trine.workflows:WORKFLOWS",
    "reward": "trine.rewards:REWARDS",
    "algorithm": "trine.algorithms.presets:PRESETS",
    "advantage": "trine.algorithms:ADVANTAGES",
    "loss": "trine.algorithms:LOSSES",
    "storage": "trine.buffer:STORAGES",
    "operator": "trine.buffer:OPERATORS",
    "monitor": "trine.monitor:SINKS",
    "model_preset": "trine.models.tiny:PRESETS",
    "engine": "trine.models:ENGINES",
    "scheduler": "trine.tasks:SCHEDULERS",
    "generator": "trine.tasks.generators:GENERATORS",
    "environment": "trine.workflows.envs:ENVIRONMENTS",
    "tool": "trine.tools:TOOLS",
}

_extra: dict[str, dict[str, Any]] = {}


class Table(Mapping[str, Any]):
    """A table of built-ins given as import paths (``{"grpo": "trine.algorithms.advantages:grpo_advantages"}``),
    each imported the first time it is looked up: ``name in table`` and listing the names import nothing."""

    def __init__(self, paths: dict[str, str]):
        self.paths = dict(paths)
        """Name -> ``"package.module:attr"``."""
        self._loaded: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._loaded:
            self._loaded[name] = _import(self.paths[name])  # a KeyError for an unknown name
        return self._loaded[name]

    def __contains__(self, name: object) -> bool:
        return name in self.paths

    def __iter__(self) -> Iterator[str]:
        return iter(self.paths)

    def __len__(self) -> int:
        return len(self.paths)

    def __repr__(self) -> str:
        return f"Table({self.paths!r})"


def lazy_exports(package: str, exports: dict[str, str], namespace: dict[str, Any]):
    """``(__getattr__, __dir__)`` for a package whose public names (``exports``: name -> module) are
    imported on first use (PEP 562), so that importing the package, and checking names in its tables,
    imports nothing heavy. Each value is cached in the package's ``namespace`` once imported."""

    def getattr_(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(exports[name]), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return getattr_, dir_


NO_IMPORTS_ENV = "TRINE_NO_IMPORTS"
"""Environment variable: when set (to a reason), import paths are refused in this process as under
:func:`no_imports` (the studio sets it for the runs it starts)."""
_no_imports: ContextVar[str | None] = ContextVar("trine_no_imports", default=None)


@contextlib.contextmanager
def no_imports(reason: str) -> Iterator[None]:
    """Within this block, :func:`resolve` and :func:`import_object` refuse import paths
    (``"package.module:attr"``) with a ValueError instead of importing them: only built-in and
    plugin-registered names are valid. ``reason`` says where the config came from ("the studio: ...")."""
    token = _no_imports.set(reason)
    try:
        yield
    finally:
        _no_imports.reset(token)


def imports_refused() -> str | None:
    """Why import paths are refused here (:func:`no_imports` or ``$TRINE_NO_IMPORTS``), else None."""
    return _no_imports.get() or os.environ.get(NO_IMPORTS_ENV) or None


def _refusal(what: str, reason: str, valid: list[str] | None = None) -> str:
    names = f" Valid names: {', '.join(sorted(valid))}." if valid is not None else ""
    return (
        f"{what} is an import path, and import paths are not loaded from {reason}; or use a built-in name "
        f"or one registered with @trine.register in a --plugin file loaded beforehand.{names}"
    )


def builtins(kind: str) -> Mapping[str, Any]:
    """The built-ins of ``kind`` plus anything registered by plugins (which win), by name. Looking up a
    name imports only that entry (see :class:`Table`); listing the names imports none."""
    return ChainMap(dict(_extra.get(kind, {})), _table(kind))


def _table(kind: str) -> Mapping[str, Any]:
    if kind not in BUILTINS:
        raise KeyError(f"unknown plugin kind {kind!r}; expected one of {sorted(BUILTINS)}")
    return _import(BUILTINS[kind])


def register(kind: str, name: str):
    """Decorator for plugin files: ``@register("reward", "my_reward")``."""

    def wrap(obj: Any) -> Any:
        builtins(kind)  # validates the kind
        _extra.setdefault(kind, {})[name] = obj
        return obj

    return wrap


def import_object(spec: str) -> Any:
    """Import ``"package.module:attr"`` (``attr`` may be dotted); a ValueError under :func:`no_imports`."""
    reason = imports_refused()
    if reason:
        raise ValueError(_refusal(repr(spec), reason))
    return _import(spec)


def _import(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{spec!r} is not an import path; expected 'package.module:attr'.")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def resolve(kind: str, name: str) -> Any:
    """Return the built-in called ``name`` or the object at import path ``name``."""
    table = builtins(kind)
    if name in table:
        return table[name]
    if ":" in name:
        reason = imports_refused()
        if reason:
            raise ValueError(_refusal(f"{kind} {name!r}", reason, list(table)))
        try:
            return import_object(name)
        except (ImportError, AttributeError, ValueError) as err:
            raise ValueError(
                f"{kind} {name!r} could not be imported: {err}. The module must be importable from "
                "where trine runs (installed, or its directory on PYTHONPATH); or register the "
                f"{kind} with @trine.register({kind!r}, 'name') in a file passed with --plugin path.py."
            ) from err
    raise ValueError(unknown_message(kind, name, table))


def unknown_message(kind: str, name: str, table: dict[str, Any]) -> str:
    """The error for a name that is neither a built-in nor an import path: valid names and the fixes."""
    close = difflib.get_close_matches(name, list(table), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return (
        f"unknown {kind} {name!r}.{hint} Valid names: {', '.join(sorted(table))}; or give an import "
        "path 'package.module:attr' that is importable (installed, or on PYTHONPATH), or register it "
        f"with @trine.register({kind!r}, {name!r}) in a file passed with --plugin path.py."
    )


def check(kind: str, name: str) -> str | None:
    """None if ``name`` resolves, else the error message (used by config validation). A built-in or
    plugin name is found in its table without importing it; an import path is imported."""
    if name in builtins(kind):
        return None
    try:
        resolve(kind, name)
    except ValueError as err:
        return str(err)
    return None


def signature(kind: str, name: str) -> inspect.Signature:
    """The call signature of the ``kind`` called ``name`` (a class: its constructor's), for checking
    arguments. A :class:`Table` built-in whose module is not imported yet is read from its source (the
    parameters' names, kinds and defaults; no annotations), so the check imports nothing; anything else
    is resolved and inspected. Raises ValueError for an unknown name, as :func:`resolve` does."""
    table = _table(kind)
    if isinstance(table, Table) and name in table and name not in _extra.get(kind, {}):
        found = _source_signature(table.paths[name])
        if found is not None:
            return found
    return inspect.signature(resolve(kind, name))


def _source_signature(path: str) -> inspect.Signature | None:
    """The signature of the top-level function or class (its ``__init__``) at ``path``, read with
    ``ast`` from the module's file; None when the module is already imported (inspect it) or the
    definition is not a plain one (decorated, generated, a class without its own ``__init__``)."""
    module_name, _, attr = path.partition(":")
    if module_name in sys.modules:
        return None
    spec = importlib.util.find_spec(module_name)  # imports the parent packages only
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    node = next((n for n in tree.body if getattr(n, "name", None) == attr), None)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.decorator_list:
        return _signature_of(node.args)
    if isinstance(node, ast.ClassDef) and not node.decorator_list and not node.keywords:
        own = {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}
        init = own.get("__init__")
        if init is not None and "__new__" not in own and not init.decorator_list:
            return _signature_of(init.args, skip_self=True)
    return None


def _signature_of(args: ast.arguments, skip_self: bool = False) -> inspect.Signature:
    P = inspect.Parameter
    positional = [*args.posonlyargs, *args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = [
        P(
            a.arg,
            P.POSITIONAL_ONLY if i < len(args.posonlyargs) else P.POSITIONAL_OR_KEYWORD,
            default=_value(d),
        )
        for i, (a, d) in enumerate(zip(positional, defaults))
    ]
    if args.vararg:
        params.append(P(args.vararg.arg, P.VAR_POSITIONAL))
    params += [P(a.arg, P.KEYWORD_ONLY, default=_value(d)) for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    if args.kwarg:
        params.append(P(args.kwarg.arg, P.VAR_KEYWORD))
    return inspect.Signature(params[1:] if skip_self else params)


def _value(node: ast.expr | None) -> Any:
    """A default as written in the source: its value when it is a literal, else its source text."""
    if node is None:
        return inspect.Parameter.empty
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError):
        return _Source(ast.unparse(node))


class _Source(str):
    """A default that is not a literal, shown as its source text (``torch.float32``)."""

    def __repr__(self) -> str:
        return str(self)


def check_arguments(
    kind: str, name: str, args: dict[str, Any], what: str, *given: Any, **given_kw: Any
) -> str | None:
    """None if the ``kind`` called ``name`` accepts ``args`` as keyword arguments, else the problem.

    ``given``/``given_kw`` are what the caller passes besides ``args`` (a reward gets
    ``(response, task)``, a workflow ``reward=``), ``what`` names the setting in the message
    (``"reward_args"``). Unknown names are left to :func:`check`; a callable with ``**kwargs`` accepts
    any name, and one without a readable signature is not checked. Arguments listed in the callable's
    ``registry_args`` (``{"env": "environment"}`` on step-wise workflows) must name an entry of that kind.
    """
    if check(kind, name) is not None:
        return None
    fn = resolve(kind, name)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = signature.parameters
    open_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    passed = list(params)[: len(given)] + list(given_kw)
    settable = [n for n, p in params.items() if n not in passed and p.kind in _KEYWORD_KINDS]
    for key in args:
        if key in passed:
            return f"{what}[{key!r}] is passed to {kind} {name!r} by trine itself; remove it"
        if key not in settable and not open_kw:
            return f"{what}[{key!r}] is not an argument of {kind} {name!r}; valid: {settable}"
    try:
        signature.bind(*given, **given_kw, **args)
    except TypeError as err:
        return f"{what} {args!r} do not fit {kind} {name!r}{signature}: {err}; valid: {settable}"
    for key, named_kind in getattr(fn, "registry_args", {}).items():  # e.g. a workflow's env=, tools=
        value = args.get(key)
        names = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        for item in names:
            problem = check(named_kind, item) if isinstance(item, str) else None
            if problem:
                return f"{what}[{key!r}]: {problem}"
    return None


_KEYWORD_KINDS = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def load_plugin(path: str | Path) -> None:
    """Execute a user file so its ``@register`` decorators run."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"plugin file {str(path)!r} does not exist; pass --plugin PATH.py")
    name = f"trine_plugin_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
