"""Metric sinks: where the flat per-step metrics dict goes.

Every sink has ``log(metrics, step)`` and ``close()``, and may have ``log_table(name, rows, step)``. ``metrics`` is one flat dict per step with
namespaced keys (``explorer/reward_mean``, ``trainer/loss``, ``eval/<taskset>/accuracy``, ...);
values are numbers, except an optional ``"stage"`` string (e.g. ``"sft"``, ``"grpo"``) that the
JSONL and console sinks keep and the scalar sinks skip. ``Monitor`` fans one call out to many sinks.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

DEFAULT_CONSOLE_KEYS = [
    "explorer/reward_mean",
    "eval/*/accuracy",
    "trainer/loss",
    "trainer/kl",
    "explorer/response_length_mean",
    "time/step_seconds",
]
_LABELS = {
    "explorer/reward_mean": "reward",
    "trainer/loss": "loss",
    "trainer/kl": "kl",
    "explorer/response_length_mean": "len",
    "time/step_seconds": "time",
}


def to_float(value: Any) -> float | None:
    """``value`` as a float (numbers, bools, numpy/torch scalars), or None if it is not a number."""
    if isinstance(value, (str, bytes)) or value is None:
        return None
    if hasattr(value, "item"):
        try:
            value = value.item()
        except (ValueError, RuntimeError):  # not a one-element tensor/array
            return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of ``metrics`` as floats (strings such as ``"stage"`` are dropped)."""
    out = {}
    for key, value in metrics.items():
        number = to_float(value)
        if number is not None:
            out[key] = number
    return out


REWARD_KEYS = ("explorer/reward_mean", "trainer/reward_mean", "explorer/reward_pending")
"""The metrics behind a step line's ``reward``: see :func:`reward_text`."""


def reward_text(numbers: dict[str, float]) -> str | None:
    """The ``reward ...`` part of a console line: the explored batch's mean (``explorer/reward_mean``),
    else the trained batch's (``trainer/reward_mean``: the explorer is another process, or its rewards
    were still pending when it reported), else ``reward pending N`` (rewards not given yet), else a NaN
    explorer mean as it is; None when the metrics have no reward at all."""
    explored = numbers.get("explorer/reward_mean")
    if explored is not None and math.isfinite(explored):
        return f"reward {fmt_number(explored)}"
    trained = numbers.get("trainer/reward_mean")
    if trained is not None and math.isfinite(trained):
        return f"reward {fmt_number(trained)}"
    pending = numbers.get("explorer/reward_pending")
    if pending:
        return f"reward pending {pending:.0f}"
    return None if explored is None else f"reward {fmt_number(explored)}"


def fmt_number(value: float) -> str:
    """A metric value for a console line: 3 significant digits (no decimals from 100 on)."""
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 1e6:
        return f"{value:.3g}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def _clock(seconds: float) -> str:
    return str(timedelta(seconds=int(max(seconds, 0))))


def _label(key: str) -> str:
    if key in _LABELS:
        return _LABELS[key]
    parts = key.split("/")
    if len(parts) == 3 and parts[0] == "eval":  # eval/<taskset>/accuracy -> <taskset>/acc
        return f"{parts[1]}/{'acc' if parts[2] == 'accuracy' else parts[2]}"
    return "/".join(parts[1:]) if len(parts) > 1 else key


