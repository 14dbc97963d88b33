"""Experience operators: ``list[Experience] -> list[Experience]`` steps between explorer and buffer.

An operator is an object with a ``name``, called as ``op(experiences, step=None)``; it returns the
(possibly filtered or reshaped) experiences and keeps the counts of its last call in
``op.last_counts``. A :class:`Pipeline` runs operators in order and reports their counts and times
as ``operators/<name>/<count>`` and ``operators/<name>/seconds``. :func:`build_pipeline` builds one
from specs ``{"name": <built-in or "package.module:attr">, **arguments}`` (the registry kind
``"operator"``, built-ins in ``trine.buffer.OPERATORS``).

Filters live here (``zero_variance``, ``invalid_reward``, ``length``, ``duplicate_responses``);
reward mappers (``reward_shaping``, ``overlong``, ``quality``, ``diversity``) in
:mod:`trine.buffer.mappers`. An operator that changes an experience appends its name to
``info["lineage"]``. Group-level operators treat experiences sharing a ``group_id`` as one group.

The plain functions :func:`zero_variance_filter` and :func:`overlong_shaping` return
``(experiences, counts)`` and are used directly by DAPO's dynamic sampling.
"""

from __future__ import annotations

import inspect
import math
import numbers
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from trine.types import Experience


def groups_of(experiences: list[Experience]) -> dict[str, list[Experience]]:
    """Experiences by ``group_id``, in first-seen order."""
    out: dict[str, list[Experience]] = defaultdict(list)
    for e in experiences:
        out[e.group_id or e.id].append(e)
    return dict(out)


def zero_variance_filter(
    experiences: list[Experience], tol: float = 1e-8
) -> tuple[list[Experience], dict[str, float]]:
    """Drop groups whose rewards are all equal (they carry no group-relative signal).

    DAPO's dynamic sampling (arXiv 2503.14476, §3.2). Counts: ``kept_groups``, ``dropped_all_correct``
    (all rewards equal to the group's max possible here: equal and > 0), ``dropped_all_wrong`` (equal
    and <= 0).
    """
    kept: list[Experience] = []
    stats = {"kept_groups": 0.0, "dropped_all_correct": 0.0, "dropped_all_wrong": 0.0}
    for group in groups_of(experiences).values():
        rewards = [float(e.reward or 0.0) for e in group]
        if len(group) > 1 and max(rewards) - min(rewards) <= tol:
            stats["dropped_all_correct" if rewards[0] > 0 else "dropped_all_wrong"] += 1
            continue
        kept.extend(group)
        stats["kept_groups"] += 1
    return kept, stats


def overlong_penalty(length: int, max_tokens: int, buffer: int, penalty: float = 1.0) -> float:
    """DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13).

    ``0`` if ``L <= L_max - L_cache``; ``((L_max - L_cache) - L) / L_cache · penalty`` inside the
    buffer (linear from 0 down to ``-penalty``); ``-penalty`` at or beyond ``L_max``.
    """
    if buffer <= 0 or length <= max_tokens - buffer:
        return 0.0
    if length >= max_tokens:
        return -penalty
    return (max_tokens - buffer - length) / buffer * penalty


def overlong_shaping(
    experiences: list[Experience], max_tokens: int, buffer: int, penalty: float = 1.0
) -> tuple[list[Experience], dict[str, float]]:
    """Add :func:`overlong_penalty` of each response's length to its reward (recorded in
    ``info["reward_parts"]["overlong"]``). Pending rewards are left alone."""
    shaped = 0
    for e in experiences:
        if e.reward is None:
            continue
        p = overlong_penalty(e.response_length, max_tokens, buffer, penalty)
        if p:
            e.reward = float(e.reward) + p
            e.info.setdefault("reward_parts", {})["overlong"] = p
            shaped += 1
    return experiences, {"overlong_shaped": float(shaped)}


def add_lineage(experience: Experience, name: str) -> None:
    """Record that operator ``name`` changed ``experience`` (``info["lineage"]``, a list of names)."""
    experience.info.setdefault("lineage", []).append(name)


# -- the operator protocol and the pipeline ---------------------------------------------------------


