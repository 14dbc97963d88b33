"""Answers reach the buffer: ratings as delayed rewards, pair choices as rewards and preference rows.

:func:`land` goes through the queue's answered items that have not landed yet:

- ``rate``: ``buffer.set_rewards({experience_id: rating})``; the pending experience becomes trainable.
  An experience not in the buffer yet (a workflow posts its items before the explorer puts the
  experiences) keeps the item waiting; it is retried on the next call, and marked landed with note
  ``"lost"`` once its deadline passed (``expires_at``, and at least ``grace`` seconds after the answer).
- ``pair``: the chosen response's experience gets the reward ``scale[1]`` (1.0 without a scale) and
  the rejected one ``scale[0]`` (0.0) when they are pending (as for ``rate``, the item waits for them
  unless ``meta["await_rewards"]`` is False: experiences already rewarded get only the preference
  rows), and two preference Experiences go into ``preferences`` (kind ``"preference"``, group
  ``pair:<item id>``, ids ``<item id>-chosen`` / ``-rejected``, tokens = ``meta["prompt_tokens"]`` +
  the response's tokens): the rows a DPO stage trains on. A tie lands nothing (counted, note ``"tie"``).

Idempotent: what an item's landing has done is recorded in its ``progress`` and the item is then
marked landed, so a second call never fills or puts twice; a preference pair found already stored
(another process landed it) is taken as put.
"""

from __future__ import annotations

import threading
from typing import Any

from trine.feedback.queue import AnnotationQueue, Item
from trine.types import Experience

OUTCOMES = ("rated", "pairs", "preferences", "ties", "waiting", "lost", "skipped")
_LOCK = threading.Lock()  # one lander at a time in a process (the studio's thread and its requests)


def deadline(item: Item, grace: float) -> float:
    """When an answered item whose experiences never arrived is given up as lost."""
    answered = item.answered_at or 0.0
    return max(item.expires_at or answered, answered + grace)


def land(
    queue: AnnotationQueue, buffer: Any, preferences: Any = None, *, grace: float = 60.0
) -> dict[str, int]:
    """Land every answered, unlanded item of ``queue`` (see the module doc); counts by outcome.

    ``buffer``: the run's buffer (anything with ``set_rewards``; None: no rewards are set, and ratings
    stay unlanded for a later call that gives one).
    ``preferences``: a buffer for the preference rows of pairs (None: no rows, the rewards only).
    Returns ``rated``, ``pairs`` (landed), ``preferences`` (rows put), ``ties``, ``waiting`` (for
    their experiences), ``lost``, ``skipped`` (nothing to land: no experience and no rows; or no buffer).
    """
    counts = dict.fromkeys(OUTCOMES, 0)
    with _LOCK:
        now = queue.clock()
        for item in queue.unlanded():
            if item.kind == "rate":
                outcome = _land_rating(queue, item, buffer, now, grace)
            else:
                outcome, put = _land_pair(queue, item, buffer, preferences, now, grace)
                counts["preferences"] += put
            counts[outcome] += 1
    return counts


def _land_rating(queue: AnnotationQueue, item: Item, buffer: Any, now: float, grace: float) -> str:
    exp_id = item.responses[0].get("experience_id")
    if buffer is None:  # no buffer given this time: leave it for a call that has one
        return "skipped"
    if not exp_id:
        queue.mark_landed([item.id], note="nothing to land")
        return "skipped"
    if buffer.set_rewards({exp_id: float(item.answer["rating"])}):
        queue.mark_landed([item.id])
        return "rated"
    return _wait_or_lose(queue, item, now, grace)


def _wait_or_lose(queue: AnnotationQueue, item: Item, now: float, grace: float) -> str:
    if now >= deadline(item, grace):
        queue.mark_landed([item.id], note="lost")
        return "lost"
    return "waiting"


def _land_pair(
    queue: AnnotationQueue, item: Item, buffer: Any, preferences: Any, now: float, grace: float
) -> tuple[str, int]:
    choice = item.answer["choice"]
    if choice == "tie":
        queue.mark_landed([item.id], note="tie")
        return "ties", 0
    progress = dict(item.progress)
    put = 0
    if preferences is not None and not progress.get("preferences"):
        rows = preference_rows(item)
        if rows:
            put = _put_pair(preferences, rows)
        progress["preferences"] = bool(rows) or "no tokens"
    lo, hi = item.scale or (0.0, 1.0)
    chosen, rejected = (0, 1) if choice == "a" else (1, 0)
    wanted = {
        item.responses[i]["experience_id"]: reward
        for i, reward in ((chosen, hi), (rejected, lo))
        if item.responses[i].get("experience_id")
    }
    filled = list(progress.get("filled", []))
    if buffer is not None:
        for exp_id, reward in wanted.items():
            if exp_id not in filled and buffer.set_rewards({exp_id: reward}):
                filled.append(exp_id)
    progress["filled"] = filled
    if progress != item.progress:
        queue.set_progress(item.id, progress)
    rows_done = progress.get("preferences") is True
    if not wanted and not rows_done:
        queue.mark_landed([item.id], note="nothing to land")
        return "skipped", put
    awaiting = item.meta.get("await_rewards", True) and buffer is not None
    if set(wanted) <= set(filled) or not awaiting:
        queue.mark_landed([item.id])
        return "pairs", put
    if rows_done and now >= deadline(item, grace):  # the rows landed; the rewards never could
        queue.mark_landed([item.id])
        return "pairs", put
    return _wait_or_lose(queue, item, now, grace), put


def preference_rows(item: Item) -> list[Experience]:
    """The (chosen, rejected) preference Experiences of an answered pair item; [] without token ids
    (``meta["prompt_tokens"]`` and each response's ``tokens``) or for a tie."""
    prompt = item.meta.get("prompt_tokens")
    choice = (item.answer or {}).get("choice")
    if prompt is None or choice not in ("a", "b") or any(r.get("tokens") is None for r in item.responses):
        return []
    order = (0, 1) if choice == "a" else (1, 0)
    rows = []
    for index, chosen in zip(order, (True, False), strict=True):
        response = [int(t) for t in item.responses[index]["tokens"]]
        rows.append(
            Experience(
                tokens=[int(t) for t in prompt] + response,
                prompt_length=len(prompt),
                action_mask=[1] * len(response),
                reward=0.0,
                kind="preference",
                task_id=str(item.meta.get("task_id", "")),
                group_id=f"pair:{item.id}",
                info={
                    "chosen": chosen,
                    "annotator": item.annotator,
                    "item": item.id,
                    "response": item.responses[index].get("text", ""),
                    "experience_id": item.responses[index].get("experience_id"),
                },
                id=f"{item.id}-{'chosen' if chosen else 'rejected'}",
            )
        )
    return rows


def _put_pair(preferences: Any, rows: list[Experience]) -> int:
    """Put one pair's two rows together (one transaction); 0 when they are stored already."""
    try:
        preferences.put(rows)
    except ValueError as err:
        if "already stored" not in str(err):
            raise
        return 0
    return len(rows)
