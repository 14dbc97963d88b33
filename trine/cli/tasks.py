"""``trine tasks``: prepare tasksets (``process``) and check a train/eval pair for contamination (``overlap``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


FILE_ONLY = "(TRAIN/EVAL files only; with --config each taskset's own settings apply)"


@tasks_app.command()
def overlap(
    train: Path = typer.Argument(
        None, metavar="TRAIN", help="Training taskset (.jsonl, .json, .parquet or a datasets directory)."
    ),
    eval_set: Path = typer.Argument(None, metavar="EVAL", help="Evaluation taskset, read like TRAIN."),
    config: Path = typer.Option(
        None,
        "--config",
        help="Instead of TRAIN and EVAL: a run config's training tasksets (train, mix, "
        "expert; every stage) against each of its eval tasksets.",
    ),
    field: str = typer.Option(
        "prompt", "--field", help="What is compared: prompt (as the run renders it), answer, or a row field."
    ),
    n: int = typer.Option(
        13, "--n", help="Words per n-gram (13 as in the GPT-3 and Llama contamination studies)."
    ),
    threshold: float = typer.Option(
        0.5,
        "--threshold",
        help="Share of an eval row's n-grams found in training from which it is contaminated.",
    ),
    common: int = typer.Option(
        10, "--common", help="Ignore n-grams in more than this many training rows (0: none)."
    ),
    examples: int = typer.Option(5, "--examples", min=0, help="Contaminated rows to show."),
    fail_over: float = typer.Option(
        None,
        "--fail-over",
        help="Exit 1 when an eval taskset's contaminated share exceeds this (0-1; for CI).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object (for scripts)."),
    prompt_key: str = typer.Option(
        "question", "--prompt-key", help=f"Row field holding the prompt {FILE_ONLY}."
    ),
    prompt_template: str = typer.Option(
        None, "--prompt-template", help=f"Format string of the prompt {FILE_ONLY}."
    ),
    messages_key: str = typer.Option(None, "--messages-key", help=f"Row field holding a chat {FILE_ONLY}."),
    answer_key: str = typer.Option(
        "answer", "--answer-key", help=f"Row field holding the answer {FILE_ONLY}."
    ),
    train_split: str = typer.Option(
        None, "--train-split", help="Split of TRAIN (a saved DatasetDict or folder)."
    ),
    eval_split: str = typer.Option(None, "--eval-split", help="Split of EVAL."),
    plugin: list[Path] = typer.Option(
        [], "--plugin", help="Python file(s) to load first (plugin generators)."
    ),
) -> None:
    """Contamination check: exact and n-gram overlap of each eval row with the training rows, with examples.
    Exit code 0 (--fail-over: 1 when the contaminated share is over it), 2 on bad input."""
    import json

    from trine.inspect.contamination import compare_sides, print_report, report_dict
    from trine.tasks.overlap import check_args

    try:
        check_args(n, threshold, common)
        if fail_over is not None and not 0 <= fail_over <= 1:
            raise ValueError(f"--fail-over {fail_over}; expected a share between 0 and 1, e.g. 0.01.")
        if config is not None:
            train_side, eval_sides = _config_sides(config, train, eval_set, field, plugin)
        else:
            mapping = {
                "prompt_key": prompt_key,
                "prompt_template": prompt_template,
                "messages_key": messages_key,
            }
            train_side, eval_sides = _file_sides(
                train, eval_set, field, answer_key, train_split, eval_split, mapping
            )
        reports = [
            compare_sides(train_side, ev, n=n, threshold=threshold, common=common) for ev in eval_sides
        ]
    except (ValueError, FileNotFoundError) as err:
        typer.secho(str(err), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    pairs = list(zip(reports, eval_sides, strict=True))
    if as_json:
        data = [report_dict(r, train_side, ev, field, examples) for r, ev in pairs]
        typer.echo(json.dumps({"reports": data}, indent=1, ensure_ascii=False))
    else:
        for k, (report, ev) in enumerate(pairs):
            if k:
                typer.echo("")
            print_report(report, train_side, ev, field, examples, typer.echo)
    over = [f"{ev.label}: {r.share:.1%}" for r, ev in pairs if fail_over is not None and r.share > fail_over]
    if over:
        typer.secho(
            f"contaminated share over --fail-over {fail_over:g}: {'; '.join(over)}",
            fg=typer.colors.RED,
            err=True,
        )
        raise typer.Exit(1)


def _file_sides(
    train: Path | None,
    eval_set: Path | None,
    field: str,
    answer_key: str,
    train_split: str | None,
    eval_split: str | None,
    mapping: dict[str, str | None],
) -> tuple[Any, list[Any]]:
    from trine.inspect.contamination import file_side

    if train is None or eval_set is None:
        raise ValueError(
            "trine tasks overlap needs TRAIN and EVAL (taskset files or directories), or --config RUN.yaml "
            "to take them from a run config; e.g. trine tasks overlap train.jsonl test.jsonl."
        )
    return (
        file_side("train", train, field, answer_key, split=train_split, **mapping),
        [file_side("eval", eval_set, field, answer_key, split=eval_split, **mapping)],
    )


def _config_sides(
    config: Path, train: Path | None, eval_set: Path | None, field: str, plugins: list[Path]
) -> tuple[Any, list[Any]]:
    from trine.config import ConfigError, load_config
    from trine.inspect.contamination import config_tasksets, join, load_side
    from trine.registry import load_plugin

    if train is not None or eval_set is not None:
        raise ValueError(
            f"--config {config} takes the tasksets from the config, but TRAIN/EVAL were given too "
            f"({train}, {eval_set}); give one of the two."
        )
    try:
        for plugin in plugins:
            load_plugin(plugin)
        stages = load_config(config)
    except ConfigError as err:  # every problem of the config at once
        raise ValueError(str(err)) from None
    train_sets, eval_sets = config_tasksets(stages)
    if not train_sets or not eval_sets:
        missing = (
            "training taskset (tasks.train, tasks.mix, tasks.expert)" if not train_sets else "tasks.eval"
        )
        raise ValueError(f"{config} has no {missing}; overlap compares eval tasksets with training ones.")
    train_side = join(", ".join(k for k, _ in train_sets), [load_side(k, ts, field) for k, ts in train_sets])
    return train_side, [load_side(k, ts, field) for k, ts in eval_sets]
