"""Train/eval overlap: exact and n-gram matches between two tasksets (a contamination check).

An evaluation row that also sits in the training data measures memory, not skill. For each eval row this
module finds (:func:`compare`):

- **exact match**: the first training row whose *normalized* text equals the eval row's;
- **n-gram overlap**: the share of the eval row's word n-grams (default ``n = 13``) that occur in some
  training row, and the word spans they cover;
- **answer match**, reported separately: a training row with the same normalized answer (short answers such
  as numbers repeat by chance, so this alone never marks a row), and whether the matched training row's
  answer is the eval row's (a full duplicate).

A row is **contaminated** when it matches exactly or its n-gram share is ``>= threshold`` (default 0.5).

**Normalization** (:func:`normalize`): Unicode NFKC, lowercase, punctuation and symbols (Unicode
categories P and S) replaced by spaces, except the operators ``+ - * / = < > ^ %``, which stay as words of
their own (``3+4=`` and ``3*4=`` must not become the same problem), then whitespace collapsed. Words are
the space-separated pieces.

**N-grams** follow the contamination studies of GPT-3 (Brown et al., 2020, "Language Models are Few-Shot
Learners", Appendix C: an eval example is "dirty" on any 13-gram collision with the training data, after
lowercasing and stripping punctuation) and Llama 2 (Touvron et al., 2023, "Llama 2: Open Foundation and
Fine-Tuned Chat Models", Appendix A.6: a sample is judged by the share of it covered by n-grams shared
with the training data, not by a single collision). Here:

- ``n = 13`` words by default; a row with fewer than ``n`` words (``3+4=``) is one n-gram of its whole
  text, so it can only match a training row that is equally short and identical (exact match, in effect);
  the report counts such rows (``short_rows``);
- n-grams that occur in more than ``common`` training rows (default 10) are **boilerplate** (a shared
  prompt template, instructions) and left out of the share, numerator and denominator; a row made only of
  boilerplate has share 0. This cut-off is ours, not the papers': their training data is web text, where
  a task's template does not repeat in every document as it does in a taskset. ``common = 0`` counts every
  n-gram. A near-duplicate repeated more than ``common`` times in training is missed by the n-gram share
  (an exact duplicate is still caught);
- n-grams are hashed (Python's ``hash`` of the word tuple: one process, no collisions in practice). Only
  the eval side is indexed; the training rows stream past it, so memory grows with the eval set.

Cost, measured on a shared 2-core CPU (one core used): 100,000 training rows x 10,000 eval rows of 60
words each, ``n = 13``: 2.2 s (about 20 us per row: normalizing, hashing its n-grams, one set
intersection). Reading the rows from disk into tasks usually costs more than comparing them.
"""

from __future__ import annotations

import json
import sys
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cache
from typing import Any

from trine.types import Task

DEFAULT_N = 13
"""Words per n-gram (GPT-3's and most contamination studies' choice)."""
DEFAULT_THRESHOLD = 0.5
"""Share of an eval row's n-grams found in training from which the row counts as contaminated."""
DEFAULT_COMMON = 10
"""N-grams in more than this many training rows are boilerplate (a shared template) and ignored (0: none)."""
OPERATORS = "+-*/=<>^%"
"""Characters kept as words of their own by :func:`normalize` (math must keep its operators)."""
HISTOGRAM_BINS = (0.2, 0.4, 0.6, 0.8, 1.0)
"""Upper edges of :meth:`OverlapReport.histogram`'s bins besides ``0`` and ``1``."""


@cache
def _table() -> dict[int, str]:
    """``str.translate`` table: every punctuation or symbol character (Unicode categories P and S) to a
    space, the :data:`OPERATORS` to themselves between spaces; built once (~0.1 s)."""
    table = {}
    for cp in range(sys.maxunicode + 1):
        char = chr(cp)
        if unicodedata.category(char)[0] in "PS":
            table[cp] = f" {char} " if char in OPERATORS else " "
    return table


def normalize(text: str) -> str:
    """``text`` as compared: NFKC, lowercase, punctuation and symbols dropped (operators kept as words),
    whitespace collapsed to single spaces (see the module docstring)."""
    text = unicodedata.normalize("NFKC", text).lower().translate(_table())
    return " ".join(text.split())


def ngrams(words: Sequence[str], n: int) -> list[int]:
    """Hashes of the word n-grams of ``words`` in order (one per start position); a row of fewer than
    ``n`` words (but at least one) is a single n-gram of all its words."""
    if not words:
        return []
    if len(words) < n:
        return [hash(tuple(words))]
    return list(map(hash, zip(*(words[k:] for k in range(n)))))


