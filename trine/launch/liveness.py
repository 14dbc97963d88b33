"""Is the other side of an async run as processes (:mod:`trine.launch.processes`) still there?

Each process of the run keeps a ``status.json`` (:class:`trine.status.Heartbeat`): the trainer in the run
directory, explorer ``i`` in ``explorers/<i>/``, with its pid, its host and a heartbeat that a daemon
thread refreshes every :func:`trine.status.beat_interval` seconds (a quarter of ``sync.wait_timeout``
at most), whatever the process is busy with: a long step, an evaluation, a wait for the other side.
Each side reads the other's:

- :func:`look`: what one status file says now: ``alive`` (running, its pid exists and its heartbeat is
  at most ``sync.wait_timeout`` old), ``dead`` (running, but its pid is gone, checked on the host that
  wrote it only, or its heartbeat is older: killed, hung or frozen), ``finished`` / ``stopped`` /
  ``failed``, or ``absent`` (no status file yet);
- :class:`Patience`: a side gives up once the other side's newest sign of life (a heartbeat, an end)
  and the start of its own wait are both ``sync.wait_timeout`` old. A process killed outright is thus
  given up within ``wait_timeout`` of its death (its last heartbeat came before), and one restarted
  inside that window (a new pid and a fresh heartbeat) ends the wait: the other side goes on;
- :class:`TrainerWatch` (an explorer's view of its trainer) and :class:`ExplorersWatch` (the trainer's
  view of its explorers) say what they saw, how long they waited and how to continue; the process then
  raises :class:`PeerGone` (exit code 1, its status ``failed`` with that message).

A heartbeat written on another host is compared with this host's clock: keep the clocks in step (NTP).
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from trine.status import pid_alive

ENDED = ("finished", "stopped", "failed")
"""The final states a status file records."""
HOW_TO_RESUME = "`trine train CONFIG` on {run_dir} (it resumes from its last checkpoint)"


class PeerGone(RuntimeError):
    """The other side of an async run as processes is gone (dead, hung, or ended) and did not come back
    within ``sync.wait_timeout``; the message says what was seen and how to continue."""


@dataclass(frozen=True)
class Seen:
    """What one process's ``status.json`` says now (see :func:`look`)."""

    name: str
    """``the trainer`` or ``explorer <i>``."""
    state: str
    """``alive``, ``dead``, ``finished``, ``stopped``, ``failed`` or ``absent``."""
    why: str
    """What was seen, for a message: ``its process no longer exists; last heartbeat 9s ago``."""
    last_sign: float | None = None
    """Unix time of its last sign of life: its last heartbeat, or when it ended (None: absent)."""
    pid: int | None = None
    host: str | None = None

    def label(self) -> str:
        """``the trainer (pid 123 on host-a)``."""
        return self.name + (f" (pid {self.pid} on {self.host})" if self.pid is not None else "")


def look(directory: str | Path, name: str, stale_after: float | None, now: float | None = None) -> Seen:
    """What ``directory/status.json`` says about process ``name`` at ``now`` (unix time; default: now).
    A running process whose heartbeat is older than ``stale_after`` seconds (None: never) is ``dead``."""
    now = time.time() if now is None else now
    path = Path(directory) / "status.json"
    try:
        record = json.loads(path.read_text())
        written = path.stat().st_mtime
    except FileNotFoundError:
        return Seen(name, "absent", f"{path} does not exist yet")
    except (OSError, ValueError) as err:  # a foreign or torn file (trine replaces it atomically)
        return Seen(name, "absent", f"{path} cannot be read ({err})")
    if not isinstance(record, dict):
        return Seen(name, "absent", f"{path} holds {type(record).__name__}, not a status record")
    pid, host, state = _int(record.get("pid")), record.get("host"), record.get("state")
    if state in ENDED:
        detail = str(record.get("reason") or record.get("error") or "").strip().splitlines()
        why = f"it ended {state}" + (f" ({detail[0][:300]})" if detail else "")
        return Seen(name, state, why, _unix(record.get("ended_at")) or written, pid, host)
    beat = _unix(record.get("heartbeat")) or written  # a status without a heartbeat: when it was written
    age = max(0.0, now - beat)
    if pid is not None and host == socket.gethostname() and not pid_alive(pid):
        return Seen(
            name, "dead", f"its process no longer exists; last heartbeat {age:.0f}s ago", beat, pid, host
        )
    if stale_after is not None and age > stale_after:
        why = f"no heartbeat for {age:.0f}s (hung, frozen, or on a machine that is gone)"
        return Seen(name, "dead", why, beat, pid, host)
    return Seen(name, "alive", f"running, last heartbeat {age:.0f}s ago", beat, pid, host)


