"""Eval rows in the training data: ``trine tasks overlap`` and ``trine check``'s contamination row.

The rows are read with the run's own loader (:class:`~trine.tasks.TaskSet`: the same files, splits,
``prompt_key`` / ``prompt_template`` / ``messages_key`` mapping and generators), so the prompts compared
are the prompts a run sends (without the system prompt every row shares); the method is
:mod:`trine.tasks.overlap`'s. From a config, "training" is every taskset a stage learns from
(``tasks.train``, ``tasks.mix``, ``tasks.expert``) of every stage, and each ``tasks.eval`` taskset of every
stage is compared with all of them. A generator taskset is materialized as the run makes it (the same
``generator_args`` and seed), so its rows are exactly the run's.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trine.tasks.overlap import OverlapReport, as_text, compare, highlight, normalize, task_texts

if TYPE_CHECKING:
    from trine.config import RunConfig, TasksetConfig
    from trine.inspect.probes import CheckRow

CHECK_LIMITS = {"train": 50_000, "eval": 10_000}
"""Rows ``trine check`` reads from each training / eval taskset (exact matches only: no n-grams)."""
TRAIN_KEYS = ("train", "mix", "expert")
"""The ``tasks`` keys a stage learns from."""
NOTE = (
    "An eval row that is also a training row measures memory, not skill. Prompts are compared as the run "
    "renders them, after normalizing (NFKC, lowercase, punctuation dropped); `trine tasks overlap --config "
    "CONFIG` also measures 13-gram overlap and shows examples (docs/data.md)."
)


@dataclass
class Side:
    """The rows of one or more tasksets, as compared."""

    label: str
    """Where they come from (a path, or ``tasks.eval.0 'name'``)."""
    ids: list[str]
    """Task ids, one per row."""
    texts: list[str]
    """The compared field of each row."""
    answers: list[str]
    """The reference answer of each row (``""``: none)."""
    parts: list[tuple[int, str]] | None = None
    """``(first row, label)`` of each taskset joined into this side (None: one taskset)."""

    def where(self, index: int) -> str:
        """``row I (task ID)``, with the taskset's label when the side joins several."""
        row = f"row {index} (task {self.ids[index]})"
        if not self.parts:
            return row
        start, label = self.parts[bisect.bisect_right([p[0] for p in self.parts], index) - 1]
        return f"{label} row {index - start} (task {self.ids[index]})"


def side(label: str, tasks: Sequence[Any], field: str, answers: list[str] | None = None) -> Side:
    """A :class:`Side` from built tasks (``answers`` default to the tasks' answers)."""
    answers = answers if answers is not None else task_texts(tasks, "answer")
    texts = answers if field == "answer" else task_texts(tasks, field, where=label)
    return Side(label, [t.task_id for t in tasks], texts, answers)


def join(label: str, sides: list[Side]) -> Side:
    """One side holding the rows of ``sides`` in order (each keeps its label for messages)."""
    parts, start = [], 0
    for s in sides:
        parts.append((start, s.label))
        start += len(s.ids)
    return Side(
        label,
        [i for s in sides for i in s.ids],
        [t for s in sides for t in s.texts],
        [a for s in sides for a in s.answers],
        parts if len(sides) > 1 else None,
    )


def config_tasksets(stages: list[RunConfig]) -> tuple[list[tuple[str, TasksetConfig]], ...]:
    """``(training, eval)``: ``(label, taskset config)`` of every stage, each distinct taskset once."""
    found: dict[str, dict[str, tuple[str, TasksetConfig]]] = {"train": {}, "eval": {}}
    for index, cfg in enumerate(stages):
        prefix = f"stages.{index}." if len(stages) > 1 else ""
        keyed = [(f"tasks.{k}", getattr(cfg.tasks, k)) for k in TRAIN_KEYS if k != "mix"]
        keyed += [(f"tasks.mix.{i}", ts) for i, ts in enumerate(cfg.tasks.mix)]
        for key, ts in keyed:
            if ts is not None:
                found["train"].setdefault(_fingerprint(ts), (f"{prefix}{key} '{ts.name}'", ts))
        for i, ts in enumerate(cfg.tasks.eval):
            found["eval"].setdefault(_fingerprint(ts), (f"{prefix}tasks.eval.{i} '{ts.name}'", ts))
    return list(found["train"].values()), list(found["eval"].values())