class ConsoleSink:
    """A rich progress bar plus one concise line per step.

    The line's ``reward`` is the explored batch's, or where the explorer runs in another process (or its
    rewards are pending) the trained batch's (:func:`reward_text`).

    On a terminal the bar (steps, elapsed, ETA) stays at the bottom and the step lines scroll above
    it. When the output is not a terminal (CI logs, files) there is no bar and no control codes:
    each step line ends with ``[elapsed<eta]`` instead. ``keys`` are metric keys or glob patterns
    (``eval/*/accuracy``) to show, in order; ``every`` prints a line every N steps (the first and
    last steps always print). ``step`` is the number of completed steps (the loop counts from 1).
    """

    def __init__(
        self,
        total_steps: int | None = None,
        keys: list[str] | None = None,
        every: int = 1,
        console: Any = None,
        file: IO[str] | None = None,
    ):
        from rich.console import Console

        if every < 1:
            raise ValueError(f"ConsoleSink every={every}; expected a positive number of steps, e.g. every=1.")
        self.total_steps = total_steps
        self.keys = list(keys) if keys is not None else list(DEFAULT_CONSOLE_KEYS)
        self.every = every
        self.console = console if console is not None else Console(file=file, highlight=False)
        self.fancy = self.console.is_terminal and not self.console.is_dumb_terminal
        self._progress: Any = None
        self._task: Any = None
        self._started = time.monotonic()
        self._first: tuple[int, float] | None = None  # (step, time) of the first log

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Advance the bar to ``step`` and print the step line (every ``every`` steps)."""
        now = time.monotonic()
        if self._first is None:
            self._first = (step, now)
        if self.fancy:
            self._advance(step)
        last = self.total_steps is not None and step >= self.total_steps
        if step % self.every == 0 or last or self._first[0] == step:
            self.console.print(self.format_line(metrics, step, now), soft_wrap=True, markup=False)

    def format_line(self, metrics: dict[str, Any], step: int, now: float | None = None) -> str:
        """The one-line summary of a step, e.g. ``step 12/100 | reward 0.532 | loss 0.0123 ...``."""
        total = f"/{self.total_steps}" if self.total_steps else ""
        stage = metrics.get("stage")
        parts = [f"{f'[{stage}] ' if isinstance(stage, str) else ''}step {step}{total}"]
        numbers = scalars(metrics)
        for key in self._matching(numbers):
            if key == REWARD_KEYS[0]:
                parts.append(reward_text(numbers) or "")
                continue
            value = numbers[key]
            parts.append(
                f"time {value:.2f}s" if key == "time/step_seconds" else f"{_label(key)} {fmt_number(value)}"
            )
        if not self.fancy:
            parts.append(self._timing(metrics, step, time.monotonic() if now is None else now))
        return " | ".join(parts)

    def _matching(self, numbers: dict[str, float]) -> list[str]:
        found: list[str] = []
        for pattern in self.keys:
            hits = sorted(fnmatch.filter(numbers, pattern)) if "*" in pattern else [pattern]
            if pattern == REWARD_KEYS[0] and reward_text(numbers) is not None:
                found += [pattern] if pattern not in found else []  # shown by reward_text, whichever is there
                continue
            found += [key for key in hits if key in numbers and key not in found]
        return found

    def _timing(self, metrics: dict[str, Any], step: int, now: float) -> str:
        elapsed = _clock(now - self._started)
        if not self.total_steps or self._first is None:
            return f"[{elapsed}]"
        first_step, first_time = self._first
        if step > first_step:
            per_step = (now - first_time) / (step - first_step)
        else:
            per_step = to_float(metrics.get("time/step_seconds"))
        if per_step is None or not math.isfinite(per_step):
            return f"[{elapsed}<?]"
        return f"[{elapsed}<{_clock(per_step * max(self.total_steps - step, 0))}]"

    def _advance(self, step: int) -> None:
        if self._progress is None:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            columns = [TextColumn("[bold]steps"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
            columns.append(TimeRemainingColumn())
            self._progress = Progress(*columns, console=self.console)
            self._progress.start()
            self._task = self._progress.add_task("steps", total=self.total_steps, completed=max(step - 1, 0))
        self._progress.update(self._task, completed=step)

    def close(self) -> None:
        """Stop the progress bar (leaving its last state on screen)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, bool)) or value is None:
        return value
    number = to_float(value)
    if number is None:
        return str(value)
    if not math.isfinite(number):
        return None
    return int(number) if isinstance(value, int) else number


class JsonlSink:
    """Appends ``{"step": N, **metrics}`` as one JSON line per step, flushed and fsynced each line.

    ``path`` is the file (``run_dir/metrics.jsonl``) or a directory to write ``metrics.jsonl`` in.
    Non-finite numbers are written as ``null``. A partial last line left by a crash is cut off when
    the file is reopened, so appending after a resume keeps the file valid. ``timestamp=True`` adds
    ``"time/unix"`` (wall-clock unix seconds) to every line, so the metrics of several processes can
    be drawn on one time axis (``trine plot``); being a ``time/*`` key, comparisons of runs skip it.
    """

    def __init__(self, path: str | Path, timestamp: bool = False):
        path = Path(path)
        self.timestamp = timestamp
        self.path = path / "metrics.jsonl" if path.is_dir() else path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _cut_partial_line(self.path)
        self._file: IO[str] | None = self.path.open("a", encoding="utf-8")

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Write one line and flush it to disk."""
        if self._file is None:
            raise RuntimeError(f"JsonlSink({str(self.path)!r}) is closed; create a new sink to log again.")
        record = {"step": int(step)}
        record.update({key: _jsonable(value) for key, value in metrics.items() if key != "step"})
        if self.timestamp:
            record["time/unix"] = round(time.time(), 3)
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def _cut_partial_line(path: Path) -> None:
    if not path.is_file() or path.stat().st_size == 0:
        return
    with path.open("rb+") as handle:
        data = handle.read()
        if not data.endswith(b"\n"):
            handle.truncate(data.rfind(b"\n") + 1)


def read_metrics(path: str | Path, drop_rewound: bool = False) -> list[dict[str, Any]]:
    """Load a ``metrics.jsonl`` (or the one inside a run directory) as a list of dicts.

    A truncated last line (a crash mid-write) is ignored; a bad line elsewhere raises ValueError.
    ``drop_rewound=True`` handles resumed runs: when the step goes back (the run restarted from an
    earlier checkpoint), the earlier records from that step on are dropped so each step appears once.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(
            f"metrics file {str(path)!r} does not exist; expected the metrics.jsonl that the "
            f"'jsonl' monitor sink writes into the run directory."
        )
    lines = path.read_text(encoding="utf-8").split("\n")
    records: list[dict[str, Any]] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            if number == len(lines):  # no newline after it: a truncated last line
                break
            raise ValueError(f"{path}:{number} is not valid JSON ({err}); fix or delete that line.") from err
        if drop_rewound and records and "step" in record:
            top = max(r.get("step", -math.inf) for r in records)
            if record["step"] < top:
                records = [r for r in records if r.get("step", -math.inf) < record["step"]]
        records.append(record)
    return records


