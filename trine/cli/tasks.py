"""``trine tasks process IN OUT --steps STEPS.yaml``: run the task pipeline over a taskset file."""

from __future__ import annotations

from pathlib import Path

import typer

tasks_app = typer.Typer(no_args_is_help=True, help="Prepare tasksets before training.")


@tasks_app.command()
def process(
    source: Path = typer.Argument(
        ..., help="Taskset to read (.jsonl, .json, .parquet or a datasets directory)."
    ),
    out: Path = typer.Argument(..., help="Taskset to write (.jsonl or .parquet)."),
    steps: Path = typer.Option(
        ..., "--steps", help="YAML list of steps: [{name: extract_boxed, field: answer}, ...]."
    ),
    split: str = typer.Option(None, help="Split of a saved DatasetDict."),
) -> None:
    """Formatters, filters, difficulty scores, priority order — then write the result."""
    import yaml

    from trine.tasks.pipeline import process_taskset

    spec = yaml.safe_load(steps.read_text()) or []
    if not isinstance(spec, list):
        typer.secho(
            f"{steps}: expected a YAML list of steps, got {type(spec).__name__}",
            fg=typer.colors.RED,
            err=True,
        )
        raise typer.Exit(2)
    try:
        report = process_taskset(source, out, spec, split=split)
    except (ValueError, FileNotFoundError) as err:
        typer.secho(str(err), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    for key, value in report.items():
        typer.echo(f"{key}: {value:g}")
    typer.echo(f"wrote {out}")
