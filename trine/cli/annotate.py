"""``trine annotate rate|pairs|status|export|import|land RUN_DIR``: people answer a run's experiences.

``rate`` and ``pairs`` post annotation items (:mod:`trine.feedback.queue`) for experiences of the run's
buffer into the run's queue (``RUN_DIR/annotations.db``), in batches committed at once; an experience
already posted (in an item of that kind) is never posted again. People answer them in ``trine studio`` (or in Label Studio:
``export`` / ``import``), and ``land`` (the studio does it by itself) writes the answers into the buffer:
ratings and pair choices as the delayed rewards of pending experiences, pairs as preference rows in the
table ``preferences`` of the run's SQL buffer database (what a DPO stage trains on).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
import yaml

annotate_app = typer.Typer(no_args_is_help=True, help="Post annotation items from a run's buffer.")

RUN_DIR = typer.Argument(..., help="A run directory written by `trine run`.")
STAGE = typer.Option(None, "--stage", help="The stage whose buffer to read (default: as `trine buffer`).")
LIMIT = typer.Option(None, "--limit", help="Post at most this many items.")
BATCH = typer.Option(16, "--batch-size", min=1, help="Items per batch (each batch is committed at once).")
TIMEOUT = typer.Option(None, "--timeout", help="Seconds until an unanswered item expires (default: never).")


def land_run(run_dir: Path, stage: str | None = None, *, live: bool = False) -> dict[str, Any]:
    """Land the answered items of the run's queue into its buffer (and, for a SQL buffer, pairs as
    preference rows in the table ``preferences`` of the same database): the counts of
    :func:`trine.feedback.landing.land`, plus ``note`` when something could not be done.

    ``live``: the run may be running (the studio): land only into a SQL buffer, which other processes
    may write; a file buffer belongs to the one process that runs (land after it stopped).
    """
    from trine.buffer.inspect import open_run_buffer, run_buffer_config
    from trine.buffer.open import storage_class
    from trine.buffer.sql import SQLBuffer
    from trine.feedback.landing import land
    from trine.feedback.queue import AnnotationQueue, queue_url

    try:
        stage = stage if stage is not None else exploring_stage(run_dir)
        sql = issubclass(storage_class(run_buffer_config(run_dir, stage)), SQLBuffer)
        if live and not sql:
            return {
                "note": "answers kept, not landed: the run's buffer is not SQL, so only the run's own process "
                "may write it; land them with `trine annotate land RUN_DIR` once the run stopped"
            }
        buffer = open_run_buffer(run_dir, stage)
    except (ValueError, FileNotFoundError) as err:
        return {"note": f"answers kept, not landed: {err}"}
    preferences, note = None, None
    if sql:
        preferences = SQLBuffer(buffer.url, table="preferences")
    else:
        note = (
            f"the run's buffer is {type(buffer).__name__}: pair answers give rewards but no preference rows"
        )
    queue = AnnotationQueue(queue_url(run_dir))
    try:
        counts: dict[str, Any] = land(queue, buffer, preferences)
    finally:
        queue.close()
        buffer.close()
        if preferences is not None:
            preferences.close()
    return counts if note is None else {**counts, "note": note}


def exploring_stage(run_dir: Path) -> str | None:
    """The stage whose experiences people answer: the last stage that explores (``tasks.source`` not
    ``buffer``) into a persistent buffer, preferring one that runs the ``human_feedback`` workflow; None
    for a single-stage run (its only stage). A later DPO stage that trains on the ``preferences`` table
    is never the one answers land in."""
    from trine.buffer.inspect import run_stage_config

    data = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    stages = data.get("stages") or []
    exploring = [
        s
        for s in stages
        if (s.get("tasks") or {}).get("source", "taskset") != "buffer"
        and (s.get("buffer") or {}).get("storage", "memory") != "memory"
    ]
    human = [
        s
        for s in exploring
        if ((s.get("tasks") or {}).get("train") or {}).get("workflow") == "human_feedback"
    ]
    chosen = (human or exploring)[-1:]
    return chosen[0].get("stage") if chosen else (run_stage_config(run_dir).get("stage") if stages else None)


def _fail(message: str) -> typer.Exit:
    typer.secho(message, fg=typer.colors.RED, err=True)
    return typer.Exit(2)


def _rows(run_dir: Path, status: str | None, stage: str | None) -> list[tuple[Any, str]]:
    from trine.buffer.inspect import STATUSES, read_rows

    if status is not None and status not in STATUSES:
        raise _fail(f"--status {status!r}; expected one of {', '.join(STATUSES)}")
    try:
        rows = read_rows(run_dir, status, stage)
    except (ValueError, FileNotFoundError) as err:
        raise _fail(str(err)) from None
    if rows is None:
        raise _fail(
            f"{run_dir} keeps its buffer in memory: annotations need a persistent buffer "
            "(buffer.storage: sql) so that answers can reach it."
        )
    return [(e, s) for e, s in rows if e.kind == "rollout" and s != "rolled_back"]


class _Texts:
    """Prompt and response text of experiences: ``info["response"]`` and the run's tokenizer (loaded
    only when needed)."""

    def __init__(self, run_dir: Path, stage: str | None) -> None:
        self.run_dir, self.stage = run_dir, stage
        self._tokenizer: Any = False

    def _load(self) -> Any:
        """The run's tokenizer (None when it has none that loads)."""
        if self._tokenizer is False:
            from trine.cli.buffer import _tokenizer

            self._tokenizer = _tokenizer(self.run_dir, self.stage)
        return self._tokenizer

    def _decode(self, tokens: list[int]) -> str | None:
        tokenizer = self._load()
        return None if tokenizer is None else tokenizer.decode(tokens)

    def prompt(self, e: Any) -> tuple[str, list[dict[str, str]] | None]:
        """The prompt as people read it, without chat-template markup, and its messages when it is a
        chat (:func:`trine.models.chat.readable_prompt`): they go to the item's ``meta["messages"]``."""
        from trine.models.chat import readable_prompt

        text = e.info.get("prompt")
        if isinstance(text, str):
            return text, None
        ids = e.tokens[: e.prompt_length]
        tokenizer = self._load()
        return (f"(token ids) {ids}", None) if tokenizer is None else readable_prompt(tokenizer, ids)

    def item(self, kind: str, e: Any, responses: list[dict[str, Any]], meta: dict[str, Any], **extra: Any):
        """An annotation item on ``e``'s prompt (its messages in ``meta["messages"]`` when a chat)."""
        from trine.feedback.queue import Item

        prompt, messages = self.prompt(e)
        return Item(
            kind, prompt, responses, meta={**meta, "messages": messages} if messages else meta, **extra
        )

    def response(self, e: Any) -> dict[str, Any]:
        text = e.info.get("response")
        if not isinstance(text, str):
            text = self._decode(e.response_tokens) or f"(token ids) {e.response_tokens}"
        return {"text": text, "experience_id": e.id, "tokens": e.response_tokens}