def _fingerprint(ts: TasksetConfig) -> str:
    return json.dumps(ts.model_dump(mode="json", exclude={"weight"}), sort_keys=True, default=str)


def load_side(label: str, ts: TasksetConfig, field: str, limit: int | None = None) -> Side:
    """The rows of ``ts`` as the run loads them (the first ``limit`` when given)."""
    from trine.build import build_taskset

    if limit is not None:
        ts = ts.model_copy(update={"limit": min(limit, ts.limit or limit)})
    return side(label, build_taskset(ts), field)


# -- trine check ------------------------------------------------------------------------------------


def contamination_row(cfg: RunConfig, config: str = "CONFIG") -> CheckRow:
    """``trine check``'s row: a WARN naming how many eval rows' prompts are training rows' prompts (exact,
    after normalizing), with one example. Bounded: the first :data:`CHECK_LIMITS` rows of each taskset,
    exact matches only (one normalized string per row): at most ~3.5 s on a 2-core CPU (50,000 + 10,000
    rows of 60 words, mostly reading them), well under a second for small tasksets."""
    from trine.inspect.probes import CheckRow

    name = "eval rows in training"
    train_sets, eval_sets = config_tasksets([cfg])
    if not eval_sets:
        return CheckRow(name, "INFO", "-", "no tasks.eval tasksets to compare")
    limit, ev_limit = CHECK_LIMITS["train"], CHECK_LIMITS["eval"]
    sides = [load_side(k, ts, "prompt", limit) for k, ts in train_sets]
    capped = [f"first {limit} rows of {s.label}" for s in sides if len(s.ids) == limit]
    train = join("training", sides)
    index = exact_index(train.texts)
    found, example, matched, total = [], "", 0, 0
    for key, ts in eval_sets:
        ev = load_side(key, ts, "prompt", ev_limit)
        capped += [f"first {ev_limit} rows of {key}"] if len(ev.ids) == ev_limit else []
        total += len(ev.ids)
        exact = exact_matches(index, ev.texts)
        if exact:
            matched += len(exact)
            found.append(f"{key}: {len(exact)} of {len(ev.ids)}")
            i, j = next(iter(exact.items()))
            example = example or f"eval task {ev.ids[i]} {_short(ev.texts[i])} is {train.where(j)}"
    bound = f" (compared: {', '.join(capped)})" if capped else ""
    if not found:
        detail = f"no eval prompt is a training prompt (exact, normalized){bound}"
        return CheckRow(name, "OK", f"0 of {total}", detail, NOTE)
    detail = (
        f"{'; '.join(found)} eval rows have a training row's prompt; e.g. {example}{bound}. Drop them from "
        f"the eval set, or run `trine tasks overlap --config {config}` for n-gram overlap"
    )
    return CheckRow(name, "WARN", f"{matched} of {total}", detail, NOTE)


def exact_index(train: Sequence[str]) -> dict[str, int]:
    """``{normalized text: first training row}`` (empty texts left out)."""
    first: dict[str, int] = {}
    for j, text in enumerate(train):
        first.setdefault(normalize(text), j)
    first.pop("", None)
    return first


def exact_matches(index: dict[str, int], eval_texts: Sequence[str]) -> dict[int, int]:
    """``{eval row: first training row}`` for the eval rows whose normalized text is in ``index``
    (:func:`exact_index` of the training texts)."""
    return {i: index[t] for i, t in enumerate(map(normalize, eval_texts)) if t in index}


def _short(text: str, width: int = 60) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= width else text[: width - 3] + "...")


# -- trine tasks overlap ----------------------------------------------------------------------------