@dataclass
class RowOverlap:
    """What one eval row shares with the training rows."""

    index: int
    """Position of the eval row in its taskset."""
    words: int
    """Words of its normalized text."""
    exact: int | None
    """Index of the first training row with the same normalized text, or None."""
    fraction: float
    """Share of its n-grams (boilerplate left out) that occur in some training row."""
    ngrams: int
    """Its n-grams counted in the share (boilerplate left out)."""
    train_row: int | None
    """The training row it matches exactly, else the one sharing the most of its n-grams (or None)."""
    spans: list[tuple[int, int]] = field(default_factory=list)
    """Word ranges ``[start, end)`` of its normalized text covered by shared n-grams."""
    answer_match: int | None = None
    """Index of the first training row with the same normalized answer (None: none, or no answers)."""
    same_answer: bool | None = None
    """Whether ``train_row``'s answer equals its own (None: no ``train_row`` or no answers)."""
    contaminated: bool = False
    """Exact match, or ``fraction >= threshold``."""


@dataclass
class OverlapReport:
    """Every eval row's overlap with the training rows, and the counts that summarize it."""

    n: int
    threshold: float
    common: int
    train_rows: int
    eval_rows: int
    rows: list[RowOverlap]
    """One per eval row, in order."""
    boilerplate: int = 0
    """Distinct eval n-grams ignored because more than ``common`` training rows hold them."""

    @property
    def exact(self) -> int:
        """Eval rows whose normalized text is a training row's."""
        return sum(r.exact is not None for r in self.rows)

    @property
    def over_threshold(self) -> int:
        """Eval rows whose n-gram share is at least ``threshold``."""
        return sum(r.fraction >= self.threshold for r in self.rows)

    @property
    def contaminated(self) -> int:
        """Eval rows that match exactly or are over the threshold."""
        return sum(r.contaminated for r in self.rows)

    @property
    def share(self) -> float:
        """Contaminated eval rows over all eval rows."""
        return self.contaminated / self.eval_rows if self.eval_rows else 0.0

    @property
    def short_rows(self) -> int:
        """Eval rows with fewer than ``n`` words (compared as one whole n-gram)."""
        return sum(0 < r.words < self.n for r in self.rows)

    @property
    def answer_matches(self) -> int:
        """Eval rows whose answer some training row also has."""
        return sum(r.answer_match is not None for r in self.rows)

    @property
    def exact_same_answer(self) -> int:
        """Exact matches whose training row also has the same answer (full duplicates)."""
        return sum(r.exact is not None and bool(r.same_answer) for r in self.rows)

    def histogram(self) -> list[tuple[str, int]]:
        """``(bin, eval rows)`` of the n-gram share: ``0``, ``(0, 0.2)``, ... ``[0.8, 1)``, ``1``."""
        edges = (0.0, *HISTOGRAM_BINS)
        labels = ["0"] + [
            f"({lo:g}, {hi:g})" if lo == 0 else f"[{lo:g}, {hi:g})" for lo, hi in zip(edges, edges[1:])
        ]
        counts = dict.fromkeys([*labels, "1"], 0)
        for row in self.rows:
            if row.fraction <= 0:
                counts["0"] += 1
            elif row.fraction >= 1:
                counts["1"] += 1
            else:
                counts[labels[1 + sum(row.fraction >= e for e in HISTOGRAM_BINS[:-1])]] += 1
        return list(counts.items())

    def examples(self, k: int) -> list[RowOverlap]:
        """Up to ``k`` contaminated rows: exact matches first, then by n-gram share, highest first."""
        bad = [r for r in self.rows if r.contaminated]
        return sorted(bad, key=lambda r: (r.exact is None, -r.fraction, r.index))[:k]

    def summary(self) -> dict[str, Any]:
        """The counts, JSON-able (without the per-row list)."""
        names = ("exact", "over_threshold", "contaminated", "share", "short_rows", "answer_matches")
        data = {k: v for k, v in asdict(self).items() if k != "rows"}
        data.update({name: getattr(self, name) for name in names})
        data["exact_same_answer"] = self.exact_same_answer
        data["histogram"] = dict(self.histogram())
        return data


def compare(
    train: Iterable[str],
    eval_texts: Sequence[str],
    *,
    n: int = DEFAULT_N,
    threshold: float = DEFAULT_THRESHOLD,
    common: int = DEFAULT_COMMON,
    train_answers: Iterable[str] | None = None,
    eval_answers: Sequence[str] | None = None,
) -> OverlapReport:
    """How much of each of ``eval_texts`` occurs in ``train`` (see the module docstring).

    Args:
        train, eval_texts: the compared text of every training / eval row (empty text never matches).
        n: words per n-gram, >= 1.
        threshold: n-gram share from which a row is contaminated, in (0, 1].
        common: n-grams in more than this many training rows are ignored (0: none is).
        train_answers, eval_answers: the rows' answers, in the same order (None: not compared).
    """
    check_args(n, threshold, common)
    eval_norm = [normalize(text) for text in eval_texts]
    eval_grams = [ngrams(text.split(), n) for text in eval_norm]
    wanted = {g for grams in eval_grams for g in grams}
    exact_wanted = {text for text in eval_norm if text}
    exact: dict[str, int] = {}
    seen: Counter[int] = Counter()  # n-gram -> training rows holding it
    first: dict[int, int] = {}  # n-gram -> first training row holding it
    train_rows = 0
    for i, text in enumerate(train):
        train_rows += 1
        norm = normalize(text)
        if norm in exact_wanted and norm not in exact:
            exact[norm] = i
        hits = wanted.intersection(ngrams(norm.split(), n))
        seen.update(hits)
        for g in hits:
            first.setdefault(g, i)
    limit = common if common > 0 else float("inf")
    rows = [
        _row(index, text, grams, exact.get(text), seen, first, limit, n, threshold)
        for index, (text, grams) in enumerate(zip(eval_norm, eval_grams, strict=True))
    ]
    if train_answers is not None and eval_answers is not None:
        _answers(rows, list(train_answers), eval_answers)
    boilerplate = sum(1 for g in wanted if seen[g] > limit)
    return OverlapReport(n, threshold, common, train_rows, len(eval_norm), rows, boilerplate)


