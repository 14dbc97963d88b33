"""Comparing runs: resolved configs key by key, curves on one axis aligned by stage, evals side by side.

Pure functions over plain data (no files, no HTTP); :mod:`trine.studio.compare_api` reads the runs and
serves ``GET /api/compare``.

- :func:`flatten` and :func:`config_diff`: each run's resolved ``config.yaml`` as dotted keys
  (``trainer.lr``; ``stages.1.trainer.lr`` when a run of the comparison has several stages), and for
  every key the value of each run (a run without the key has none: *absent*) and whether they differ.
- :class:`StageSpan`, :func:`add_rows` and :func:`align`: where each stage of each run lies in its
  ``metrics.jsonl`` and where it goes on the common axis. The rule, for steps and for seconds alike:

  * stage 0 starts at 0 (at step 0, and at the ``time/unix`` of the run's first line that has one);
  * stage *N* of a run starts where its stage *N-1* ended (the step and time of that stage's last line),
    and is as long as from there to its own last line;
  * on the common axis, stage *N* of **every** run starts at the same x: where the longest stage *N-1*
    of the compared runs ended (the sum of the longest stage 0, 1, ..., N-1);
  * a point of stage *N* of a run is drawn at ``x = start_N + (its step - the run's stage start)``
    (seconds likewise, from ``time/unix``).

  Stages are matched by position (the first stage of each run, the second, ...), whatever their names;
  a position whose names differ gets a note. A single-stage run is drawn at its own steps and at the
  seconds since its first line.
- :func:`eval_summary`: the last and the best (highest) value of each ``eval/<taskset>/<metric>`` of
  each run, from :func:`trine.studio.run_metrics.eval_table` (``bench.jsonl`` rows as their own source).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trine.studio.run_metrics import is_number

TIME_KEY = "time/unix"
"""The wall-clock unix time every ``metrics.jsonl`` line carries (:class:`trine.monitor.sinks.JsonlSink`)."""


# -- configs ---------------------------------------------------------------------------------------


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """``{"trainer.lr": 0.001, "tasks.eval.0.name": "addition", ...}``: mappings by key, lists of mappings
    or lists by index; a list of plain values (``stop: ["\\n"]``), an empty list and an empty mapping
    stay one value."""
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and any(isinstance(item, (dict, list)) for item in value):
        out = {}
        for index, item in enumerate(value):
            out.update(flatten(item, f"{prefix}.{index}" if prefix else str(index)))
        return out
    return {prefix: value}


def stages_of(config: dict[str, Any]) -> list[Any]:
    """The stage configs of a resolved config: its ``stages`` list, or the config itself (one stage)."""
    stages = config.get("stages")
    return stages if isinstance(stages, list) and stages else [config]


def config_keys(configs: dict[str, dict[str, Any] | None]) -> dict[str, dict[str, Any] | None]:
    """Each run's config flattened; when any run has several stages, every run's keys are written per
    stage (``stages.0.trainer.lr``), so that a one-stage run lines up with the first stage of the others."""
    staged = any(c is not None and len(stages_of(c)) > 1 for c in configs.values())
    return {
        name: None if c is None else flatten({"stages": stages_of(c)} if staged else c)
        for name, c in configs.items()
    }


def _same(value: Any) -> str:
    """A value as compared: ``1`` and ``1.0`` and ``True`` are three different settings."""
    return json.dumps(value, sort_keys=True, default=str)


def config_diff(configs: dict[str, dict[str, Any] | None]) -> dict[str, Any]:
    """``{"keys": [{"key", "values": {run: value}, "differs"}], "differing", "total", "runs"}``: every key
    of the runs' configs (``None`` for a run whose config could not be read: it takes no part), in the
    order they appear; ``values`` lacks the runs that do not have the key (absent), and ``differs`` says
    whether the runs that have a config disagree (absent counts as a value of its own)."""
    flat = config_keys(configs)
    present = {name: keys for name, keys in flat.items() if keys is not None}
    order: dict[str, None] = {}
    for keys in present.values():
        order.update(dict.fromkeys(keys))
    rows = []
    for key in order:
        values = {name: keys[key] for name, keys in present.items() if key in keys}
        seen = {_same(v) for v in values.values()} | ({"<absent>"} if len(values) < len(present) else set())
        rows.append({"key": key, "values": values, "differs": len(seen) > 1})
    return {
        "keys": rows,
        "differing": sum(r["differs"] for r in rows),
        "total": len(rows),
        "runs": list(present),
    }


# -- stages on one axis ----------------------------------------------------------------------------


@dataclass
class StageSpan:
    """One stage of one run as its ``metrics.jsonl`` logged it."""

    name: str
    """The ``stage`` of its lines ("" for lines without one)."""
    first_step: float
    """Step of its first line."""
    last_step: float
    """Step of its last line."""
    first_time: float | None = None
    """``time/unix`` of its first line that has one (None: none has)."""
    last_time: float | None = None
    """``time/unix`` of its last line that has one."""
    lines: int = 0
    """Lines of this stage (with a step)."""


def stage_name(row: dict[str, Any]) -> str:
    stage = row.get("stage")
    return stage if isinstance(stage, str) else ""


def add_rows(spans: list[StageSpan], rows: list[dict[str, Any]]) -> list[StageSpan]:
    """``spans`` (in order of first appearance) extended by the metrics ``rows`` (lines without a numeric
    ``step`` are skipped); returns ``spans``."""
    by_name = {span.name: span for span in spans}
    for row in rows:
        step = row.get("step")
        if not is_number(step):
            continue
        name = stage_name(row)
        when = row.get(TIME_KEY)
        when = float(when) if is_number(when) else None
        span = by_name.get(name)
        if span is None:
            span = by_name[name] = StageSpan(name, step, step)
            spans.append(span)
        span.last_step = step
        span.lines += 1
        if when is not None:
            span.first_time = when if span.first_time is None else span.first_time
            span.last_time = when
    return spans


def _longest(values: list[float | None]) -> float:
    known = [v for v in values if v is not None]
    return max(known) if known else 0


def _minus(a: float | None, b: float | None) -> float | None:
    """``a - b`` to the millisecond (``time/unix`` is logged to the millisecond), None if either is."""
    return None if a is None or b is None else round(a - b, 3)


def align(spans: dict[str, list[StageSpan]]) -> dict[str, Any]:
    """Where each stage of each run goes on the common axis (the rule is in the module docstring).

    ``{"stages": [{"index", "names": {run: name}, "x_step", "x_time"}], "runs": {run: [{"stage",
    "index", "start_step", "start_time", "steps", "seconds", "x_step", "x_time"}]}, "notes"}``: a point of
    stage ``index`` of ``run`` at step ``s`` (time ``t``) is drawn at ``x_step + s - start_step`` (``x_time
    + t - start_time``); ``start_time``, ``seconds`` and ``x_time`` are None where the lines carry no
    ``time/unix``.
    """
    starts: dict[str, list[dict[str, Any]]] = {}
    for run, stages in spans.items():
        starts[run] = []
        for index, span in enumerate(stages):
            before = stages[index - 1] if index else None
            start_step = before.last_step if before else 0
            start_time = before.last_time if before else span.first_time
            starts[run].append(
                {
                    "stage": span.name,
                    "index": index,
                    "start_step": start_step,
                    "start_time": start_time,
                    "steps": span.last_step - start_step,
                    "seconds": _minus(span.last_time, start_time),
                }
            )
    count = max((len(s) for s in starts.values()), default=0)
    table, notes = [], []
    x_step: float = 0
    x_time: float = 0
    for index in range(count):
        here = {run: s[index] for run, s in starts.items() if index < len(s)}
        for entry in here.values():
            entry["x_step"] = x_step
            entry["x_time"] = x_time if entry["start_time"] is not None else None
        names = {run: entry["stage"] for run, entry in here.items()}
        table.append({"index": index, "names": names, "x_step": x_step, "x_time": x_time})
        if len(set(names.values())) > 1:
            said = ", ".join(f"{name!r} in {run}" for run, name in names.items())
            notes.append(f"stage {index + 1} is {said}: stages are aligned by position, not by name")
        x_step += _longest([e["steps"] for e in here.values()])
        x_time = round(x_time + _longest([e["seconds"] for e in here.values()]), 3)
    return {"stages": table, "runs": starts, "notes": notes}


# -- evaluations -----------------------------------------------------------------------------------


def eval_summary(tables: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """``[{"source", "taskset", "metric", "runs": {run: {"last", "last_step", "best", "best_step",
    "points"}}}]`` from each run's :func:`~trine.studio.run_metrics.eval_table`: per source (``run``:
    ``metrics.jsonl``, ``bench``: ``bench.jsonl``), taskset and metric, the value at the last step that has
    one and the highest value (its first step on a tie); rows of the run's own evals first."""
    found: dict[tuple[str, str, str], dict[str, dict[str, Any]]] = {}
    for run, table in tables.items():
        metrics = table.get("columns", [])
        for row in table.get("rows", []):
            for metric in metrics:
                value = row.get(metric)
                if not is_number(value):
                    continue
                key = (row["source"], row["taskset"], metric)
                cell = found.setdefault(key, {}).setdefault(run, {"points": 0, "best": None})
                cell.update(last=value, last_step=row["step"], points=cell["points"] + 1)
                if cell["best"] is None or value > cell["best"]:
                    cell.update(best=value, best_step=row["step"])
    ordered = sorted(found, key=lambda k: k[0] != "run")  # stable: first appearance within a source
    return [
        {"source": source, "taskset": taskset, "metric": metric, "runs": found[(source, taskset, metric)]}
        for source, taskset, metric in ordered
    ]
