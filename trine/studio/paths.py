"""Names from the browser never leave the runs directory.

A run is named by its directory's name directly under the runs directory: one path component, no
separators, no ``..``, not hidden. :func:`run_path` is the only way the studio turns a name from a
request into a path, and it also checks the resolved path (a symlink pointing out is refused too).
"""

from __future__ import annotations

import re
from pathlib import Path

from fastapi import HTTPException

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}$")


def check_name(name: str, what: str = "run name") -> str:
    """``name`` if it is one plain path component; HTTP 400 naming the value otherwise."""
    if not _NAME.match(name) or ".." in name:
        raise HTTPException(
            400,
            f"{what} {name!r} is not allowed: expected one directory name under the runs directory "
            "(letters, digits, '_', '-', '.'; no '/', no '..', not starting with '.')",
        )
    return name


def inside(base: Path, path: Path) -> bool:
    """Whether ``path`` (resolved, symlinks followed) lies inside ``base`` (resolved)."""
    base, path = base.resolve(), path.resolve()
    return path == base or base in path.parents


def run_path(runs_dir: Path, name: str, must_exist: bool = True) -> Path:
    """``runs_dir/name`` after :func:`check_name`; 404 when it is not a directory (``must_exist``),
    400 when it resolves outside ``runs_dir`` (a symlink out)."""
    path = Path(runs_dir) / check_name(name)
    if not inside(runs_dir, path):
        raise HTTPException(400, f"run {name!r} resolves outside the runs directory {runs_dir}; refused")
    if must_exist and not path.is_dir():
        raise HTTPException(404, f"no run {name!r} under {runs_dir}")
    return path
