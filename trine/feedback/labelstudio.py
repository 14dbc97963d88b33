"""Label Studio's JSON task format: export the queue for teams that annotate there, import their work.

Export (:func:`export_tasks`) writes one Label Studio task per item::

    {"id": 1,
     "data": {"prompt": ..., "response_a": ..., "response_b": ...}     # pair  ("response" for rate)
     "meta": {"trine_item": "ann-...", "kind": "pair", "scale": null, "max_rating": 5},
     "annotations": [{"result": [{"from_name": "preference", "to_name": "response_a,response_b",
                                  "type": "pairwise", "value": {"selected": "left"}}],
                      "completed_by": "alice", "was_cancelled": false, "ground_truth": false}]}

The ``annotations`` list holds the item's answer (if any) as Label Studio results: a pair is a
``pairwise`` result (``left`` = response a, ``right`` = b; a tie is a ``choices`` result ``["tie"]``
of the ``tie`` control), a rating a ``rating`` result (stars 1..``max_rating`` mapped linearly onto the
item's scale: ``lo + (stars - 1) / (max_rating - 1) * (hi - lo)``). Label Studio itself exports the
same shape (its ``completed_by`` is a user id or a user object).

Import (:func:`import_tasks`) reads such a list: tasks whose ``meta`` names a ``trine_item`` of the
queue answer that item (as the annotator ``completed_by`` names, else ``"labelstudio"``); the others
become new items, keeping the ``trine_item`` id of a task exported from another queue
(``response_a``/``response_b`` -> pair, ``response`` -> rate), answered too when they carry an
annotation. A ``number`` result (``{"number": x}``) is taken as an exact rating.

The labeling configurations to paste into a Label Studio project are :data:`PAIR_CONFIG` and
:data:`RATE_CONFIG`.
"""

from __future__ import annotations

from typing import Any

from trine.feedback.queue import DEFAULT_SCALE, AnnotationQueue, AnswerConflict, Item

MAX_RATING = 5
ANNOTATOR = "labelstudio"

PAIR_CONFIG = """<View>
  <Header value="Which response answers the prompt better?"/>
  <Text name="prompt" value="$prompt"/>
  <Pairwise name="preference" toName="response_a,response_b" leftClass="a" rightClass="b"/>
  <Text name="response_a" value="$response_a"/>
  <Text name="response_b" value="$response_b"/>
  <Choices name="tie" toName="prompt" showInline="true">
    <Choice value="tie"/>
  </Choices>
</View>"""
"""Label Studio labeling config for pair items (``Pairwise``; tick ``tie`` for a tie)."""

RATE_CONFIG = f"""<View>
  <Header value="Rate the response"/>
  <Text name="prompt" value="$prompt"/>
  <Text name="response" value="$response"/>
  <Rating name="rating" toName="response" maxRating="{MAX_RATING}"/>
</View>"""
"""Label Studio labeling config for rate items (``Rating``, 1..5 stars)."""


def export_tasks(
    queue: AnnotationQueue, *, max_rating: int = MAX_RATING, limit: int = 1_000_000
) -> list[dict]:
    """Every item of ``queue`` (oldest first) as a Label Studio task, answers as annotations."""
    return [to_task(item, i, max_rating) for i, item in enumerate(queue.items(limit=limit), start=1)]


def to_task(item: Item, task_id: int, max_rating: int = MAX_RATING) -> dict[str, Any]:
    """One item as a Label Studio task (see the module doc)."""
    if item.kind == "pair":
        data = {
            "prompt": item.prompt,
            "response_a": item.responses[0]["text"],
            "response_b": item.responses[1]["text"],
        }
    else:
        data = {"prompt": item.prompt, "response": item.responses[0]["text"]}
    meta = {
        "trine_item": item.id,
        "kind": item.kind,
        "status": item.status,
        "scale": list(item.scale) if item.scale else None,
        "max_rating": max_rating,
    }
    annotations = []
    if item.answer is not None:
        annotations.append(
            {
                "id": task_id,
                "result": [_result(item, max_rating)],
                "completed_by": item.annotator,
                "was_cancelled": False,
                "ground_truth": False,
                "task": task_id,
            }
        )
    return {"id": task_id, "data": data, "meta": meta, "annotations": annotations}


def _result(item: Item, max_rating: int) -> dict[str, Any]:
    answer = item.answer or {}
    if item.kind == "pair":
        if answer["choice"] == "tie":
            return {"from_name": "tie", "to_name": "prompt", "type": "choices", "value": {"choices": ["tie"]}}
        selected = "left" if answer["choice"] == "a" else "right"
        value = {"selected": selected}
        return {
            "from_name": "preference",
            "to_name": "response_a,response_b",
            "type": "pairwise",
            "value": value,
        }
    lo, hi = item.scale or DEFAULT_SCALE
    stars = round(1 + (answer["rating"] - lo) / (hi - lo) * (max_rating - 1))
    return {"from_name": "rating", "to_name": "response", "type": "rating", "value": {"rating": stars}}


def answer_of(task: dict[str, Any], kind: str, scale: tuple[float, float] | None) -> tuple[str, dict] | None:
    """(annotator, answer) from a task's last annotation that is not cancelled and has a usable result;
    None when it has none. Raises ValueError naming the task when a result cannot be read."""
    max_rating = int((task.get("meta") or {}).get("max_rating") or MAX_RATING)
    for annotation in reversed(task.get("annotations") or []):
        if annotation.get("was_cancelled"):
            continue
        answer = _answer_from_results(annotation.get("result") or [], kind, scale, max_rating)
        if answer is not None:
            return _annotator(annotation.get("completed_by")), answer
    return None


