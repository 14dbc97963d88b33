"""The rows of the studio's experience browser: the list row of the API contract, the validated filters,
and the sources kept in Python (a file buffer's replayed log, an in-memory buffer's last checkpoint).

A file log is read with :func:`trine.buffer.inspect.read_rows` (never opened as a buffer: opening repairs
a torn last line, which a reader must not do to a log a run is writing) and cached until its size or
modification time changes; the checkpoint's rows are cached until a newer checkpoint appears.
"""

from __future__ import annotations

import math
import pickle
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from trine.buffer.states import STATES as STATUSES
from trine.types import Experience

PREVIEW = 160
"""Characters of the response shown in a list row."""
FACET_TASKS = 200
"""Task ids listed by the facets (the first, in order)."""


@dataclass
class Filters:
    """A validated experience query (every field None = no filter on it)."""

    status: str | None = None
    kind: str | None = None
    task: str | None = None
    finish_reason: str | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    version_min: int | None = None
    version_max: int | None = None
    step_min: int | None = None
    """On ``batch`` (``info["batch"]``, the explore step the experience was explored at)."""
    step_max: int | None = None
    offset: int = 0
    limit: int = 50
    order: str = "seq"


def summary(e: Experience, status: str, seq: int) -> dict[str, Any]:
    """One row of the list (the contract's fields) for an experience kept in Python."""
    response = e.info.get("response")
    return {
        "id": e.id,
        "seq": seq,
        "task_id": e.task_id,
        "group_id": e.group_id,
        "run_id": e.run_id,
        "step": e.step,
        "batch": _int_or_none(e.info.get("batch")),
        "policy_version": e.policy_version,
        "reward": finite(e.reward),
        "status": status,
        "kind": e.kind,
        "finish_reason": _str_or_none(e.info.get("finish_reason")),
        "prompt_length": e.prompt_length,
        "response_length": e.response_length,
        "preview": response[:PREVIEW] if isinstance(response, str) else "",
    }


@dataclass
class ListSource:
    """Experiences held in Python: a replayed file log or a checkpointed in-memory buffer."""

    source: str
    rows: list[tuple[Experience, str, int]]
    """(experience, studio status, seq) oldest first."""
    note: str | None = None

    @cached_property
    def summaries(self) -> list[dict[str, Any]]:
        """The list row of every experience (computed once per cached source)."""
        return [summary(e, s, q) for e, s, q in self.rows]

    def _keep(self, f: Filters) -> Callable[[dict[str, Any]], bool]:
        def between(v: Any, lo: Any, hi: Any) -> bool:
            if lo is None and hi is None:
                return True
            return v is not None and (lo is None or v >= lo) and (hi is None or v <= hi)

        def keep(r: dict[str, Any]) -> bool:
            return (
                (f.status is None or r["status"] == f.status)
                and (f.kind is None or r["kind"] == f.kind)
                and (f.task is None or r["task_id"] == f.task)
                and (f.finish_reason is None or r["finish_reason"] == f.finish_reason)
                and between(r["reward"], f.reward_min, f.reward_max)
                and between(r["policy_version"], f.version_min, f.version_max)
                and between(r["batch"], f.step_min, f.step_max)
            )

        return keep

    def page(self, f: Filters) -> tuple[int, list[dict[str, Any]]]:
        """(rows matching ``f``, the page of them ``f`` asks for)."""
        keep = self._keep(f)
        chosen = [r for r in self.summaries if keep(r)]
        if f.order in ("reward", "-reward"):
            sign = 1 if f.order == "reward" else -1
            chosen.sort(key=lambda r: (r["reward"] is None, sign * (r["reward"] or 0.0), r["seq"]))
        elif f.order == "-seq":
            chosen.reverse()
        return len(chosen), chosen[f.offset : f.offset + f.limit]

    def facets(self) -> dict[str, Any]:
        """The values the filters can take (the contract's facets; see ``SqlSource.facets``)."""
        rows = self.summaries
        statuses = Counter(r["status"] for r in rows)
        return {
            "statuses": {s: statuses.get(s, 0) for s in STATUSES},
            "kinds": sorted({r["kind"] for r in rows}),
            "finish_reasons": sorted({r["finish_reason"] for r in rows if r["finish_reason"] is not None}),
            "tasks": sorted({r["task_id"] for r in rows})[:FACET_TASKS],
            "reward": _span(r["reward"] for r in rows),
            "version": _span(r["policy_version"] for r in rows),
            "batch": _span(r["batch"] for r in rows),
        }

    def one(self, exp_id: str) -> tuple[Experience, str, int] | None:
        """(experience, status, seq) of ``exp_id``, or None."""
        return next((r for r in self.rows if r[0].id == exp_id), None)

    def group(self, e: Experience, limit: int = 500) -> list[tuple[Experience, str, int]]:
        """The rows sharing ``e``'s group id (``e`` itself alone when it has none)."""
        if not e.group_id:
            return [r for r in self.rows if r[0].id == e.id]
        return [r for r in self.rows if r[0].group_id == e.group_id][:limit]

    def steps(self, e: Experience, limit: int = 500) -> list[tuple[Experience, str, int]]:
        """The rows of ``e``'s multi-step rollout (same task and run id), by step."""
        if not e.run_id:
            return [r for r in self.rows if r[0].id == e.id]
        same = [r for r in self.rows if r[0].run_id == e.run_id and r[0].task_id == e.task_id]
        return sorted(same, key=lambda r: (r[0].step, r[2]))[:limit]


