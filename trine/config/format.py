"""How config problems and field types are written for people: error lines and the reference's type column.

Kept apart from :mod:`trine.config` (which defines the sections) so that both stay short. Every
error line is ``<key path>: <what is wrong> (got <value>)``, with the expected range or type and,
for an unknown key, the closest valid one.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel

_BOUNDS = (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<="))
_KINDS = {"int_type": "an integer", "float_type": "a number", "bool_type": "true or false"}


def bounds_text(metadata: list[Any]) -> str:
    """``" >= 0 and < 1"`` for the range constraints in a field's metadata (``""`` if none)."""
    metadata = [c for m in metadata for c in (getattr(m, "metadata", None) or [m])]  # Field(...) inside
    parts = [
        f"{sign} {getattr(m, key)}"
        for m in metadata
        for key, sign in _BOUNDS
        if getattr(m, key, None) is not None
    ]
    return (" " + " and ".join(parts)) if parts else ""


def type_name(ann: Any, metadata: list[Any] | None = None) -> str:
    """A readable type: ``int >= 1 | None``, ``'fifo' / 'priority'``, ``tuple[float >= 0 and < 1, ...]``."""
    origin, args = typing.get_origin(ann), typing.get_args(ann)
    if origin is Annotated:
        text = type_name(args[0]) + bounds_text(list(ann.__metadata__))
    elif origin is Literal:
        text = " / ".join(repr(a) for a in args)
    elif origin in (typing.Union, types.UnionType):
        text = " | ".join(type_name(a) for a in args)
    elif args:
        text = f"{getattr(origin, '__name__', origin)}[{', '.join(type_name(a) for a in args)}]"
    elif ann is type(None):
        text = "None"
    elif ann is Any:
        text = "Any"
    else:
        text = getattr(ann, "__name__", str(ann))
    return text + bounds_text(metadata or [])


def _model_at(root: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    model: Any = root
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(part)
        if field is None:
            return None
        ann = field.annotation
        candidates = [ann, *typing.get_args(ann)]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return model


def _expected(root: type[BaseModel], loc: tuple) -> str:
    """``"an integer >= 1"``: the type and range of the field at ``loc`` (its element's for ``betas.0``)."""
    names = [p for p in loc if not isinstance(p, int)]
    parent = _model_at(root, tuple(names[:-1])) if names else None
    field = parent.model_fields.get(names[-1]) if parent else None
    if field is None:
        return "a finite number"
    base, meta = field.annotation, list(field.metadata)
    for arg in typing.get_args(field.annotation):  # X | None, tuple[X, X]
        if typing.get_origin(arg) is Annotated:
            base, meta = typing.get_args(arg)[0], meta + list(arg.__metadata__)
            break
    word = "an integer" if base is int else "a number"
    return word + bounds_text(meta)


def format_error(err: dict[str, Any], prefix: str, root: type[BaseModel], loc_root: tuple = ()) -> str:
    """One pydantic error as ``path: message``; ``loc_root`` is where ``err``'s own location starts."""
    loc = (*loc_root, *err["loc"])
    path = prefix + ".".join(str(p) for p in loc) if loc else prefix.rstrip(".") or "<root>"
    kind, value = err["type"], err.get("input")
    if kind == "extra_forbidden":
        parent = _model_at(root, loc[:-1])
        valid = list(parent.model_fields) if parent else []
        close = difflib.get_close_matches(str(loc[-1]), valid, n=1)
        hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(valid)}"
        return f"{path}: unknown key; {hint}"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal", "finite_number"):
        return f"{path}: {value!r} is out of range; expected {_expected(root, loc)}"
    if kind in _KINDS and isinstance(value, str):
        return (
            f"{path}: got the string {value!r}; expected {_KINDS[kind]}. Write the value without quotes "
            "(strings are not converted, so that 'yes' or '4' cannot be taken for something else)"
        )
    if kind in _KINDS:
        return f"{path}: expected {_KINDS[kind]}, got {type(value).__name__} {value!r}"
    msg = err["msg"].removeprefix("Value error, ")
    if kind not in ("value_error", "assertion_error") and "input" in err:
        msg += f" (got {value!r})"
    return f"{path}: {msg}"


def section_reference(root: type[BaseModel]) -> str:
    """The reference of ``root`` and its nested sections (every field, type, default and docstring) as Markdown."""
    sections: list[tuple[str, type[BaseModel]]] = [("(top level)", root)]
    seen: set[type] = {root}
    lines: list[str] = []
    while sections:
        title, model = sections.pop(0)
        lines += [f"#### `{title}`", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        for name, field in model.model_fields.items():
            ann = field.annotation
            nested = next(
                (
                    c
                    for c in (ann, *getattr(ann, "__args__", ()))
                    if isinstance(c, type) and issubclass(c, BaseModel)
                ),
                None,
            )
            if nested is not None and nested not in seen:
                seen.add(nested)
                sections.append((name if model is root else f"{title}.{name}", nested))
            text = type_name(ann, list(field.metadata))
            default = "(section)" if nested is not None else f"`{field.default!r}`"
            doc = (field.description or "").replace("\n", " ").replace("|", "\\|")
            lines.append(f"| `{name}` | {text.replace('|', chr(92) + '|')} | {default} | {doc} |")
        lines.append("")
    return "\n".join(lines)
