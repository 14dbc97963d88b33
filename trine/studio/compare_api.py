"""The studio's comparison API: ``GET /api/compare?runs=a,b,c`` (two to :data:`MAX_RUNS` runs).

One answer holds what the compare page shows besides the curves themselves: each run's summary (state
as :func:`trine.status.describe` says it, stages, progress, notes), where each run's stages go on the
common step and time axes (:func:`trine.studio.compare.align`), the key-by-key diff of the resolved
configs (:func:`trine.studio.compare.config_diff`) and the evals side by side
(:func:`trine.studio.compare.eval_summary`). The page reads the curves from each run's own
``/api/runs/NAME/metrics`` and places them with the stage table.

Names go through :func:`trine.studio.paths.run_path`, as everywhere in the studio: a name that is not
one plain directory name is refused (400), an unknown run is a 404 naming it, a run holding a link out
of the runs directory is refused (400). A corrupt ``metrics.jsonl`` line, a missing or unreadable
``config.yaml`` become notes, never an error. Only reads.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import yaml
from fastapi import APIRouter, Depends, HTTPException, Query

from trine.studio.compare import StageSpan, add_rows, align, config_diff, eval_summary
from trine.studio.paths import run_path
from trine.studio.run_metrics import _parse_lines, _skip_line, eval_table
from trine.studio.runs import read_config, run_summary
from trine.studio.settings import StudioSettings, studio

router = APIRouter()

MIN_RUNS = 2
MAX_RUNS = 8
"""The most runs one comparison holds (more curves on one chart cannot be told apart)."""
CHUNK_BYTES = 4 << 20
_CACHE_SIZE = 256
_spans: dict[Path, dict[str, Any]] = {}
_spans_lock = threading.Lock()
_configs: dict[Path, tuple[str, dict[str, Any] | None, list[str]]] = {}


def run_names(runs: str) -> list[str]:
    """The names of ``?runs=a,b,c`` (blanks dropped, a name given twice kept once); 400 unless there are
    :data:`MIN_RUNS` to :data:`MAX_RUNS`."""
    names = list(dict.fromkeys(n.strip() for n in runs.split(",") if n.strip()))
    if len(names) < MIN_RUNS:
        raise HTTPException(
            400,
            f"runs={runs!r} names {len(names)} run(s); a comparison needs {MIN_RUNS} to {MAX_RUNS}, "
            "comma-separated: ?runs=NAME,OTHER",
        )
    if len(names) > MAX_RUNS:
        raise HTTPException(
            400,
            f"runs= names {len(names)} runs; a comparison holds at most {MAX_RUNS} (their curves share "
            "one chart): pick fewer",
        )
    return names


def stage_spans(path: Path) -> tuple[list[StageSpan], list[str]]:
    """The stages of the metrics file ``path`` (:func:`trine.studio.compare.add_rows`) and notes on its
    bad lines. Read incrementally: a file that only grew since the last call is read from where that
    call stopped; one that was replaced or cut back (a resumed run rewinds it) is read from the start."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return [], []
    with _spans_lock, path.open("rb") as handle:
        state = _spans.get(path)
        if state is not None and state["ino"] == stat.st_ino and state["offset"] <= stat.st_size:
            handle.seek(state["offset"] - len(state["tail"]))
            state = state if handle.read(len(state["tail"])) == state["tail"] else None
        if state is None or state["ino"] != stat.st_ino or state["offset"] > stat.st_size:
            state = {"ino": stat.st_ino, "offset": 0, "tail": b"", "lines": 0, "spans": [], "notes": []}
        handle.seek(state["offset"])
        while chunk := handle.read(CHUNK_BYTES):
            end = chunk.rfind(b"\n") + 1
            if end == 0 and len(chunk) < CHUNK_BYTES:
                break  # a line still being written
            if end == 0:  # one line longer than a chunk: skipped, as the run page skips it
                state["notes"].append(
                    f"{path.name} line {state['lines'] + 1}: over {CHUNK_BYTES} bytes (skipped)"
                )
                state["offset"] = _skip_line(handle, state["offset"] + len(chunk))
                state["lines"] += 1
                state["tail"] = b""
                handle.seek(state["offset"])
                continue
            rows, notes = _parse_lines(chunk[:end], lambda at=state["lines"]: at + 1, path.name)
            add_rows(state["spans"], rows)
            state["notes"] += notes
            state["lines"] += chunk[:end].count(b"\n")
            state["offset"] += end
            state["tail"] = (state["tail"] + chunk[:end])[-64:]
            handle.seek(state["offset"])
        if len(_spans) >= _CACHE_SIZE:
            _spans.clear()
        _spans[path] = state
        return [StageSpan(**vars(s)) for s in state["spans"]], list(state["notes"])


def run_config(run_dir: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """The run's resolved config as a mapping (None, with a note, when it is missing, too large, not YAML
    or not a mapping); parsed once per text."""
    found = read_config(run_dir)
    text = found["text"]
    if text is None:
        return None, list(found["notes"])
    cached = _configs.get(run_dir)
    if cached is not None and cached[0] is text:
        return cached[1], cached[2]
    try:
        data = yaml.safe_load(text)  # as the runs page reads it (runs.read_config)
        notes = (
            [] if isinstance(data, dict) else [f"config.yaml holds a {type(data).__name__}, not a mapping"]
        )
    except yaml.YAMLError as err:
        data, notes = None, [f"config.yaml is not valid YAML ({str(err).splitlines()[0]})"]
    config = data if isinstance(data, dict) else None
    notes = notes if config is not None else [*notes, "its config is left out of the comparison"]
    if len(_configs) >= _CACHE_SIZE:
        _configs.clear()
    _configs[run_dir] = (text, config, notes)
    return config, notes


def comparison(paths: list[Path]) -> dict[str, Any]:
    """Everything ``GET /api/compare`` answers for the run directories ``paths`` (see the module doc)."""
    runs, spans, configs, tables = [], {}, {}, {}
    for path in paths:
        summary = run_summary(path)
        spans[path.name], bad = stage_spans(path / "metrics.jsonl")
        configs[path.name], config_notes = run_config(path)
        tables[path.name] = eval_table(path)
        notes = summary["notes"] + bad + config_notes
        if not (path / "metrics.jsonl").is_file():
            notes.append("no metrics.jsonl yet: no step has been logged")
        elif not spans[path.name]:
            notes.append("metrics.jsonl has no line with a step yet")
        runs.append({**summary, "notes": list(dict.fromkeys(notes + tables[path.name]["notes"]))})
    alignment = align(spans)
    return {
        "runs": runs,
        "alignment": alignment,
        "config": config_diff(configs),
        "evals": eval_summary(tables),
        "notes": alignment["notes"],
    }


@router.get("/compare")
def compare(
    runs: str = Query(
        ..., max_length=4096, description="Two to eight run names, comma-separated: `?runs=a,b`."
    ),
    settings: StudioSettings = Depends(studio),
) -> dict[str, Any]:
    """Compare runs: their states, stage alignment, config diff and evals (see the module docstring)."""
    names = run_names(runs)
    return comparison([run_path(settings.runs_dir, name) for name in names])
