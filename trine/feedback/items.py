"""The nouns of the annotation queue: :class:`Item`, the checks of items and answers, the table layout.

:mod:`trine.feedback.queue` stores them; they are plain data (JSON-able) so a workflow can build items
and the studio can send them to a browser.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from trine.types import new_id

KINDS = ("rate", "pair")
OPEN, CLAIMED, ANSWERED, EXPIRED = "open", "claimed", "answered", "expired"
STATUSES = (OPEN, CLAIMED, ANSWERED, EXPIRED)
CHOICES = ("a", "b", "tie")
DEFAULT_SCALE = (0.0, 1.0)


@dataclass
class Item:
    """One question for a person: rate one response, or compare two."""

    kind: str
    """"rate" (one response, a number in ``scale``) or "pair" (two responses: a, b or tie)."""
    prompt: str
    """The prompt text shown to people: plain text, never chat-template markup (a chat rendered by
    :func:`trine.models.chat.chat_text`; its messages go to ``meta["messages"]``)."""
    responses: list[dict[str, Any]]
    """``[{"text": str, "experience_id": str | None, "tokens": list[int] | None}]`` (1 or 2)."""
    scale: tuple[float, float] | None = None
    """rate: (lo, hi); the answer must lie in it and becomes the reward (default (0, 1))."""
    meta: dict[str, Any] = field(default_factory=dict)
    """task_id, group_id, prompt_tokens (pairs -> preference rows), messages (the prompt's conversation,
    ``[{"role", "content"}]``: the studio shows these, role by role, rather than ``prompt``), ..."""
    id: str = field(default_factory=lambda: new_id("ann-"))
    batch: str | None = None
    status: str = OPEN
    annotator: str | None = None
    answer: dict[str, Any] | None = None
    created_at: float | None = None
    expires_at: float | None = None
    claimed_until: float | None = None
    answered_at: float | None = None
    landed_at: float | None = None
    note: str | None = None
    """Why the item was landed without effect ("tie", "lost", "nothing to land"); None otherwise."""
    progress: dict[str, Any] = field(default_factory=dict)
    """What landing has done so far (``filled``: experience ids rewarded, ``preferences``: rows put)."""

    def summary(self) -> dict[str, Any]:
        """The item as the studio shows it (no token ids)."""
        return {
            "id": self.id,
            "kind": self.kind,
            "prompt": self.prompt,
            "messages": self.meta.get("messages"),
            "responses": [{"text": r.get("text", "")} for r in self.responses],
            "scale": list(self.scale) if self.scale else None,
            "batch": self.batch,
            "status": self.status,
            "annotator": self.annotator,
            "answer": self.answer,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "answered_at": self.answered_at,
            "landed_at": self.landed_at,
            "note": self.note,
        }


class AnswerConflict(ValueError):
    """Some answers could not be kept (so none were); ``why`` says, per item id, what was wrong."""

    def __init__(self, why: dict[str, str]) -> None:
        self.why = dict(why)
        self.items = list(why)
        lines = "; ".join(f"{i}: {w}" for i, w in why.items())
        super().__init__(f"{len(why)} answer(s) refused, nothing was kept: {lines}")


def check_item(item: Item) -> Item:
    """Raise ValueError naming what is wrong with ``item``; fill defaults (rate scale, response keys)."""
    where = f"annotation item {item.id}"
    if item.kind not in KINDS:
        raise ValueError(f"{where}: kind={item.kind!r}; expected one of {KINDS}.")
    want = 1 if item.kind == "rate" else 2
    if not isinstance(item.responses, list) or len(item.responses) != want:
        raise ValueError(
            f"{where}: a {item.kind!r} item needs exactly {want} response(s), got {item.responses!r}."
        )
    for r in item.responses:
        if not isinstance(r, dict) or not isinstance(r.get("text"), str):
            raise ValueError(f"{where}: each response is a dict with a 'text' string, got {r!r}.")
        r.setdefault("experience_id", None)
        r.setdefault("tokens", None)
    if item.kind == "rate" and item.scale is None:
        item.scale = DEFAULT_SCALE
    if item.scale is not None:
        lo, hi = (float(x) for x in item.scale)
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"{where}: scale={item.scale!r}; expected (lo, hi) with lo < hi.")
        item.scale = (lo, hi)
    if not isinstance(item.prompt, str):
        raise ValueError(f"{where}: prompt must be text, got {type(item.prompt).__name__}.")
    messages = item.meta.get("messages")
    if messages is not None and not (
        isinstance(messages, list)
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        )
    ):
        raise ValueError(
            f"{where}: meta['messages'] must be a list of {{'role': str, 'content': str}} (the prompt's "
            f"conversation), got {messages!r}; leave it out for a prompt that is not a chat."
        )
    return item


def check_answer(item: Item, answer: Any) -> tuple[dict[str, Any] | None, str | None]:
    """(the answer normalized, None) when ``answer`` is valid for ``item``'s kind, else (None, why)."""
    if not isinstance(answer, dict):
        return None, f"answer {answer!r} is not an object"
    if item.kind == "pair":
        choice = answer.get("choice")
        if choice not in CHOICES:
            return None, f"choice={choice!r}; a pair item takes 'choice': one of {list(CHOICES)}"
        return {"choice": choice}, None
    rating = answer.get("rating")
    lo, hi = item.scale or DEFAULT_SCALE
    if isinstance(rating, bool) or not isinstance(rating, (int, float)) or not math.isfinite(rating):
        return None, f"rating={rating!r}; a rate item takes 'rating': a number in [{lo}, {hi}]"
    if not lo <= rating <= hi:
        return None, f"rating={rating} is outside the item's scale [{lo}, {hi}]"
    return {"rating": float(rating)}, None


