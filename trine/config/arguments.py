"""``workflow_args`` / ``reward_args`` against the signature of the function or class they are passed to:
every unknown name, and every value whose type does not fit the parameter's annotation (``scale: int``
given ``"3"``), one problem each, naming the key, the value and the expected type.

:func:`arguments_problems` is what :func:`trine.config.checks.argument_problems` calls for each taskset;
names are checked by :func:`trine.registry.check_arguments`, values here. A value is checked as the JSON
it came from (YAML): pydantic in strict mode, where an int fits a float and a list fits a tuple, but a
string never fits a number and a bool never fits an int. Parameters without an annotation, annotated
``Any``, or with a type pydantic cannot check (a class of the plugin's own) are not checked.
"""

from __future__ import annotations

import inspect
import json
import typing
from typing import Any

from trine import registry


def arguments_problems(
    kind: str, name: str, args: dict[str, Any], what: str, *given: Any, **given_kw: Any
) -> list[str]:
    """Every problem of ``args`` as the keyword arguments of the ``kind`` called ``name`` (``what`` names
    the setting, ``given``/``given_kw`` what trine passes itself, as in :func:`registry.check_arguments`):
    unknown or reserved names first, then values of the wrong type."""
    problems: list[str] = []
    remaining = dict(args)
    while True:
        problem = registry.check_arguments(kind, name, remaining, what, *given, **given_kw)
        if problem is None:
            break
        problems.append(problem)
        key = next((k for k in remaining if problem.startswith(f"{what}[{k!r}]")), None)
        if key is None:  # the call as a whole does not fit (a required argument missing): names are known
            return problems
        del remaining[key]
    return problems + type_problems(kind, name, remaining, what)


def type_problems(kind: str, name: str, args: dict[str, Any], what: str) -> list[str]:
    """The values of ``args`` that do not fit their parameter's annotation (names already checked)."""
    if not args or registry.check(kind, name) is not None:
        return []
    fn = registry.resolve(kind, name)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return []
    owner = fn.__init__ if inspect.isclass(fn) else fn
    problems = []
    for key, value in args.items():
        param = params.get(key)
        if param is None or param.annotation is inspect.Parameter.empty:
            continue
        annotation = _resolved(owner, key, param.annotation)
        problem = _mismatch(annotation, value) if annotation is not None else None
        if problem is not None:
            expected = _type_name(annotation)
            problems.append(
                f"{what}[{key!r}]={value!r} ({type(value).__name__}) does not fit {kind} {name!r}: expected "
                f"{expected} ({problem}); {_fix(value, expected)}"
            )
    return problems


def _resolved(owner: Any, key: str, annotation: Any) -> Any:
    """The annotation as a type (a string one evaluated in the function's module); None if it cannot be
    (a name imported only for type checkers) or is ``Any``."""
    if isinstance(annotation, str):

        def probe() -> None: ...

        probe.__annotations__ = {key: annotation}
        try:
            annotation = typing.get_type_hints(probe, globalns=getattr(owner, "__globals__", {}))[key]
        except Exception:  # noqa: BLE001 - an annotation that does not evaluate is not checked
            return None
    return None if annotation is Any else annotation


def _mismatch(annotation: Any, value: Any) -> str | None:
    """Why ``value`` (as JSON) does not fit ``annotation`` in pydantic's strict mode; None if it fits or
    cannot be checked."""
    from pydantic import TypeAdapter, ValidationError

    try:
        adapter = TypeAdapter(annotation)
        text = json.dumps(value)
    except Exception:  # noqa: BLE001 - a type pydantic cannot check, or a value that is not JSON
        return None
    try:
        adapter.validate_json(text, strict=True)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        return (f"at {where}: " if where else "") + first.get("msg", "invalid")
    return None


def _type_name(annotation: Any) -> str:
    """``int``, ``list[float] | None``: the annotation as written."""
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    return repr(annotation).replace("typing.", "")


def _fix(value: Any, expected: str) -> str:
    """How to write the value: a number or bool quoted in the YAML, or another value."""
    if isinstance(value, str):
        try:
            json.loads(value)
            return f"write it without quotes ({value}) so YAML reads it as a {expected}"
        except ValueError:
            pass
    return f"give a {expected}"
