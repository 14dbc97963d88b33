"""What ``trine studio`` was started with, and the FastAPI dependency that hands it to each page's routes.

The routers (:mod:`~trine.studio.runs`, :mod:`~trine.studio.configs`, :mod:`~trine.studio.experiences`,
:mod:`~trine.studio.annotations`) import this module, :mod:`~trine.studio.app` imports them: no circle.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import Request

COOKIE = "trine_studio_token"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


@dataclass
class StudioSettings:
    """What ``trine studio`` was started with (nothing here comes from the browser)."""

    runs_dir: Path
    """The directory whose subdirectories are runs; names from the browser never leave it."""
    token: str | None = None
    """Required on every ``/api`` request when set."""
    annotators: dict[str, str] = field(default_factory=dict)
    """Annotator token -> annotator name."""
    root: Path = field(default_factory=Path.cwd)
    """Where relative paths in a config edited in the studio resolve, and where started runs run."""
    config_files: list[Path] = field(default_factory=list)
    """Config files named on the command line, offered as templates in the config editor."""
    plugins: list[Path] = field(default_factory=list)
    """Plugin files loaded at start (from the command line; the browser never names one)."""
    max_body_bytes: int = 1 << 20
    """Largest request body (a config's YAML, a batch of answers): 413 beyond, before it is parsed."""
    max_import_bytes: int = 64 << 20
    """Largest body of a Label Studio import (``POST /api/runs/NAME/annotations/import``)."""

    def annotator(self, token: str | None) -> str | None:
        """The annotator whose token this is (constant-time compare), else None."""
        if not token:
            return None
        for known, name in self.annotators.items():
            if same_token(known, token):
                return name
        return None


def same_token(given: str, known: str) -> bool:
    """Constant-time comparison of two tokens (as UTF-8 bytes: a non-ASCII guess is just wrong)."""
    return hmac.compare_digest(given.encode(), known.encode())


def new_token() -> str:
    return secrets.token_urlsafe(18)


def studio(request: Request) -> StudioSettings:
    """The settings of the app serving ``request`` (a FastAPI dependency)."""
    return request.app.state.studio