def build_table(metadata: sa.MetaData, name: str) -> sa.Table:
    seq_type = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
    return sa.Table(
        name,
        metadata,
        sa.Column("seq", seq_type, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(), nullable=False, unique=True),
        sa.Column("batch", sa.String(), index=True),
        sa.Column("kind", sa.String(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("responses", sa.Text(), nullable=False),
        sa.Column("scale_lo", sa.Float()),
        sa.Column("scale_hi", sa.Float()),
        sa.Column("meta", sa.Text(), nullable=False),
        sa.Column("status", sa.String(), nullable=False, index=True),
        sa.Column("annotator", sa.String()),
        sa.Column("answer", sa.Text()),
        sa.Column("choice", sa.String()),
        sa.Column("rating", sa.Float()),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.Float()),
        sa.Column("claimed_until", sa.Float()),
        sa.Column("answered_at", sa.Float()),
        sa.Column("landed_at", sa.Float()),
        sa.Column("note", sa.String()),
        sa.Column("progress", sa.Text()),
    )


def item_row(item: Item) -> dict[str, Any]:
    lo, hi = item.scale if item.scale else (None, None)
    answer = item.answer or {}
    return {
        "id": item.id, "batch": item.batch, "kind": item.kind, "prompt": item.prompt,
        "responses": json.dumps(item.responses), "scale_lo": lo, "scale_hi": hi,
        "meta": json.dumps(item.meta), "status": item.status, "annotator": item.annotator,
        "answer": None if item.answer is None else json.dumps(item.answer),
        "choice": answer.get("choice"), "rating": answer.get("rating"),
        "created_at": item.created_at, "expires_at": item.expires_at, "claimed_until": item.claimed_until,
        "answered_at": item.answered_at, "landed_at": item.landed_at, "note": item.note,
        "progress": json.dumps(item.progress),
    }  # fmt: skip


def row_item(row: Any) -> Item:
    return Item(
        kind=row.kind,
        prompt=row.prompt,
        responses=json.loads(row.responses),
        scale=None if row.scale_lo is None else (row.scale_lo, row.scale_hi),
        meta=json.loads(row.meta),
        id=row.id,
        batch=row.batch,
        status=row.status,
        annotator=row.annotator,
        answer=None if row.answer is None else json.loads(row.answer),
        created_at=row.created_at,
        expires_at=row.expires_at,
        claimed_until=row.claimed_until,
        answered_at=row.answered_at,
        landed_at=row.landed_at,
        note=row.note,
        progress=json.loads(row.progress) if row.progress else {},
    )