def _int(value: Any) -> int | None:
    """A status file's pid as an int (None: missing or not a number)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _unix(value: Any) -> float | None:
    """A status file's time (ISO 8601 as :mod:`trine.status` writes it, or unix seconds) as unix time."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except (TypeError, ValueError):
        return None


class Patience:
    """How long a side has had no sign of life from the other: since the newest ``last_sign`` among
    what it sees, or since ``since`` (unix time; default: now), the start of its own wait, if later.
    ``limit``: ``sync.wait_timeout`` (None: wait forever)."""

    def __init__(self, limit: float | None, since: float | None = None) -> None:
        self.limit = limit
        self.since = time.time() if since is None else since

    def silent_for(self, seen: list[Seen], now: float | None = None) -> float:
        """Seconds since the newest sign of life among ``seen``, or since this wait began if later."""
        now = time.time() if now is None else now
        return max(0.0, now - max([self.since, *(s.last_sign for s in seen if s.last_sign is not None)]))

    def over(self, seen: list[Seen], now: float | None = None) -> bool:
        """True once none of ``seen`` is alive and :meth:`silent_for` reached ``limit``."""
        if self.limit is None or any(s.state == "alive" for s in seen):
            return False
        return self.silent_for(seen, now) >= self.limit


class TrainerWatch:
    """Explorer ``index`` of ``count``'s view of the trainer of ``run_dir``: :meth:`check` says (and
    keeps in :attr:`gone`) why to give up on it. A trainer that never wrote a status is not judged
    (the explorer's wait for the first weights is bounded by ``wait_timeout`` already), nor one that
    finished (the run is over)."""

    def __init__(
        self, run_dir: Path, limit: float | None, index: int, count: int, since: float | None = None
    ):
        self.run_dir, self.index, self.count = Path(run_dir), index, count
        self.patience = Patience(limit, since)
        self.gone: str | None = None

    def check(self, now: float | None = None) -> str | None:
        """The message to stop with once the trainer is gone for ``wait_timeout``, else None."""
        seen = look(self.run_dir, "the trainer", self.patience.limit, now)
        if seen.state in ("absent", "alive", "finished") or not self.patience.over([seen], now):
            return None
        self.gone = (
            f"{seen.label()} is gone: {seen.why}. This explorer waited "
            f"{self.patience.silent_for([seen], now):.0f}s for a trainer to come back (sync.wait_timeout: "
            f"{self.patience.limit:g}s) and stops. To continue, start "
            f"{HOW_TO_RESUME.format(run_dir=self.run_dir)}, then this explorer again: `trine explore CONFIG "
            f"--explorer-id {self.index} --explorers {self.count}` (it goes on after the last batch it put)."
        )
        return self.gone


class ExplorersWatch:
    """The trainer's view of the explorer processes of ``run_dir``: those that wrote a status file
    (``explorers/<i>/status.json``)."""

    def __init__(self, run_dir: Path, limit: float | None, since: float | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.patience = Patience(limit, since)

    def seen(self, now: float | None = None) -> list[Seen]:
        """Each explorer that wrote a status file, as it stands, by index."""
        found = [
            look(d, f"explorer {d.name}", self.patience.limit, now)
            for d in sorted(self.run_dir.glob("explorers/*"), key=lambda d: (len(d.name), d.name))
            if d.name.isdigit()
        ]
        return [s for s in found if s.state != "absent"]

    def check(self, now: float | None = None) -> str | None:
        """The message to stop with once every explorer is dead, stopped or failed and none came back
        within ``wait_timeout``; None while one is alive or finished (its tasks ran out: the trainer
        then waits for a batch as long as it would anyway), or when none wrote a status."""
        seen = self.seen(now)
        if not seen or any(s.state == "finished" for s in seen) or not self.patience.over(seen, now):
            return None
        return (
            "every explorer is gone and no batch arrived: "
            + "; ".join(f"{s.label()}: {s.why}" for s in seen)
            + f". The trainer waited {self.patience.silent_for(seen, now):.0f}s for one to come back "
            f"(sync.wait_timeout: {self.patience.limit:g}s) and stops. To continue, start the explorers "
            "again (`trine explore CONFIG --explorer-id I --explorers N` for each I) and "
            f"{HOW_TO_RESUME.format(run_dir=self.run_dir)}."
        )

    def summary(self, now: float | None = None) -> str:
        """``explorer 0 (pid 12 on h): running, last heartbeat 1s ago; explorer 1 (...): ...``, or ``""``
        when no explorer wrote a status."""
        return "; ".join(f"{s.label()}: {s.why}" for s in self.seen(now))