def _post(run_dir: Path, items: list, batch_size: int, timeout: float | None) -> None:
    from trine.feedback.queue import AnnotationQueue, queue_url

    queue = AnnotationQueue(queue_url(run_dir))
    try:
        for i in range(0, len(items), batch_size):
            queue.post(items[i : i + batch_size], timeout=timeout)
    finally:
        queue.close()
    batches = (len(items) + batch_size - 1) // batch_size
    typer.echo(f"posted {len(items)} items in {batches} batch(es) to {queue_url(run_dir)}")


def _posted(run_dir: Path, kind: str) -> set[str]:
    from trine.feedback.queue import ANNOTATIONS_FILE, AnnotationQueue, queue_url

    if not (run_dir / ANNOTATIONS_FILE).is_file():
        return set()
    queue = AnnotationQueue(queue_url(run_dir))
    try:
        return queue.experience_ids(kind)
    finally:
        queue.close()


@annotate_app.command()
def rate(
    run_dir: Path = RUN_DIR,
    status: str = typer.Option("pending", help="Experiences with this status (pending: their reward waits)."),
    limit: int = LIMIT,
    batch_size: int = BATCH,
    timeout: float = TIMEOUT,
    scale: tuple[float, float] = typer.Option(
        (0.0, 1.0), help="LO HI of a rating; the rating is the reward."
    ),
    stage: str = STAGE,
) -> None:
    """Post one rating item per experience (its rating becomes its reward when it is pending)."""
    if not scale[0] < scale[1]:
        raise _fail(f"--scale {scale[0]} {scale[1]}: expected LO < HI, e.g. --scale 0 1")
    seen = _posted(run_dir, "rate")
    texts = _Texts(run_dir, stage)
    items = []
    for e, _ in _rows(run_dir, status, stage):
        if e.id in seen or (limit is not None and len(items) >= limit):
            continue
        meta = {"task_id": e.task_id, "group_id": e.group_id}
        items.append(texts.item("rate", e, [texts.response(e)], meta, scale=scale))
    if not items:
        typer.echo(f"nothing to post: no {status or ''} experience in {run_dir} that is not posted already")
        return
    _post(run_dir, items, batch_size, timeout)