class TensorBoardSink:
    """Writes every numeric metric as a TensorBoard scalar (``add_scalar(key, value, step)``) and
    tables as markdown text.

    ``purge_step``: the first step this run writes (checkpoint step + 1 on resume, 0 for a fresh
    start); events a crashed run wrote at that step or later are hidden from TensorBoard, so each
    step shows once (``SummaryWriter(purge_step=...)``).
    """

    def __init__(self, log_dir: str | Path, purge_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = Path(log_dir)
        self.writer: Any = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Add one scalar per numeric key and flush the event file."""
        for key, value in scalars(metrics).items():
            self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        """Add ``rows`` as a markdown table (TensorBoard's Text tab) called ``name`` at ``step``."""
        if not rows:
            return
        columns = list(dict.fromkeys(key for row in rows for key in row))

        def cell(value: Any) -> str:
            return str(value).replace("|", "\\|").replace("\n", "<br>")

        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
        self.writer.add_text(name, "\n".join(lines), global_step=step)
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


def _require(module: str, sink: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"the {sink!r} monitor sink needs the {module!r} package, which is not installed; "
            f"run `pip install {module}` or remove {sink!r} from the monitor sinks."
        ) from err


class Monitor:
    """Fans ``log`` and ``close`` out to several sinks; use it as a context manager."""

    def __init__(self, sinks: list[Any] | tuple[Any, ...] = ()):
        self.sinks = list(sinks)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Send one step's metrics to every sink."""
        for sink in self.sinks:
            sink.log(metrics, step)

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        """Send a table (``rows``: dicts with the same keys, e.g. eval samples) to every sink that
        takes tables (those with a ``log_table`` method: tensorboard, wandb, mlflow)."""
        for sink in self.sinks:
            if hasattr(sink, "log_table"):
                sink.log_table(name, rows, step)

    def close(self) -> None:
        """Close every sink, even if one fails (the first error is raised afterwards)."""
        error: BaseException | None = None
        for sink in self.sinks:
            try:
                sink.close()
            except Exception as err:  # enrich: close the rest, then re-raise
                error = error or err
        if error is not None:
            raise error

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def build_monitor(
    names: list[str],
    run_dir: str | Path,
    *,
    total_steps: int | None = None,
    run_name: str | None = None,
    config: dict[str, Any] | None = None,
    options: dict[str, dict[str, Any]] | None = None,
    resume_step: int | None = None,
) -> Monitor:
    """A Monitor with the named sinks, wired to the standard run-directory layout.

    ``names`` are built-in sink names or ``"package.module:attr"`` classes. Built-ins get their usual
    arguments (``run_dir/metrics.jsonl``, ``run_dir/tensorboard``, ``total_steps``, ``run_name``,
    ``config``); ``options[name]`` adds or overrides keyword arguments for that sink.
    ``resume_step`` is the step the run continues from (its checkpoint's, 0 for a fresh start; None
    when not a Trine run): TensorBoard purges later events, W&B and MLflow continue their run, and
    the jsonl lines carry ``time/unix`` (see :class:`JsonlSink`).
    """
    from trine.registry import resolve

    run_dir = Path(run_dir)
    name = run_name or run_dir.name
    defaults: dict[str, dict[str, Any]] = {
        "console": {"total_steps": total_steps},
        "jsonl": {"path": run_dir / "metrics.jsonl"},
        "tensorboard": {"log_dir": run_dir / "tensorboard"},
        "wandb": {"name": name, "config": config},
        "mlflow": {"run_name": name, "config": config},
    }
    if resume_step is not None:
        defaults["tensorboard"]["purge_step"] = resume_step + 1 if resume_step else 0
        defaults["jsonl"]["timestamp"] = True
        for tracker in ("wandb", "mlflow"):
            defaults[tracker].update(run_dir=run_dir, resume_step=resume_step)
    sinks = []
    for sink_name in names:
        kwargs = {**defaults.get(sink_name, {}), **(options or {}).get(sink_name, {})}
        sinks.append(resolve("monitor", sink_name)(**kwargs))
    return Monitor(sinks)
