"""Nothing the studio reads, and nothing a run it starts writes, leaves the runs directory.

This module is the one place that turns names and paths into checked paths:

- A run is named by its directory's name directly under the runs directory: one path component, no
  separators, no ``..``, not hidden (:func:`check_name`). :func:`run_path` is the only way the studio
  turns a name from a request into a path.
- :func:`inside` is the one check: the path's *resolved* target (symlinks followed, ``..`` folded)
  lies inside the resolved runs directory. :func:`run_path` applies it to the run directory and to
  every link found in it (:func:`escaping_links`: links are followed while they stay inside, so a link
  to a link out is caught too), because the studio reads a run's files through many helpers
  (``config.yaml``, ``status.json``, ``metrics.jsonl``, ``bench.jsonl``, ``explorers/``,
  ``checkpoints/``, ``annotations.db``, a file buffer): a run holding one link that leads out is
  refused as a whole (400 naming the links), and is not listed.
- :func:`location_problem` checks a path or a database URL that a run started from the studio would
  write (:mod:`trine.studio.confine`): a SQLite file or plain path must resolve inside the runs
  directory; any other database URL (``postgresql://``) is a write outside and refused.

What is *not* checked here: the buffer location a run's own ``config.yaml`` names (written by
``trine run`` from a shell, where any path or database is the user's choice) is read where it says;
only files *inside* the run directory must not lead out. Hard links and a link made between the check
and the read are not caught (whoever can write the runs directory can do that).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from fastapi import HTTPException

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,199}$")
MAX_LINKS_SHOWN = 5
"""Links named in a refusal; more are counted."""


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
    base, path = Path(base).resolve(), Path(path).resolve()
    return path == base or base in path.parents


def escaping_links(runs_dir: Path, run_dir: Path) -> list[str]:
    """``"explorers/0/status.json -> /elsewhere/status.json"`` for each link under ``run_dir`` whose
    resolved target leaves ``runs_dir``; links that stay inside are followed into (each directory once),
    so a chain of links is judged by where it ends."""
    runs_dir, run_dir = Path(runs_dir).resolve(), Path(run_dir)
    found: list[str] = []
    seen: set[Path] = set()
    pending = [(run_dir, Path())]
    while pending:
        directory, shown = pending.pop()
        real = directory.resolve()
        if real in seen:
            continue
        seen.add(real)
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue  # unreadable: the studio cannot read what is below either
        for entry in entries:
            path = Path(entry.path)
            if entry.is_symlink():
                target = path.resolve()
                if not inside(runs_dir, target):
                    found.append(f"{shown / entry.name} -> {target}")
                    continue
                if target.is_dir():
                    pending.append((target, shown / entry.name))
            elif entry.is_dir(follow_symlinks=False):
                pending.append((path, shown / entry.name))
    return sorted(found)


def run_problem(runs_dir: Path, path: Path) -> str | None:
    """Why the run directory ``path`` may not be read (it, or a link in it, leads out of the runs
    directory), or None."""
    name = Path(path).name
    if not inside(runs_dir, path):
        return f"run {name!r} resolves outside the runs directory {runs_dir} (to {Path(path).resolve()}); refused"
    links = escaping_links(runs_dir, path) if Path(path).is_dir() else []
    if not links:
        return None
    shown = "; ".join(links[:MAX_LINKS_SHOWN])
    more = f" and {len(links) - MAX_LINKS_SHOWN} more" if len(links) > MAX_LINKS_SHOWN else ""
    return (
        f"run {name!r} holds links that lead outside the runs directory {runs_dir} ({shown}{more}); the "
        "studio reads nothing outside it: copy those files into the run directory, or remove the links"
    )


def run_path(runs_dir: Path, name: str, must_exist: bool = True) -> Path:
    """``runs_dir/name`` after :func:`check_name`; 404 when it is not a directory (``must_exist``),
    400 when it, or a link inside it, resolves outside ``runs_dir`` (:func:`run_problem`)."""
    path = Path(runs_dir) / check_name(name)
    if must_exist and not path.is_dir() and inside(runs_dir, path):
        raise HTTPException(404, f"no run {name!r} under {runs_dir}")
    problem = run_problem(Path(runs_dir), path)
    if problem is not None:
        raise HTTPException(400, problem)
    return path


def _sqlite_file(url: str) -> tuple[str | None, str | None]:
    """``(database file, problem)`` of a ``sqlite://`` URL: no file for an in-memory database."""
    import sqlalchemy as sa

    try:
        parsed = sa.make_url(url)
    except (sa.exc.ArgumentError, ValueError) as err:
        return None, f"is not a database URL ({err}); write sqlite:///PATH"
    if str(parsed.query.get("uri", "")).lower() in ("true", "1"):
        return None, "is a SQLite URI filename (uri=true); write a plain sqlite:///PATH instead"
    database = parsed.database
    return (None if database in (None, "", ":memory:") else database), None


def location_problem(value: str, runs_dir: Path, root: Path, *, network: bool = False) -> str | None:
    """Why a run started from the studio may not write at ``value`` (a path, or a database URL), or None.

    A relative path resolves against ``root`` (where the run runs). ``sqlite:///PATH`` and plain paths
    must resolve inside ``runs_dir``; ``http(s)://`` is an endpoint the run talks to, allowed only where
    ``network`` (a model server, an MCP server's URL); any other URL (``postgresql://``, ``file://``) is
    a store outside the runs directory and refused.
    """
    where = f"outside the runs directory {runs_dir}"
    if "://" in value:
        scheme = value.split("://", 1)[0].lower()
        if scheme in ("http", "https") and network:
            return None
        if scheme.split("+")[0] != "sqlite":
            return (
                f"{value!r} is a {scheme} store, {where}; a run started from the studio writes only "
                "inside it: use a sqlite:/// file under it, or start this config with `trine run`"
            )
        file, problem = _sqlite_file(value)
        if problem is not None:
            return f"{value!r} {problem}: the studio cannot tell whether it is {where}"
        if file is None:
            return None
        path = Path(file)
    else:
        path = Path(value)
    try:
        path = path.expanduser()
        path = path if path.is_absolute() else Path(root) / path
        if inside(runs_dir, path):
            return None
        target = path.resolve()
    except (ValueError, RuntimeError, OSError) as err:  # a NUL byte, an unknown ~user, a link loop
        return f"{value!r} is not a usable path ({err}), so it may lead {where}; give a plain path under it"
    return (
        f"{value!r} writes {target}, {where}; a run started from the studio writes only inside it: "
        "give a path under it, or drop the key (its default is in the run's own directory)"
    )