@annotate_app.command()
def pairs(
    run_dir: Path = RUN_DIR,
    status: str = typer.Option(None, help="Only experiences with this status (default: any)."),
    limit: int = LIMIT,
    batch_size: int = BATCH,
    timeout: float = TIMEOUT,
    stage: str = STAGE,
) -> None:
    """Post pair items: experiences of one group with different responses, two by two."""
    seen = _posted(run_dir, "pair")
    groups: dict[str, list[tuple[Any, str]]] = {}
    for e, s in _rows(run_dir, status, stage):
        if e.group_id and e.id not in seen:
            groups.setdefault(e.group_id, []).append((e, s))
    texts = _Texts(run_dir, stage)
    items: list = []
    for group_id, members in groups.items():
        distinct, responses = [], set()
        for e, s in members:
            key = tuple(e.response_tokens)
            if key not in responses:
                responses.add(key)
                distinct.append((e, s))
        for (a, sa), (b, sb) in zip(distinct[0::2], distinct[1::2]):
            if limit is not None and len(items) >= limit:
                break
            meta = {
                "task_id": a.task_id,
                "group_id": group_id,
                "prompt_tokens": a.tokens[: a.prompt_length],
                "await_rewards": sa == sb == "pending",  # else only the preference rows land
            }
            items.append(texts.item("pair", a, [texts.response(a), texts.response(b)], meta))
    if not items:
        typer.echo(f"nothing to post: no group in {run_dir} with two different responses not posted already")
        return
    _post(run_dir, items, batch_size, timeout)


@annotate_app.command()
def status(run_dir: Path = RUN_DIR) -> None:
    """Items by state (open, claimed, answered, expired, landed, ties, lost) and the batches."""
    from trine.feedback.queue import ANNOTATIONS_FILE, AnnotationQueue, queue_url

    if not (run_dir / ANNOTATIONS_FILE).is_file():
        raise _fail(
            f"{run_dir} has no annotation queue ({ANNOTATIONS_FILE}); post items with `trine annotate rate`"
        )
    queue = AnnotationQueue(queue_url(run_dir))
    try:
        queue.expire()
        counts, batches = queue.counts(), queue.batches()
    finally:
        queue.close()
    typer.echo("  ".join(f"{k}: {v}" for k, v in counts.items()))
    for b in batches:
        rest = ", ".join(f"{k} {b[k]}" for k in ("open", "claimed", "answered", "expired"))
        typer.echo(f"  {b['batch']}: {b['items']} items ({rest})")


@annotate_app.command("export")
def export(
    run_dir: Path = RUN_DIR, out: Path = typer.Argument(..., help="The Label Studio JSON file to write.")
) -> None:
    """Write the queue as Label Studio tasks (answers as annotations)."""
    from trine.feedback.labelstudio import export_tasks
    from trine.feedback.queue import AnnotationQueue, queue_url

    queue = AnnotationQueue(queue_url(run_dir))
    try:
        tasks = export_tasks(queue)
    finally:
        queue.close()
    out.write_text(json.dumps(tasks, indent=1))
    typer.echo(f"wrote {len(tasks)} Label Studio tasks to {out}")


@annotate_app.command("import")
def import_(
    run_dir: Path = RUN_DIR,
    source: Path = typer.Argument(..., help="A Label Studio JSON export (a list of tasks)."),
    timeout: float = TIMEOUT,
) -> None:
    """Read Label Studio tasks: answers for items of this queue, new items for the others; then land."""
    from trine.feedback.labelstudio import import_tasks
    from trine.feedback.queue import AnnotationQueue, queue_url

    try:
        tasks = json.loads(source.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise _fail(f"{source}: cannot read a JSON list of Label Studio tasks ({err})") from None
    queue = AnnotationQueue(queue_url(run_dir))
    try:
        result = import_tasks(queue, tasks, timeout=timeout)
    except ValueError as err:
        raise _fail(f"{source}: {err}") from None
    finally:
        queue.close()
    typer.echo(
        f"posted {result['posted']} new items, answered {result['answered']}, skipped {result['skipped']}"
    )
    for line in result["errors"][:20]:
        typer.echo(f"  skipped {line}")
    if result["answered"]:
        _report_landing(land_run(run_dir))


@annotate_app.command()
def land(run_dir: Path = RUN_DIR, stage: str = STAGE) -> None:
    """Write answered items into the run's buffer (rewards, preference rows)."""
    _report_landing(land_run(run_dir, stage))


def _report_landing(counts: dict[str, Any]) -> None:
    note = counts.pop("note", None)
    if counts:
        typer.echo("landed: " + "  ".join(f"{k}: {v}" for k, v in counts.items()))
    if note:
        typer.secho(note, fg=typer.colors.YELLOW, err=True)
