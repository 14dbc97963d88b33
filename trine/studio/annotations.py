"""The studio's Annotations API: a run's queue (:mod:`trine.feedback.queue`), answered by people.

The queue of run NAME is ``runs/NAME/annotations.db`` (:func:`trine.feedback.queue.queue_url`). Claims
and answers need an annotator token (``X-Annotator-Token``, from ``trine studio --annotator NAME``);
the answers of one request are kept all or nothing (409 naming every refused item). Kept answers land
at once in the run's buffer (ratings and pair choices as the delayed rewards of pending experiences)
and, for pairs, as preference rows in the table ``preferences`` of the run's SQL buffer database; a
background thread (:func:`install`) retries every few seconds the answers whose experiences were not
in the buffer yet. Export and import speak Label Studio's JSON (:mod:`trine.feedback.labelstudio`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Body, Depends, FastAPI, Header, HTTPException
from pydantic import BaseModel, Field

from trine.feedback import labelstudio
from trine.feedback.queue import ANNOTATIONS_FILE, AnnotationQueue, AnswerConflict, queue_url
from trine.studio.paths import run_path, run_problem
from trine.studio.settings import StudioSettings, studio

router = APIRouter()
log = logging.getLogger(__name__)
LAND_INTERVAL = 3.0
"""Seconds between the background lander's passes."""

_queues: dict[Path, AnnotationQueue] = {}
_queues_lock = threading.Lock()


def open_queue(run_dir: Path) -> AnnotationQueue:
    """The queue of the run in ``run_dir`` (one object per run and process, created on first use)."""
    key = run_dir.resolve()
    with _queues_lock:
        if key not in _queues:
            _queues[key] = AnnotationQueue(queue_url(key))
        return _queues[key]


def _existing_queue(settings: StudioSettings, name: str) -> AnnotationQueue | None:
    """The run's queue, or None when it has none yet (reading never creates one)."""
    path = run_path(settings.runs_dir, name)
    return open_queue(path) if (path / ANNOTATIONS_FILE).is_file() else None


def _annotator(settings: StudioSettings, token: str | None) -> str:
    name = settings.annotator(token)
    if name is None:
        why = "no X-Annotator-Token header" if not token else "an unknown X-Annotator-Token"
        raise HTTPException(
            401, f"{why}: annotators send the token `trine studio --annotator NAME` printed for them"
        )
    return name


def land_run(run_dir: Path) -> dict[str, Any]:
    """Land the answered items of the run in ``run_dir`` (:func:`trine.cli.annotate.land_run`, shared
    with ``trine annotate land``; only into a SQL buffer, as the run may be running)."""
    from trine.cli.annotate import land_run as land_answers

    return land_answers(run_dir, live=True)


class ClaimBody(BaseModel):
    n: int = Field(5, ge=1, le=200, description="How many items to claim.")
    lease: float = Field(600.0, gt=0, le=86400, description="Seconds the claim holds.")


class AnswerBody(BaseModel):
    answers: list[dict[str, Any]] = Field(description='[{"item", "choice"} | {"item", "rating"}]')


@router.get("/annotator")
def annotator(
    settings: StudioSettings = Depends(studio), x_annotator_token: str | None = Header(None)
) -> dict:
    """Who the annotator token belongs to."""
    return {"name": _annotator(settings, x_annotator_token)}


@router.get("/runs/{name}/annotations")
def overview(name: str, settings: StudioSettings = Depends(studio)) -> dict:
    """Counts, batches and the most recent items of the run's queue."""
    queue = _existing_queue(settings, name)
    if queue is None:
        counts = dict.fromkeys(("open", "claimed", "answered", "expired", "landed", "ties", "lost"), 0)
        return {"counts": counts, "batches": [], "recent": []}
    queue.expire()
    recent = [item.summary() for item in queue.items(limit=20, newest_first=True)]
    return {"counts": queue.counts(), "batches": queue.batches(), "recent": recent}


@router.post("/runs/{name}/annotations/claim")
def claim(
    name: str,
    body: ClaimBody,
    settings: StudioSettings = Depends(studio),
    x_annotator_token: str | None = Header(None),
) -> dict:
    """Claim up to ``n`` items (the annotator's own unanswered claims first)."""
    who = _annotator(settings, x_annotator_token)
    queue = _existing_queue(settings, name)
    if queue is None:
        return {"annotator": who, "items": []}
    queue.expire()
    items = queue.claim(who, body.n, lease=body.lease)
    return {
        "annotator": who,
        "items": [{**i.summary(), "claimed_until": i.claimed_until} for i in items],
    }