def report_dict(report: OverlapReport, train: Side, ev: Side, field: str, examples: int) -> dict[str, Any]:
    """One comparison as JSON-able data: the counts and ``examples`` contaminated rows."""
    rows = []
    for r in report.examples(examples):
        rows.append(
            {
                "eval_row": r.index,
                "eval_task": ev.ids[r.index],
                "exact": r.exact is not None,
                "fraction": round(r.fraction, 4),
                "train_row": r.train_row,
                "train_task": None if r.train_row is None else train.ids[r.train_row],
                "same_answer": r.same_answer,
                "eval_text": highlight(normalize(ev.texts[r.index]), r.spans),
                "train_text": None if r.train_row is None else train.texts[r.train_row],
            }
        )
    return {"train": train.label, "eval": ev.label, "field": field, **report.summary(), "examples": rows}


def print_report(
    report: OverlapReport, train: Side, ev: Side, field: str, examples: int, echo: Callable
) -> None:
    """The comparison as text: counts, a histogram of the n-gram share, and ``examples`` rows with the
    shared words between « »."""
    n, rows, at = report.n, report.eval_rows, f"{report.threshold:g}"

    def pct(k: int) -> str:
        return f"{k} of {rows} ({100 * k / rows:.1f}%)" if rows else "0"

    echo(f"train: {train.label} ({report.train_rows} rows)")
    echo(f"eval:  {ev.label} ({rows} rows); field {field!r}, {n}-word n-grams")
    lines = [
        ("exact matches", f"{pct(report.exact)}, {report.exact_same_answer} of them with the same answer"),
        (f"n-gram share >= {at}", pct(report.over_threshold)),
        ("contaminated", f"{pct(report.contaminated)} (exact, or n-gram share >= {at})"),
    ]
    if report.answer_matches:
        lines.append(("answers in training", f"{pct(report.answer_matches)} (not counted above)"))
    if report.short_rows:
        lines.append(("short rows", f"{report.short_rows} with < {n} words: compared whole (exact only)"))
    if report.boilerplate:
        lines.append(
            ("boilerplate", f"{report.boilerplate} n-grams in > {report.common} training rows ignored")
        )
    for label, value in lines:
        echo(f"  {label + ':':<24}{value}")
    top = max(count for _, count in report.histogram()) or 1
    echo("  n-gram share   rows")
    for label, count in report.histogram():
        echo(f"  {label:<12} {count:>6} {'█' * round(20 * count / top)}".rstrip())
    chosen = report.examples(examples)
    if chosen:
        echo(f"examples ({len(chosen)} of {report.contaminated}):")
    for r in chosen:
        match = train.where(r.train_row) if r.train_row is not None else "?"
        how = (
            f"exact match of {match}"
            if r.exact is not None
            else f"{r.fraction:.0%} of its n-grams in training, most from {match}"
        )
        same = {True: ", same answer", False: ", different answer"}.get(r.same_answer, "")  # type: ignore[arg-type]
        echo(f"  eval {ev.where(r.index)}: {how}{same}")
        echo(f"    eval:  {_clip(highlight(normalize(ev.texts[r.index]), r.spans))}")
        if r.train_row is not None:
            echo(f"    train: {_clip(' '.join(train.texts[r.train_row].split()))}")


def _clip(text: str, width: int = 300) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def compare_sides(train: Side, ev: Side, **kwargs: Any) -> OverlapReport:
    """:func:`~trine.tasks.overlap.compare` of two sides, answers included."""
    return compare(train.texts, ev.texts, train_answers=train.answers, eval_answers=ev.answers, **kwargs)


def file_side(label: str, path: Path, field: str, answer_key: str, **taskset: Any) -> Side:
    """The rows of a taskset file or directory, mapped as a taskset with ``taskset``'s settings would map
    them; answers are the rows' ``answer_key`` field where they have it."""
    from trine.tasks import TaskSet

    try:
        tasks = TaskSet(path, name=label, answer_key=None, **taskset)
    except ValueError as err:
        raise ValueError(
            f"{err} (here: map the rows with --prompt-key, --prompt-template or --messages-key)"
        ) from None
    answers = [as_text(t.raw.get(answer_key)) for t in tasks]
    return side(str(path), tasks, field, answers)