@dataclass
class NoSource(ListSource):
    """A run whose experiences cannot be shown (no config yet, unreadable buffer); ``note`` says why."""


def _span(values: Any) -> list[float] | None:
    known = [v for v in values if v is not None]
    return [min(known), max(known)] if known else None


def finite(x: Any) -> float | None:
    """``x`` as a float, or None when it is None or not finite (JSON has no NaN)."""
    if x is None:
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def _int_or_none(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _str_or_none(x: Any) -> str | None:
    return x if isinstance(x, str) else None


_FILE_CACHE: dict[str, tuple[tuple[int, int], ListSource]] = {}
_MEMORY_CACHE: dict[str, tuple[tuple[str, int], ListSource]] = {}


def file_source(run_dir: Path, path: Path, stage: str | None) -> ListSource:
    """The replayed log (cached until its size or mtime changes)."""
    from trine.buffer.inspect import read_rows

    if not path.is_file():
        return ListSource("file", [], f"no experience stored yet ({path} does not exist)")
    stat = path.stat()
    key = (stat.st_mtime_ns, stat.st_size)
    cached = _FILE_CACHE.get(str(path))
    if cached is None or cached[0] != key:
        rows = read_rows(run_dir, stage=stage)
        out = [(e, s, i + 1) for i, (e, s) in enumerate(rows or [])]
        _FILE_CACHE[str(path)] = cached = (key, ListSource("file", out))
    return cached[1]


def memory_source(run_dir: Path) -> ListSource:
    """What the run's last checkpoint kept of its in-memory buffer (its untrained rows); only the
    checkpoint's ``loop_state.pt`` is read (not the trainer state with its optimizer)."""
    import torch

    from trine.buffer.inspect import memory_buffer_note, rows_from_state
    from trine.trainer.checkpoint import list_checkpoints

    found = list_checkpoints(run_dir / "checkpoints")
    if not found:
        return ListSource("memory", [], memory_buffer_note(run_dir, 0, False))
    state = found[-1] / "loop_state.pt"
    key = (str(found[-1]), state.stat().st_mtime_ns if state.is_file() else 0)
    cached = _MEMORY_CACHE.get(str(run_dir))
    if cached is None or cached[0] != key:
        try:
            loop_state = torch.load(state, map_location="cpu", weights_only=False)
        except (OSError, EOFError, RuntimeError, pickle.UnpicklingError) as err:
            return ListSource(
                "memory", [], f"{state} cannot be read ({err}); is the checkpoint still being written?"
            )
        rows = rows_from_state(loop_state.get("buffer") or {})
        source = ListSource("memory", [(e, s, i + 1) for i, (e, s) in enumerate(rows)])
        source.note = memory_buffer_note(run_dir, len(rows), True)
        _MEMORY_CACHE[str(run_dir)] = cached = (key, source)
    return cached[1]