def check_args(n: int, threshold: float, common: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n={n!r}; expected a whole number of words >= 1 (13 is the usual choice).")
    if not 0 < threshold <= 1:
        raise ValueError(
            f"threshold={threshold!r}; expected a share of n-grams in (0, 1], e.g. 0.5 (1: only rows "
            "whose every n-gram is in training)."
        )
    if not isinstance(common, int) or common < 0:
        raise ValueError(f"common={common!r}; expected a number of training rows >= 0 (0: ignore none).")


def _row(
    index: int,
    text: str,
    grams: list[int],
    exact: int | None,
    seen: Counter[int],
    first: dict[int, int],
    limit: float,
    n: int,
    threshold: float,
) -> RowOverlap:
    counted = [g for g in grams if seen[g] <= limit]
    shared = [pos for pos, g in enumerate(grams) if 0 < seen[g] <= limit]
    fraction = len(shared) / len(counted) if counted else 0.0
    best = Counter(first[grams[pos]] for pos in shared).most_common(1)
    words = len(text.split()) if text else 0
    return RowOverlap(
        index=index,
        words=words,
        exact=exact,
        fraction=fraction,
        ngrams=len(counted),
        train_row=exact if exact is not None else (best[0][0] if best else None),
        spans=_spans(shared, min(n, words)),
        contaminated=exact is not None or fraction >= threshold,
    )


def _spans(positions: list[int], width: int) -> list[tuple[int, int]]:
    """Merge the word ranges ``[p, p + width)`` of ``positions`` (ascending) into disjoint spans."""
    spans: list[tuple[int, int]] = []
    for pos in positions:
        if spans and pos <= spans[-1][1]:
            spans[-1] = (spans[-1][0], pos + width)
        else:
            spans.append((pos, pos + width))
    return spans


def _answers(rows: list[RowOverlap], train: list[str], eval_answers: Sequence[str]) -> None:
    """Fill in ``answer_match`` and ``same_answer`` of ``rows`` from the normalized answers."""
    train_norm = [normalize(a) for a in train]
    first: dict[str, int] = {}
    for i, answer in enumerate(train_norm):
        if answer:
            first.setdefault(answer, i)
    for row, answer in zip(rows, eval_answers, strict=True):
        mine = normalize(answer)
        if not mine:
            continue
        row.answer_match = first.get(mine)
        if row.train_row is not None and row.train_row < len(train_norm):
            row.same_answer = train_norm[row.train_row] == mine


def highlight(text: str, spans: Sequence[tuple[int, int]], marks: tuple[str, str] = ("«", "»")) -> str:
    """The normalized ``text`` with the word ``spans`` wrapped in ``marks``."""
    words = text.split()
    for start, end in reversed(spans):
        words[start:end] = [marks[0] + " ".join(words[start:end]) + marks[1]]
    return " ".join(words)


# -- what is compared -------------------------------------------------------------------------------


def as_text(value: Any) -> str:
    """A row value as comparable text: a chat's non-system message contents one per line, other
    non-text values as JSON, None as ``""``."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value):
        return "\n".join(as_text(m["content"]) for m in value if m.get("role") != "system")
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)


def task_texts(tasks: Sequence[Task], field: str = "prompt", *, where: str = "the taskset") -> list[str]:
    """The compared text of each task: ``prompt`` is the prompt as the run renders it (``prompt_key`` or
    ``prompt_template`` or ``messages_key``; a system prompt, shared by every row, is left out),
    ``answer`` the reference answer, any other name that field of the row. Raises ValueError when no row
    has that field."""
    if field == "prompt":
        return [as_text(t.question) for t in tasks]
    if field == "answer":
        return [as_text(t.answer) for t in tasks]
    if tasks and not any(field in t.raw for t in tasks):
        keys = sorted({k for t in tasks[:100] for k in t.raw})
        raise ValueError(
            f"field {field!r} is in no row of {where}; expected 'prompt' (the prompt the run sees), "
            f"'answer' or one of the row fields {keys}: pass --field with one of them."
        )
    return [as_text(t.raw.get(field)) for t in tasks]
