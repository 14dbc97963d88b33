"""Where explorer processes find the trainer's weight broadcast (``sync.method: broadcast``).

With ``sync.address`` set (a Ray driver sets it to a port on the trainer's node), every process uses it.
Without it, the trainer listens on a free loopback port and writes ``host:port`` to
``<run_dir>/weights/broadcast.json``; explorer processes on the same machine read it there, waiting for
a trainer that starts after them, and read it again whenever they lose the trainer: a restarted trainer
listens on another free port.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

ADDRESS_FILE = "broadcast.json"


def write_address(directory: Path, address: str) -> None:
    """Record the trainer's broadcast ``address`` (``host:port``) in ``directory`` atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".{ADDRESS_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"address": address, "pid": os.getpid(), "time": time.time()}))
    os.replace(tmp, directory / ADDRESS_FILE)


def recorded_address(directory: Path) -> str | None:
    """The address the trainer recorded in ``directory`` last, None when there is none (yet)."""
    try:
        return str(json.loads((directory / ADDRESS_FILE).read_text())["address"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def read_address(directory: Path, timeout: float | None, poll: float = 0.2) -> str:
    """The address the trainer recorded in ``directory``, waiting up to ``timeout`` seconds for it."""
    path = directory / ADDRESS_FILE
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if (address := recorded_address(directory)) is not None:
            return address
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(
                f"no trainer recorded its weight-broadcast address in {path} within {timeout}s: start "
                "`trine train` on this run directory, or set sync.address to the trainer's host:port"
            )
        time.sleep(poll)