def _answer_from_results(results: list[dict], kind: str, scale: Any, max_rating: int) -> dict | None:
    by_type = {r.get("type"): r.get("value") or {} for r in results}
    if kind == "pair":
        if any(
            "tie" in [str(c).lower() for c in v.get("choices", [])]
            for t, v in by_type.items()
            if t == "choices"
        ):
            return {"choice": "tie"}
        selected = by_type.get("pairwise", {}).get("selected")
        if selected is None:
            return None
        if selected not in ("left", "right"):
            raise ValueError(f"pairwise result selected={selected!r}; expected 'left' or 'right'")
        return {"choice": "a" if selected == "left" else "b"}
    if "number" in by_type:
        return {"rating": float(by_type["number"]["number"])}
    if "rating" not in by_type:
        return None
    lo, hi = scale or DEFAULT_SCALE
    stars = float(by_type["rating"]["rating"])
    return {"rating": lo + (stars - 1) / (max_rating - 1) * (hi - lo)}


def _annotator(completed_by: Any) -> str:
    """A name for Label Studio's ``completed_by``: a user object's email/username, a name, or a user id."""
    if isinstance(completed_by, dict):
        completed_by = completed_by.get("email") or completed_by.get("username") or completed_by.get("id")
    if isinstance(completed_by, str) and completed_by:
        return completed_by
    if isinstance(completed_by, int):
        return f"{ANNOTATOR}-{completed_by}"
    return ANNOTATOR


def _new_item(task: dict[str, Any], index: int, item_id: str | None = None) -> Item:
    data = task.get("data") or {}
    prompt = str(data.get("prompt", ""))
    meta = {"labelstudio_task": task.get("id")}
    ids = {} if item_id is None else {"id": str(item_id)}
    if "response_a" in data and "response_b" in data:
        responses = [{"text": str(data["response_a"])}, {"text": str(data["response_b"])}]
        return Item("pair", prompt, responses, meta=meta, **ids)
    if "response" in data:
        scale = (task.get("meta") or {}).get("scale")
        scale = tuple(scale) if scale else None
        return Item("rate", prompt, [{"text": str(data["response"])}], scale=scale, meta=meta, **ids)
    raise ValueError(
        f"Label Studio task #{index} (id {task.get('id')!r}) has data keys {sorted(data)}; expected "
        "'prompt' with 'response_a' and 'response_b' (a pair) or 'response' (a rating)."
    )


def import_tasks(
    queue: AnnotationQueue, tasks: list[dict[str, Any]], *, timeout: float | None = None
) -> dict:
    """Read Label Studio tasks into ``queue`` (see the module doc).

    Returns ``posted`` (new items), ``answered``, ``skipped`` (answers not kept: the item was answered,
    expired or claimed by someone else) and ``errors`` (``"item: why"`` for each skipped answer).
    Raises ValueError naming the first task that is not a Label Studio task.
    """
    if not isinstance(tasks, list):
        raise ValueError(f"Label Studio import: expected a JSON list of tasks, got {type(tasks).__name__}.")
    known = {i.id: i for i in queue.items(limit=1_000_000)}
    new: list[Item] = []
    answers: dict[str, dict[str, dict]] = {}  # annotator -> {item id: answer}
    for index, task in enumerate(tasks, start=1):
        if not isinstance(task, dict):
            raise ValueError(f"Label Studio task #{index} is {type(task).__name__}; expected an object.")
        item_id = (task.get("meta") or {}).get("trine_item")
        if item_id in known:
            item = known[item_id]
        else:  # a task made in Label Studio, or exported from another queue (its item id is kept)
            item = _new_item(task, index, item_id)
            known[item.id] = item
            new.append(item)
        try:
            got = answer_of(task, item.kind, item.scale or (DEFAULT_SCALE if item.kind == "rate" else None))
        except ValueError as err:
            raise ValueError(f"Label Studio task #{index} (id {task.get('id')!r}): {err}") from None
        if got is not None and item.answer is None:
            answers.setdefault(got[0], {})[item.id] = got[1]
    if new:
        queue.post(new, timeout=timeout)
    answered, errors = 0, []
    for annotator, given in answers.items():
        done, why = _answer_as(queue, annotator, given)
        answered += done
        errors += why
    return {"posted": len(new), "answered": answered, "skipped": len(errors), "errors": errors}


def _answer_as(queue: AnnotationQueue, annotator: str, given: dict[str, dict]) -> tuple[int, list[str]]:
    """Claim and answer ``given`` as ``annotator``; answers that cannot be kept are left out (and said)."""
    claimed = {i.id for i in queue.claim_items(annotator, list(given))}
    errors = [
        f"{i}: not open for {annotator} (answered, expired or claimed)" for i in given if i not in claimed
    ]
    todo = {i: a for i, a in given.items() if i in claimed}
    while todo:
        try:
            return len(queue.answer(annotator, todo)), errors
        except AnswerConflict as conflict:
            errors += [f"{i}: {w}" for i, w in conflict.why.items()]
            todo = {i: a for i, a in todo.items() if i not in conflict.why}
    return 0, errors
