"""``trine studio``: the web app over a runs directory (the ``studio`` extra)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import typer

PLUGIN_HELP = "Python file(s) to load first; their @trine.register(...) plugins become valid names."


def studio(
    runs: Path = typer.Option(Path("runs"), "--runs", help="The directory whose subdirectories are runs."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on (loopback by default)."),
    port: int = typer.Option(8765, "--port", help="Port to listen on."),
    token: str = typer.Option(
        None,
        "--token",
        envvar="TRINE_STUDIO_TOKEN",
        help="Access token (made and printed when --host is not loopback and none is given).",
    ),
    annotator: list[str] = typer.Option(
        [],
        "--annotator",
        help="An annotator's name (repeatable): each gets a token, printed, and kept in RUNS/.studio/annotators.json "
        "so that it stays the same when the studio restarts.",
    ),
    config: list[Path] = typer.Option(
        [], "--config", help="Config file(s) offered as templates in the editor."
    ),
    plugin: list[Path] = typer.Option([], "--plugin", help=PLUGIN_HELP),
) -> None:
    """Watch runs (live curves, status, eval tables), browse their experiences, edit and start configs,
    and answer annotation queues, in the browser."""
    from trine.config.extras import command_problem

    missing = command_problem("trine studio")  # fastapi, uvicorn: found, not imported
    if missing:
        typer.secho(missing, fg="red", err=True)
        raise typer.Exit(2)
    from trine.registry import load_plugin
    from trine.studio.server import ensure_token, serve
    from trine.studio.settings import StudioSettings, new_token

    problems = [f"--config {p}: no such file" for p in config if not p.is_file()]
    problems += [f"--plugin {p}: no such file" for p in plugin if not p.is_file()]
    names = [a.strip() for a in annotator]
    problems += [f"--annotator {a!r}: expected a non-empty name" for a in names if not a]
    problems += [f"--annotator {a!r} is given twice" for a in sorted(set(names)) if names.count(a) > 1]
    if problems:
        typer.secho("\n".join(problems), fg="red", err=True)
        raise typer.Exit(2)
    for p in plugin:
        load_plugin(p)
    runs.mkdir(parents=True, exist_ok=True)
    settings = StudioSettings(
        runs_dir=runs.resolve(),
        token=token,
        annotators=annotator_tokens(runs, names, new_token),
        config_files=[p.resolve() for p in config],
        plugins=[p.resolve() for p in plugin],
    )
    ensure_token(settings, host)
    from trine.studio.configs import warm

    warm()  # imports what validation needs now, not at the editor's first keystroke
    shown = "localhost" if host in ("127.0.0.1", "::1") else host
    query = f"/?token={settings.token}" if settings.token else "/"
    typer.echo(f"Trine Studio on http://{shown}:{port}{query}  (runs: {settings.runs_dir})")
    for tok, name in settings.annotators.items():
        typer.echo(f"  annotator {name}: token {tok}")
    serve(settings, host=host, port=port)


def annotator_tokens(runs: Path, names: list[str], make: Callable[[], str]) -> dict[str, str]:
    """Token -> name for ``names``: the token kept for a name in ``runs/.studio/annotators.json``, else a
    new one (``make()``), saved there (readable by its owner only)."""
    path = runs / ".studio" / "annotators.json"
    kept: dict[str, str] = json.loads(path.read_text()) if path.is_file() else {}
    for name in names:
        kept.setdefault(name, make())
    if names:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.touch(mode=0o600)
        tmp.write_text(json.dumps(kept, indent=1))
        os.replace(tmp, path)
    return {kept[name]: name for name in names}
