"""The ``trine`` command (:mod:`trine.cli.main`); its command groups (``buffer``, ``tasks``, ``annotate``,
``studio``) are the other modules here. Each command imports what it runs inside its function, so
``trine --help`` answers in about a second."""

from trine.cli.main import app, main

__all__ = ["app", "main"]
