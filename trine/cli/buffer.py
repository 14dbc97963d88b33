"""``trine buffer stats|head|export|import|reward|drop-pending RUN_DIR``: look into and feed a run's buffer.

Every command opens the buffer the run opened: the ``buffer`` section of the run's resolved
``config.yaml`` through :func:`trine.buffer.open_buffer` (same storage, database, table, file). In a
multi-stage run, ``--stage NAME`` picks the stage; by default the last stage whose buffer is
persistent (not ``memory``), else the last stage.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import typer

buffer_app = typer.Typer(no_args_is_help=True, help="Inspect and feed a run's experience buffer.")

RUN_DIR = typer.Argument(..., help="A run directory written by `trine run`.")
STAGE = typer.Option(
    None,
    "--stage",
    help="The stage whose buffer to open (default: the last stage with a persistent buffer, else the last).",
)


@buffer_app.callback()
def _plugins(
    plugin: list[Path] = typer.Option(
        [], "--plugin", help="Python file(s) the run loaded with --plugin (e.g. a plugin storage)."
    ),
) -> None:
    """Inspect and feed a run's experience buffer."""
    from trine.registry import load_plugin

    for path in plugin:
        load_plugin(path)


def _rows(run_dir: Path, status: str | None = None, stage: str | None = None):
    """The run's rows with their states; for an in-memory buffer, what its last checkpoint kept, with a
    note saying so (and, when that is nothing, only the note: exit 0, no empty tables)."""
    from trine.buffer.inspect import read_rows
    from trine.buffer.states import check_state

    try:
        if status is not None:
            check_state(status)
        rows = read_rows(run_dir, status, stage)
    except (ValueError, FileNotFoundError) as err:
        typer.secho(str(err), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    if rows is None:  # an in-memory buffer: what its last checkpoint kept
        from trine.buffer.inspect import memory_buffer_note, rows_from_state
        from trine.trainer.checkpoint import list_checkpoints, load_states

        found = list_checkpoints(run_dir / "checkpoints")
        rows = rows_from_state(load_states(found[-1])[1].get("buffer") or {}) if found else []
        typer.secho(memory_buffer_note(run_dir, len(rows), bool(found)), fg=typer.colors.YELLOW, err=True)
        if not rows:
            raise typer.Exit(0)
    return [(e, s) for e, s in rows if status is None or s == status]


@buffer_app.command()
def stats(run_dir: Path = RUN_DIR, stage: str = STAGE) -> None:
    """Counts by status (pending, ready, trained, stale, expired, rolled_back), by policy version and
    by trajectory status (ok, truncated, timeout, env_error, tool_error, reward_error), rewards and
    lengths, a reward histogram."""
    from rich.console import Console
    from rich.table import Table

    from trine.buffer.inspect import reward_histogram
    from trine.buffer.states import STATES
    from trine.types import TRAJECTORY_STATUSES

    rows = _rows(run_dir, stage=stage)
    console = Console()
    by_status = Counter(s for _, s in rows)
    table = Table(title=f"{run_dir}: {len(rows)} experiences")
    for col in ("status", "count", "reward mean", "response length mean"):
        table.add_column(col, justify="left" if col == "status" else "right")
    for status in STATES:
        chosen = [e for e, s in rows if s == status]
        rewards = [e.reward for e in chosen if e.reward is not None]
        table.add_row(
            status,
            str(by_status.get(status, 0)),
            f"{sum(rewards) / len(rewards):.3f}" if rewards else "-",
            f"{sum(e.response_length for e in chosen) / len(chosen):.1f}" if chosen else "-",
        )
    console.print(table)
    versions = Table(title="by policy version")
    versions.add_column("version", justify="right")
    for status in STATES:
        versions.add_column(status, justify="right")
    for v in sorted({e.policy_version for e, _ in rows}):
        counts = Counter(s for e, s in rows if e.policy_version == v)
        versions.add_row(str(v), *(str(counts.get(s, 0)) for s in STATES))
    console.print(versions)
    outcomes = Table(title="by trajectory status (only ok and truncated are trained by default)")
    for col in ("trajectory", "count", "reward mean"):
        outcomes.add_column(col, justify="left" if col == "trajectory" else "right")
    for outcome in TRAJECTORY_STATUSES:
        chosen = [e for e, _ in rows if e.status == outcome]
        rewards = [e.reward for e in chosen if e.reward is not None]
        mean = f"{sum(rewards) / len(rewards):.3f}" if rewards else "-"
        outcomes.add_row(outcome, str(len(chosen)), mean)
    console.print(outcomes)
    console.print("reward histogram")
    for line in reward_histogram([e.reward for e, _ in rows if e.reward is not None]):
        console.print("  " + line)


@buffer_app.command()
def head(
    run_dir: Path = RUN_DIR,
    n: int = typer.Option(5, "-n", help="How many experiences."),
    bottom: bool = typer.Option(False, "--bottom", help="Lowest rewards instead of highest."),
    status: str = typer.Option(
        None, help="Only this status (pending, ready, trained, stale, expired, rolled_back)."
    ),
    stage: str = STAGE,
    tokens: bool = typer.Option(
        False,
        "--tokens",
        help="Show which tokens train: trained (action_mask 1) highlighted, masked ones (prompt, template, "
        "observations, tool output) marked ⟦…⟧ off a terminal.",
    ),
) -> None:
    """The top (or bottom) experiences by reward, decoded to text (``--tokens``: with the mask view that
    ``trine check`` prints, :mod:`trine.inspect.mask_view`)."""
    from rich.console import Console
    from rich.table import Table

    rows = [(e, s) for e, s in _rows(run_dir, status, stage) if e.reward is not None or status == "pending"]
    rows.sort(key=lambda r: r[0].reward if r[0].reward is not None else 0.0, reverse=not bottom)
    tokenizer = _tokenizer(run_dir, stage)
    if tokens:
        _print_masks(rows[:n], tokenizer, Console())
        return
    table = Table(title=f"{'bottom' if bottom else 'top'} {n} by reward", show_lines=True)
    for col in ("reward", "status", "version", "prompt", "response"):
        table.add_column(col)
    for e, s in rows[:n]:
        prompt = (
            tokenizer.decode(e.tokens[: e.prompt_length]) if tokenizer else str(e.tokens[: e.prompt_length])
        )
        response = tokenizer.decode(e.response_tokens) if tokenizer else e.info.get("response", "")
        table.add_row(
            "-" if e.reward is None else f"{e.reward:.3f}", s, str(e.policy_version), prompt, response
        )
    Console().print(table)


def _print_masks(rows: list, tokenizer, console) -> None:
    """Each experience with its trained and masked tokens, reward (and parts), status and version."""
    from trine.inspect.mask_view import experience_spans, print_spans

    for e, s in rows:
        parts = ", ".join(f"{k} {v:g}" for k, v in (e.info.get("reward_parts") or {}).items())
        reward = "pending" if e.reward is None else f"{e.reward:.3f}" + (f" ({parts})" if parts else "")
        title = f"task {e.task_id}, reward {reward}, {s}, version {e.policy_version}"
        print_spans(console, experience_spans(tokenizer, e), title)


@buffer_app.command("export")
def export(
    run_dir: Path = RUN_DIR,
    out: Path = typer.Argument(..., help="A .jsonl or .parquet file to write."),
    status: str = typer.Option(
        None, help="Only this status (pending, ready, trained, stale, expired, rolled_back)."
    ),
    stage: str = STAGE,
) -> None:
    """Write the run's experiences to jsonl or parquet (the format of trine.buffer.files)."""
    from trine.buffer.files import export_experiences

    count = export_experiences([e for e, _ in _rows(run_dir, status, stage)], out)
    typer.echo(f"wrote {count} experiences to {out}")


@buffer_app.command("import")
def import_(
    run_dir: Path = RUN_DIR,
    source: Path = typer.Argument(..., help="A .jsonl or .parquet file of experiences."),
    stage: str = STAGE,
) -> None:
    """Add experiences from a file to the run's (SQL or file) buffer."""
    from trine.buffer.files import import_experiences

    experiences = import_experiences(source)
    buffer = _open(run_dir, stage)
    buffer.put(experiences)
    buffer.close()
    typer.echo(f"imported {len(experiences)} experiences into {run_dir}")


@buffer_app.command()
def reward(
    run_dir: Path = RUN_DIR,
    rewards: Path = typer.Argument(
        ..., help='jsonl rows {"id": ..., "reward": r} or {"task_id", "run_id", "reward"}.'
    ),
    stage: str = STAGE,
) -> None:
    """Fill in pending rewards; those experiences become trainable. Says why any row was not filled in
    (already has a reward, not found, expired, ...), with how many and which."""
    from trine.buffer.inspect import key_states

    updates: dict = {}
    for i, line in enumerate(rewards.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if "reward" not in row or not ("id" in row or {"task_id", "run_id"} <= set(row)):
            typer.secho(
                f"{rewards}:{i}: expected keys 'reward' and 'id' (or 'task_id' + 'run_id'), got {sorted(row)}",
                fg=typer.colors.RED,
                err=True,
            )
            raise typer.Exit(2)
        updates[row["id"] if "id" in row else (row["task_id"], row["run_id"])] = float(row["reward"])
    buffer = _open(run_dir, stage)
    try:
        before = key_states(run_dir, list(updates), stage)
        filled = buffer.set_rewards(updates)
    finally:
        buffer.close()
    typer.echo(f"filled {filled} of {len(updates)} rewards in {run_dir}")
    for line in unfilled_lines(before, filled):
        typer.echo(line)


@buffer_app.command("drop-pending")
def drop_pending(
    run_dir: Path = RUN_DIR,
    older_than: str = typer.Option(
        None, "--older-than", help="Only rows put longer ago than this: 90s, 15m, 1h, 2d (or seconds)."
    ),
    session: str = typer.Option(None, "--session", help="Only rows of this trine serve session_id."),
    ids: list[str] = typer.Option(None, "--id", help="Only this experience id (repeat for several)."),
    stage: str = STAGE,
) -> None:
    """Drop experiences still waiting for a reward (state pending -> expired: never trained), chosen by
    age, session or id (every filter given must match); prints each one dropped."""
    import time

    if older_than is None and session is None and not ids:
        typer.secho(
            "give --older-than, --session or --id: which pending rows to drop", fg=typer.colors.RED, err=True
        )
        raise typer.Exit(2)
    try:
        seconds = None if older_than is None else _seconds(older_than)
    except ValueError as err:
        typer.secho(str(err), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    buffer = _open(run_dir, stage)
    try:
        if not hasattr(buffer, "drop_pending"):
            typer.secho(
                f"drop-pending needs a SQL buffer; the run in {run_dir} stores its buffer as "
                f"{type(buffer).__name__} (buffer.storage: sql keeps rows that can be dropped).",
                fg=typer.colors.RED,
                err=True,
            )
            raise typer.Exit(2)
        dropped = buffer.drop_pending(
            ids=ids or None, older_than=seconds, info=None if session is None else {"session_id": session}
        )
    finally:
        buffer.close()
    if not dropped:
        typer.echo(f"no pending experience in {run_dir} matches; nothing dropped")
        return
    typer.echo(f"dropped {len(dropped)} pending experience(s) in {run_dir} (now expired, never trained):")
    now = time.time()
    for exp_id, task_id, created_at, info in dropped:
        about = "".join(f"  {k}={info[k]}" for k in ("session_id", "response_id") if k in info)
        typer.echo(f"  {exp_id}  put {_age(now - created_at)} ago  task_id={task_id}{about}")


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _seconds(text: str) -> float:
    """``90s``, ``15m``, ``1.5h``, ``2d`` or plain seconds, as seconds."""
    number, unit = (text[:-1], text[-1]) if text[-1:] in _UNITS else (text, "s")
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"--older-than {text!r}: expected a duration such as 90s, 15m, 1h or 2d")
    return value * _UNITS[unit]


def _age(seconds: float) -> str:
    for unit in ("d", "h", "m"):
        if seconds >= _UNITS[unit]:
            return f"{seconds / _UNITS[unit]:.1f}{unit}"
    return f"{max(0.0, seconds):.0f}s"


WHY_NOT_FILLED = {
    "not_found": "not found: no experience with that id (or task_id and run_id) in the buffer",
    "ready": "already has a reward (ready: waiting for the trainer)",
    "trained": "already has a reward and was trained",
    "stale": "dropped as stale (its policy version was too old to train)",
    "expired": "expired: its reward did not come within buffer.pending_timeout, so it was dropped",
    "rolled_back": "rolled back: put after the checkpoint a resumed run started again from",
}
"""Why a reward was not filled in, by the state of the rows its key names (``not_found``: none)."""


def unfilled_lines(before: dict, filled: int) -> list[str]:
    """Lines saying why each key of a reward file was not filled in (per reason: how many and which),
    from the (id, state) of its rows read just before (``before``: :func:`trine.buffer.inspect.key_states`);
    ``filled``: rows the buffer filled (fewer than were pending: some changed meanwhile)."""
    from trine.buffer.states import PENDING, STATES

    reasons: dict[str, list[str]] = {}
    for key, rows in before.items():
        states = [state for _, state in rows]
        if PENDING in states:
            continue
        reason = "not_found" if not states else min(states, key=STATES.index)
        reasons.setdefault(reason, []).append(key if isinstance(key, str) else f"({key[0]}, {key[1]})")
    lines = ["not filled:"] if reasons else []
    for reason in WHY_NOT_FILLED:
        keys = reasons.get(reason, [])
        if keys:
            shown = ", ".join(keys[:10]) + (f", ... ({len(keys) - 10} more)" if len(keys) > 10 else "")
            lines.append(f"  {len(keys)} {WHY_NOT_FILLED[reason]}: {shown}")
    pending = len({i for rows in before.values() for i, state in rows if state == PENDING})
    if filled < pending:
        lines.append(
            f"  {pending - filled} row(s) were pending when read but not when filled: rewarded or expired "
            "meanwhile (by the run or another writer)"
        )
    return lines


def _open(run_dir: Path, stage: str | None):
    """The run's persistent buffer (:func:`trine.buffer.inspect.open_run_buffer`), or exit 2 saying why."""
    from trine.buffer.inspect import open_run_buffer

    try:
        return open_run_buffer(run_dir, stage)
    except (ValueError, FileNotFoundError) as err:
        typer.secho(str(err), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


def _tokenizer(run_dir: Path, stage: str | None):
    """The run's tokenizer: from its last checkpoint, else from the model path of the stage's config."""
    from trine.buffer.inspect import run_stage_config
    from trine.models import load_tokenizer
    from trine.trainer.checkpoint import list_checkpoints

    found = list_checkpoints(run_dir / "checkpoints")
    candidates = [found[-1]] if found else []
    candidates.append(Path((run_stage_config(run_dir, stage).get("model") or {}).get("path", "")))
    for path in candidates:
        try:
            return load_tokenizer(path)
        except (OSError, FileNotFoundError, ValueError):
            continue
    return None