class Operator:
    """Base class of experience operators.

    Subclasses set ``name`` and implement :meth:`apply`, returning the experiences to keep and a
    dict of counts. Calling the operator runs :meth:`apply`, records ``last_counts`` (the counts
    plus ``in``/``out`` sizes) and advances ``step`` (the explicit ``step`` argument, else the
    number of earlier calls), which schedule-driven operators read.
    """

    name: str = "operator"
    last_counts: dict[str, float] = {}
    calls: int = 0
    step: int = 0

    def __call__(self, experiences: list[Experience], step: int | None = None) -> list[Experience]:
        """Run the operator on ``experiences`` (``step``: the training step, for schedules)."""
        self.step = self.calls if step is None else int(step)
        self.calls += 1
        experiences = list(experiences)
        kept, counts = self.apply(experiences)
        self.last_counts = {"in": float(len(experiences)), "out": float(len(kept))}
        self.last_counts.update({k: float(v) for k, v in counts.items()})
        return kept

    def apply(self, experiences: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        """Return ``(kept experiences, counts)``; override in subclasses."""
        raise NotImplementedError(f"{type(self).__name__} must implement apply(experiences)")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class FunctionOperator(Operator):
    """Wraps a plain ``fn(experiences) -> experiences | (experiences, counts)`` as an operator.

    ``fn`` may also take a ``step`` keyword argument.
    """

    def __init__(self, fn: Callable[..., Any], name: str | None = None) -> None:
        self.fn = fn
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        try:
            self._takes_step = "step" in inspect.signature(fn).parameters
        except (TypeError, ValueError):
            self._takes_step = False

    def apply(self, experiences: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        out = self.fn(experiences, step=self.step) if self._takes_step else self.fn(experiences)
        if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict):
            return list(out[0]), out[1]
        if not isinstance(out, list):
            raise TypeError(
                f"operator {self.name!r} returned {type(out).__name__}; expected a list of Experience "
                "(or a tuple (experiences, counts))."
            )
        return out, {}


def as_operator(obj: Any, name: str | None = None) -> Operator:
    """``obj`` if it is an :class:`Operator`, else a :class:`FunctionOperator` around the callable."""
    if isinstance(obj, Operator):
        return obj
    if callable(obj):
        return FunctionOperator(obj, name)
    raise TypeError(
        f"{obj!r} is not an operator; expected an Operator or a callable list[Experience] -> list[Experience]."
    )


class Pipeline:
    """Operators run in order; ``pipeline(experiences, step=None) -> (experiences, metrics)``.

    Metrics: ``operators/<name>/<count>`` for every count of every operator (``in``, ``out`` and the
    operator's own) and ``operators/<name>/seconds``. Two operators with the same name get
    ``<name>``, ``<name>_2``, ...
    """

    def __init__(self, ops: Iterable[Any] = ()) -> None:
        self.ops = [as_operator(op) for op in ops]
        self.names = _unique([op.name for op in self.ops])

    def __call__(
        self, experiences: list[Experience], step: int | None = None
    ) -> tuple[list[Experience], dict[str, float]]:
        """Run every operator on the output of the previous one; return the result and the metrics."""
        metrics: dict[str, float] = {}
        for name, op in zip(self.names, self.ops):
            start = time.perf_counter()
            experiences = op(experiences, step=step)
            metrics[f"operators/{name}/seconds"] = time.perf_counter() - start
            for key, value in op.last_counts.items():
                metrics[f"operators/{name}/{key}"] = float(value)
        return experiences, metrics

    def __len__(self) -> int:
        return len(self.ops)

    def __repr__(self) -> str:
        return f"Pipeline({self.names})"


def _unique(names: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return out


def build_pipeline(specs: Iterable[dict[str, Any] | Any] | None) -> Pipeline:
    """A :class:`Pipeline` from specs ``{"name": <operator>, **arguments}``.

    ``name`` is a built-in (``trine.buffer.OPERATORS``), a plugin-registered name or an import path
    ``"package.module:attr"``; the object found is called with the arguments and must return an
    operator (a class or factory) — a plain callable is wrapped. An Operator instance may be given
    in place of a spec.
    """
    from trine.registry import resolve

    ops: list[Operator] = []
    for index, spec in enumerate(specs or []):
        if isinstance(spec, Operator):
            ops.append(spec)
            continue
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise ValueError(
                f"operator spec #{index} is {spec!r}; expected a dict with a 'name' key and the operator's "
                "arguments, e.g. {'name': 'length', 'max_length': 512}."
            )
        args = {k: v for k, v in spec.items() if k != "name"}
        factory = resolve("operator", spec["name"])
        ops.append(as_operator(_construct(factory, spec["name"], index, args), spec["name"]))
    return Pipeline(ops)


def _construct(factory: Any, name: str, index: int, args: dict[str, Any]) -> Any:
    if not callable(factory):
        raise ValueError(
            f"operator {name!r} (spec #{index}) is a {type(factory).__name__}, not a class or factory; "
            "point the name at an Operator subclass or a function returning an operator."
        )
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # no signature (builtins): just call it
        return factory(**args)
    try:
        signature.bind(**args)
    except TypeError as err:
        raise ValueError(
            f"operator {name!r} (spec #{index}) got arguments {sorted(args)}: {err}; its parameters are "
            f"{signature}."
        ) from None
    return factory(**args)


# -- filters ----------------------------------------------------------------------------------------


class ZeroVarianceFilter(Operator):
    """Drop groups whose rewards all agree (:func:`zero_variance_filter`, DAPO dynamic sampling).

    Groups with a pending reward (None) are kept untouched (``kept_pending_groups``).
    """

    name = "zero_variance"

    def __init__(self, tol: float = 1e-8) -> None:
        self.tol = tol

    def apply(self, experiences: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        ready, pending = [], []
        for group in groups_of(experiences).values():
            (pending if any(e.reward is None for e in group) else ready).append(group)
        kept, counts = zero_variance_filter([e for g in ready for e in g], tol=self.tol)
        keep_ids = {id(e) for e in kept} | {id(e) for g in pending for e in g}
        counts["kept_pending_groups"] = float(len(pending))
        return [e for e in experiences if id(e) in keep_ids], counts


class InvalidRewardFilter(Operator):
    """Drop experiences whose reward (or a token reward) is NaN, infinite or not a number.

    A pending reward (None) is valid and kept (``pending``). Counts: ``dropped_nan``,
    ``dropped_inf``, ``dropped_not_number``, ``pending``.
    """

    name = "invalid_reward"

    def __init__(self, check_token_rewards: bool = True) -> None:
        self.check_token_rewards = check_token_rewards

    def apply(self, experiences: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        counts = {"dropped_nan": 0.0, "dropped_inf": 0.0, "dropped_not_number": 0.0, "pending": 0.0}
        kept = []
        for e in experiences:
            values = [] if e.reward is None else [e.reward]
            if self.check_token_rewards and e.token_rewards is not None:
                values += list(e.token_rewards)
            problem = next((p for p in map(_reward_problem, values) if p), None)
            if problem:
                counts[f"dropped_{problem}"] += 1
                continue
            counts["pending"] += e.reward is None
            kept.append(e)
        return kept, counts


def _reward_problem(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return "not_number"
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf"
    return None


class LengthFilter(Operator):
    """Drop experiences whose response is shorter than ``min_length`` or longer than ``max_length``
    tokens (``count="response"``: all response tokens; ``"action"``: model-generated ones only).

    Counts: ``dropped_short``, ``dropped_long``.
    """

    name = "length"

    def __init__(self, min_length: int = 0, max_length: int | None = None, count: str = "response") -> None:
        if count not in ("response", "action"):
            raise ValueError(f"length filter count={count!r}; expected 'response' or 'action'.")
        if max_length is not None and max_length < min_length:
            raise ValueError(
                f"length filter max_length={max_length} < min_length={min_length}; expected min <= max."
            )
        self.min_length, self.max_length, self.count = min_length, max_length, count

    def apply(self, experiences: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        counts = {"dropped_short": 0.0, "dropped_long": 0.0}
        kept = []
        for e in experiences:
            n = e.response_length if self.count == "response" else sum(e.action_mask)
            if n < self.min_length:
                counts["dropped_short"] += 1
            elif self.max_length is not None and n > self.max_length:
                counts["dropped_long"] += 1
            else:
                kept.append(e)
        return kept, counts


class DuplicateResponseFilter(Operator):
    """Within each group keep only the first of identical response token sequences.

    Counts: ``dropped_duplicates``.
    """

    name = "duplicate_responses"

    def apply(self, experiences: list[Experience]) -> tuple[list[Experience], dict[str, float]]:
        seen: set[tuple[str, tuple[int, ...]]] = set()
        kept = []
        for e in experiences:
            key = (e.group_id or e.id, tuple(e.response_tokens))
            if key not in seen:
                seen.add(key)
                kept.append(e)
        return kept, {"dropped_duplicates": float(len(experiences) - len(kept))}


FILTERS: dict[str, type[Operator]] = {
    "zero_variance": ZeroVarianceFilter,
    "invalid_reward": InvalidRewardFilter,
    "length": LengthFilter,
    "duplicate_responses": DuplicateResponseFilter,
}
