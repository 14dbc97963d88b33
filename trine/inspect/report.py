"""``trine status RUN_DIR``: how each process of a run stands, read from the run directory only.

A plain run has one process, its ``status.json`` (:mod:`trine.status`). An async run as processes
(:mod:`trine.launch.processes`) has the trainer's ``status.json`` and ``metrics.jsonl`` in the run
directory and one ``explorers/<i>/`` with both per explorer. :func:`run_status` gathers, without
writing anything:

- each process's state (:func:`trine.status.describe`: running, stuck — with what it waits for —, dead,
  finished, stopped, failed), its
  step (the trainer's training steps, an explorer's batches) and its weights version: the trainer's
  last ``trainer/version`` (else the newest published one), the version an explorer last explored
  with (``explorer/version``), and the explorer's lag behind the trainer (trainer − explorer);
- the buffer's depth by a counting query on the run's SQL buffer (opened as ``trine buffer`` opens it:
  the ``buffer`` section of the run's ``config.yaml``): rows by state (:mod:`trine.buffer.states`:
  pending, ready, trained, stale, expired, rolled_back, the names ``trine buffer`` and the studio use),
  and explored batches not taken yet;
- the newest published weights version (``<run_dir>/weights``, :class:`~trine.sync.published.
  PublishedWeights`);
- the alarms the run raised (``status.json``'s ``alarms``, :mod:`trine.monitor.alarms`), one line each.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trine.status import describe, read_status

_PUBLISHED = re.compile(r"^v(\d+)$")  # as trine.sync.published names a published version
TAIL_BYTES = 1 << 16
"""How much of a metrics file's end is read at a time when looking for a key's last value."""


@dataclass
class ProcessStatus:
    """One process of a run: ``name`` (``trainer``, ``explorer 0``), its ``state`` (as
    :func:`trine.status.describe` says, or ``absent`` / ``unknown`` when it wrote no status), ``why``,
    ``step`` (trainer: steps; explorer: batches), weights ``version`` and (explorers) ``lag``."""

    name: str
    state: str
    why: str = ""
    step: int | None = None
    version: int | None = None
    lag: int | None = None
    pid: int | None = None
    host: str | None = None
    heartbeat: str | None = None
    alarms: list[dict[str, Any]] = field(default_factory=list)
    """Alarms the process raised (``status.json``'s ``alarms``: :mod:`trine.monitor.alarms`)."""
    threads: int | None = None
    """Its torch threads (:mod:`trine.threads`)."""
    cores: str | None = None
    """The cores its role was pinned to (``1-3``; None: any)."""
    stuck: dict[str, Any] | None = None
    """While ``stuck``: ``status.json``'s record (since, seconds, median step, what each side waits for)."""


@dataclass
class BufferDepth:
    """Rows of a run's SQL buffer by state (all processes; :mod:`trine.buffer.states`), and the
    explored batches not taken yet."""

    pending: int
    ready: int
    trained: int
    stale: int
    expired: int
    """Dropped: their reward did not come within ``buffer.pending_timeout``."""
    rolled_back: int
    batches_waiting: int

    def line(self) -> str:
        """``0 pending, 48 ready, 112 trained, 16 stale`` (+ expired and rolled_back rows when there
        are any): each state by its name."""
        from trine.buffer.states import EXPIRED, ROLLED_BACK, STATES

        counts = asdict(self)
        shown = [s for s in STATES if counts[s] or s not in (EXPIRED, ROLLED_BACK)]
        return ", ".join(f"{counts[s]} {s}" for s in shown)


@dataclass
class RunStatus:
    """Everything ``trine status`` reports on one run directory."""

    run_dir: Path
    trainer: ProcessStatus
    explorers: list[ProcessStatus] = field(default_factory=list)
    processes: bool = False
    """True when the run has explorer processes (an ``explorers/`` directory)."""
    buffer: BufferDepth | None = None
    buffer_note: str = ""
    """Why there is no buffer depth (memory buffer, no config, no database yet), else empty."""
    published: int | None = None
    reward: str = ""
    """What the trainer process of a served run or a run with explorer processes trained on: its last
    step's mean reward, and the mean of the newest complete weights version (:func:`reward_text`)."""

    @property
    def exit_code(self) -> int:
        """0 running/stuck/finished/stopped, 1 dead/failed (or an explorer dead/failed while the trainer
        runs), 2 no run (no trainer ``status.json``)."""
        if self.trainer.state == "absent":
            return 2
        if self.trainer.state in ("dead", "failed"):
            return 1
        broken = any(e.state in ("dead", "failed") for e in self.explorers)
        return 1 if broken and self.trainer.state in ("running", "stuck") else 0

    def lines(self) -> list[str]:
        """The text ``trine status`` prints: one line for a plain run (as always), else a header, one
        line per process, the buffer and the published weights."""
        t = self.trainer
        alarms = [f"  ALARM {a.get('kind')} at step {a.get('step')}: {a.get('message')}" for a in self.alarms]
        if not self.processes:
            line = f"{self.run_dir}: {t.state} at step {'?' if t.step is None else t.step}"
            rewards = [f"  reward: {self.reward}"] if self.reward else []
            return [f"{line} ({t.why.splitlines()[0]})" if t.why else line, *rewards, *alarms]
        count = len(self.explorers)
        out = [f"{self.run_dir}: trainer and {count} explorer{'s' if count != 1 else ''}"]
        out += [f"  {_process_line(p)}" for p in (t, *self.explorers)]
        out.append(f"  buffer: {self.buffer.line() if self.buffer else self.buffer_note}")
        if self.buffer and self.buffer.batches_waiting:
            out[-1] += f"; {self.buffer.batches_waiting} explored batches {self._batches_word()}"
        shown = "none yet" if self.published is None else f"version {self.published}"
        out.append(f"  weights: published {shown}")
        if self.reward:
            out.append(f"  reward: {self.reward}")
        return out + alarms

    @property
    def alarms(self) -> list[dict[str, Any]]:
        """Every process's alarms, the trainer's first."""
        return [a for p in (self.trainer, *self.explorers) for a in p.alarms]

    def _batches_word(self) -> str:
        """What the explored batches not taken are: ``waiting`` while the trainer may still take them
        (running, or stopped/failed and resumable), ``left over`` once it has finished (explorers run
        ahead of the last step by up to the staleness bound; those batches are never trained)."""
        return (
            "left over (explored past the last step; not trained)"
            if self.trainer.state == "finished"
            else "waiting"
        )

    def as_dict(self) -> dict[str, Any]:
        """The same as one JSON-able object (``trine status --json``)."""
        return {
            "run_dir": str(self.run_dir),
            "state": self.trainer.state,
            "step": self.trainer.step,
            "exit_code": self.exit_code,
            "trainer": asdict(self.trainer),
            "explorers": [asdict(e) for e in self.explorers],
            "buffer": asdict(self.buffer) if self.buffer else None,
            "buffer_note": self.buffer_note or None,
            "published_version": self.published,
            "reward": self.reward or None,
            "alarms": self.alarms,
        }


def _process_line(p: ProcessStatus) -> str:
    why = f" ({p.why.splitlines()[0]})" if p.why else ""
    if p.name == "trainer" and p.state == "absent":
        return "trainer: not started (no status.json yet; explorers wait for its first weights)"
    if p.name == "trainer":
        version = "" if p.version is None else f", version {p.version}"
        return f"trainer: {p.state} at step {'?' if p.step is None else p.step}{version}{_threads(p)}{why}"
    parts = [p.state]
    if p.step is not None:
        parts.append(f"{p.step} batch{'es' if p.step != 1 else ''}")
    if p.version is not None:
        parts.append(f"weights version {p.version}" + ("" if p.lag is None else f" (lag {p.lag})"))
    return f"{p.name}: {', '.join(parts)}{_threads(p)}{why}"


def _threads(p: ProcessStatus) -> str:
    """``, 1 thread on cores 1`` (a process pinned to its role's cores), ``, 2 threads`` or ''."""
    if p.threads is None or p.state not in ("running", "stuck", "finished", "stopped"):
        return ""
    where = (
        f" on core{'s' if p.cores and ('-' in p.cores or ',' in p.cores) else ''} {p.cores}"
        if p.cores
        else ""
    )
    return f", {p.threads} thread{'s' if p.threads != 1 else ''}{where}"


def run_status(run_dir: str | Path, details: bool = False) -> RunStatus:
    """How the run in ``run_dir`` stands (see the module docstring). The buffer and the published
    weights are read for a run with explorer processes, or for any run with ``details=True``."""
    run_dir = Path(run_dir)
    trainer = process_status("trainer", run_dir, "trainer/version")
    explorer_dirs = sorted(
        (p for p in (run_dir / "explorers").glob("*") if p.is_dir() and p.name.isdigit()),
        key=lambda p: int(p.name),
    )
    report = RunStatus(run_dir, trainer, processes=(run_dir / "explorers").is_dir())
    if report.processes or (run_dir / "servers").is_dir():  # a trainer process (`trine train`)
        report.reward = reward_text(run_dir / "metrics.jsonl")
    if not (report.processes or details):
        return report
    report.published = published_version(run_dir)
    if trainer.version is None:
        trainer.version = report.published
    for path in explorer_dirs:
        explorer = process_status(f"explorer {path.name}", path, "explorer/version")
        if explorer.version is not None and trainer.version is not None:
            explorer.lag = trainer.version - explorer.version
        report.explorers.append(explorer)
    report.buffer, report.buffer_note = buffer_depth(run_dir)
    return report


def process_status(name: str, directory: Path, version_key: str) -> ProcessStatus:
    """The process whose ``status.json`` and ``metrics.jsonl`` are in ``directory``."""
    try:
        record = read_status(directory)
    except FileNotFoundError as err:
        if name == "trainer":
            return ProcessStatus(name, "absent", str(err))
        why = "no status.json yet: starting, or it failed before its first heartbeat"
        return ProcessStatus(name, "unknown", why)
    except ValueError as err:  # a torn or foreign file (status.json is replaced atomically by trine)
        return ProcessStatus(name, "unknown", f"{directory / 'status.json'} is not valid JSON: {err}")
    state, why = describe(record)
    version = last_value(directory / "metrics.jsonl", version_key)
    step = record.get("step")
    return ProcessStatus(
        name,
        state,
        why,
        step=int(step) if isinstance(step, (int, float)) else None,
        version=None if version is None else int(version),
        pid=record.get("pid"),
        host=record.get("host"),
        heartbeat=record.get("heartbeat"),
        alarms=[a for a in record.get("alarms") or [] if isinstance(a, dict)],
        threads=record.get("threads") if isinstance(record.get("threads"), int) else None,
        cores=str(record["cores"]) if record.get("cores") else None,
        stuck=record.get("stuck") if state == "stuck" and isinstance(record.get("stuck"), dict) else None,
    )


def reward_text(metrics: Path) -> str:
    """``0.42 at the last step; weights version 11: 0.4 (128 rows)`` from a trainer's metrics
    (``trainer/reward_mean``, :data:`trine.status.REWARD_VERSION` ...); empty before its first reward."""
    from trine.status import REWARD_VERSION, REWARD_VERSION_MEAN, REWARD_VERSION_ROWS

    last, version = last_value(metrics, "trainer/reward_mean"), last_value(metrics, REWARD_VERSION)
    parts = [] if last is None else [f"{last:.3g} at the last step"]
    mean, rows = last_value(metrics, REWARD_VERSION_MEAN), last_value(metrics, REWARD_VERSION_ROWS)
    if version is not None and mean is not None:
        parts.append(f"weights version {version:.0f}: {mean:.3g} ({rows or 0:.0f} rows)")
    return "; ".join(parts)


def last_value(path: Path, key: str) -> float | None:
    """The value of ``key`` in the last line of the jsonl file ``path`` that has it (None: no file, or
    no line has it). Reads the file from its end, so a long run's metrics cost only their tail."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return None
    with handle:
        end = handle.seek(0, os.SEEK_END)
        carry = b""
        while end > 0:
            start = max(0, end - TAIL_BYTES)
            handle.seek(start)
            chunk = handle.read(end - start) + carry
            lines = chunk.split(b"\n")
            carry = lines.pop(0) if start > 0 else b""  # maybe a partial line: joined to the next chunk
            for line in reversed(lines):
                value = _value(line, key)
                if value is not None:
                    return value
            end = start
    return None


def _value(line: bytes, key: str) -> float | None:
    if key.encode() not in line:
        return None
    try:
        value = json.loads(line).get(key)
    except ValueError:  # a line torn by a crash mid-write
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def published_version(run_dir: Path) -> int | None:
    """The newest weights version published into ``<run_dir>/weights`` (None: none): what
    :meth:`trine.sync.published.PublishedWeights.latest` says (a complete ``vNNNNNNNN/`` with its
    ``meta.json``), read here without importing torch so that ``trine status`` answers at once."""
    try:
        entries = list(os.scandir(run_dir / "weights"))
    except FileNotFoundError:
        return None
    found = [
        int(e.name[1:])
        for e in entries
        if _PUBLISHED.match(e.name) and os.path.isfile(os.path.join(e.path, "meta.json"))
    ]
    return max(found, default=None)


def buffer_depth(run_dir: Path) -> tuple[BufferDepth | None, str]:
    """The run's SQL buffer counted by status, or None and why not (another storage, no database)."""
    from trine.buffer.inspect import run_buffer_config
    from trine.buffer.open import open_buffer, storage_class
    from trine.buffer.sql import SQLBuffer

    if not (run_dir / "config.yaml").is_file():
        return None, f"unknown (no {run_dir / 'config.yaml'} to find the buffer in)"
    try:
        config = run_buffer_config(run_dir)
        if not issubclass(storage_class(config), SQLBuffer):
            return None, (
                f"not shown for buffer.storage {config.storage!r} (only a SQL buffer can be read from "
                "outside the run; `trine buffer stats RUN_DIR` shows what a file buffer holds)"
            )
        buffer = open_buffer(config, run_dir)  # connects only when used: this takes its url and table
        buffer.close()
    except (ValueError, TypeError, ImportError) as err:
        return None, f"unreadable ({err})"
    return sql_depth(buffer.url, buffer.table_name)


def sql_depth(url: str, table_name: str) -> tuple[BufferDepth | None, str]:
    """:class:`BufferDepth` of ``table_name`` at ``url``, by the states ``trine buffer stats`` and the
    studio count (:func:`trine.buffer.states.sql_state_counts`; ``ready`` and ``stale`` as the buffer's
    own ``buffer/size`` and ``buffer/dropped_stale``); read only (a SQLite file that does not exist yet is not created)."""
    import sqlalchemy as sa

    from trine.buffer.sql_sampling import batches_waiting
    from trine.buffer.sql_schema import build_batches_table, build_table
    from trine.buffer.states import STATES, sql_state_counts

    parsed = sa.make_url(url)
    sqlite = parsed.get_backend_name() == "sqlite"
    if sqlite and not Path(parsed.database or "").is_file():
        return None, f"no database yet ({parsed.database} does not exist)"
    engine = sa.create_engine(parsed, connect_args={"timeout": 10.0} if sqlite else {})
    try:
        with engine.connect() as conn:
            tables = sa.inspect(conn)
            if not tables.has_table(table_name):
                return BufferDepth(**dict.fromkeys(STATES, 0), batches_waiting=0), ""
            t = build_table(sa.MetaData(), table_name)
            counts = sql_state_counts(conn, t)
            b = build_batches_table(t.metadata, table_name)
            waiting = batches_waiting(conn, b) if tables.has_table(b.name) else 0
    except sa.exc.SQLAlchemyError as err:
        return None, f"unreadable ({type(err).__name__}: {str(err).splitlines()[0]})"
    finally:
        engine.dispose()
    depth = BufferDepth(**counts, batches_waiting=waiting)
    return depth, ""