def _answers(body: AnswerBody) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for entry in body.answers:
        item = entry.get("item")
        if not isinstance(item, str):
            raise HTTPException(
                400, f"answer {entry!r} has no 'item' id; send {{'item': id, 'choice'|'rating': ...}}"
            )
        if item in out:
            raise HTTPException(
                400, f"item {item!r} is answered twice in one request; send one answer per item"
            )
        out[item] = {k: v for k, v in entry.items() if k != "item"}
    return out


@router.post("/runs/{name}/annotations/answer")
def answer(
    name: str,
    body: AnswerBody,
    settings: StudioSettings = Depends(studio),
    x_annotator_token: str | None = Header(None),
) -> dict:
    """Keep the answers (all or nothing; 409 names every refused item) and land them at once."""
    who = _annotator(settings, x_annotator_token)
    answers = _answers(body)
    queue = _existing_queue(settings, name)
    if queue is None:
        raise HTTPException(
            404, f"run {name!r} has no annotation queue ({ANNOTATIONS_FILE}); nothing to answer"
        )
    try:
        kept = queue.answer(who, answers)
    except AnswerConflict as conflict:
        items = [{"item": i, "why": w} for i, w in conflict.why.items()]
        raise HTTPException(409, {"message": str(conflict), "items": items}) from None
    counts = land_run(run_path(settings.runs_dir, name))
    # these items landed now (here, or by the background lander meanwhile)
    now = queue.items(ids=[i.id for i in kept], limit=len(kept))
    out = {"answered": len(kept), "landed": sum(i.landed_at is not None and i.note is None for i in now)}
    return out | ({"note": counts["note"]} if "note" in counts else {})


@router.get("/runs/{name}/annotations/export")
def export(name: str, settings: StudioSettings = Depends(studio)) -> list[dict]:
    """Every item of the run's queue as Label Studio tasks (answers as annotations)."""
    queue = _existing_queue(settings, name)
    return [] if queue is None else labelstudio.export_tasks(queue)


@router.post("/runs/{name}/annotations/import")
def import_(
    name: str, tasks: list[dict[str, Any]] = Body(...), settings: StudioSettings = Depends(studio)
) -> dict:
    """Label Studio tasks: answers for known items, new items for the others; then land."""
    path = run_path(settings.runs_dir, name)
    try:
        result = labelstudio.import_tasks(open_queue(path), tasks)
    except ValueError as err:
        raise HTTPException(400, str(err)) from None
    if result["answered"]:
        result["landed"] = land_run(path)
    return result


class Lander:
    """A daemon thread that lands the answered items of every run with a queue every ``interval``
    seconds (answers whose experiences reached the buffer after the answer)."""

    def __init__(self, runs_dir: Path, interval: float | None = None) -> None:
        self.runs_dir = Path(runs_dir)
        self.interval = LAND_INTERVAL if interval is None else interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trine-studio-lander", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def pass_once(self) -> int:
        """Land what is waiting in every run; returns how many items landed."""
        landed = 0
        for db in sorted(self.runs_dir.glob(f"*/{ANNOTATIONS_FILE}")):
            if run_problem(self.runs_dir, db.parent) is not None:
                continue  # a run linked from outside, or holding links out: not read, not written
            try:
                if open_queue(db.parent).unlanded():
                    counts = land_run(db.parent)
                    landed += counts.get("rated", 0) + counts.get("pairs", 0)
            except Exception:  # one bad run must not stop the others: log and go on
                log.exception("landing the annotations of %s failed", db.parent)
        return landed

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.pass_once()


def install(app: FastAPI) -> None:
    """Run a :class:`Lander` over the studio's runs while ``app`` serves (wraps its lifespan)."""
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(the_app: Any):
        lander = Lander(the_app.state.studio.runs_dir)
        lander.start()
        try:
            async with inner(the_app) as state:
                yield state
        finally:
            lander.stop()

    app.router.lifespan_context = lifespan
