"""Alerts: what happens to a run, sent to a webhook and/or a command (``monitor.alerts``).

:class:`Alerts` takes the section (:class:`trine.config.watch.AlertsConfig`). :meth:`Alerts.send` builds
the alert and puts it on a bounded queue, at once, whatever the receiver does; a daemon thread delivers
each in turn:

- ``url``: a ``POST`` of the alert as JSON (``Content-Type: application/json``, standard library only);
- ``command``: run with the JSON on stdin and ``TRINE_ALERT_EVENT``, ``TRINE_ALERT_RUN``,
  ``TRINE_ALERT_RUN_DIR``, ``TRINE_ALERT_STAGE``, ``TRINE_ALERT_STEP``, ``TRINE_ALERT_REASON`` in its
  environment (a string through the shell, a list as the program and its arguments), killed with its
  process group past the timeout.

Each delivery is bounded by ``timeout_seconds``. A failure (refused, timed out, an HTTP error, a non-zero
exit) is logged once per destination, then counted (:attr:`Alerts.failures`), and never raised; a full queue
drops the alert and counts it (:attr:`Alerts.dropped`). :meth:`Alerts.close` waits for the alerts still
queued at most ``timeout_seconds`` in all, so the end of a run is never delayed longer.

The alert, one JSON object::

    {"event": "stuck", "run": "arithmetic", "run_dir": "/abs/runs/arithmetic", "stage": "grpo", "step": 12,
     "reason": "step 12 has not advanced for 640s (...)", "time": "2025-01-01T12:00:00+00:00",
     "host": "node-1", "pid": 4242, ...}

plus ``stuck`` (the ``status.json`` record) on ``stuck`` and ``alarm`` (kind, step, message, numbers) on
``alarm``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

log = logging.getLogger("trine.alerts")

QUEUE_SIZE = 64
"""Alerts waiting to be delivered; more are dropped (and counted) while a receiver is slow."""


class Alerts:
    """Sends the alerts of the run ``run`` in ``run_dir`` as ``settings`` (``monitor.alerts``) says."""

    def __init__(self, settings: Any, run: str, run_dir: str | Path) -> None:
        self.settings = settings
        self.run, self.run_dir = run, str(Path(run_dir).resolve())
        self.queue: queue.Queue[dict[str, Any] | None] = queue.Queue(maxsize=QUEUE_SIZE)
        self.sent = 0
        """Deliveries that succeeded (one per destination)."""
        self.failures = 0
        """Deliveries that failed (refused, timed out, HTTP error, non-zero exit)."""
        self.dropped = 0
        """Alerts dropped because the queue was full."""
        self._warned: set[str] = set()
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def enabled(self) -> bool:
        """Whether there is anywhere to send to (``url`` or ``command``)."""
        return bool(self.settings.url or self.settings.command)

    def wants(self, event: str) -> bool:
        """Whether ``event`` sends an alert (``monitor.alerts.on``, and somewhere to send it)."""
        return self.enabled and event in self.settings.on and not self._closed

    def send(self, event: str, reason: str, step: int | None, stage: str | None = None, **extra: Any) -> bool:
        """Queue the alert ``event`` (when :meth:`wants` it); returns at once, True when it was queued."""
        if not self.wants(event):
            return False
        alert = {
            "event": event,
            "run": self.run,
            "run_dir": self.run_dir,
            "stage": stage,
            "step": step,
            "reason": reason,
            "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            **extra,
        }
        try:
            self.queue.put_nowait(alert)
        except queue.Full:
            self.dropped += 1
            self._warn(
                "queue", f"alert {event!r} dropped: {QUEUE_SIZE} alerts still wait for a slow receiver"
            )
            return False
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="trine-alerts", daemon=True)
            self._thread.start()
        return True

    def close(self, timeout: float | None = None) -> None:
        """Deliver what is queued, waiting at most ``timeout`` seconds (default ``timeout_seconds``); what is
        left then is abandoned with the daemon thread. Later :meth:`send` calls send nothing."""
        self._closed = True
        if self._thread is None:
            return
        deadline = time.monotonic() + (self.settings.timeout_seconds if timeout is None else timeout)
        with contextlib.suppress(queue.Full):
            self.queue.put(None, timeout=max(0.0, deadline - time.monotonic()))
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            log.warning(
                "alerts: gave up waiting for %d alert(s) after %gs (monitor.alerts.timeout_seconds)",
                self.queue.qsize() + 1,
                self.settings.timeout_seconds if timeout is None else timeout,
            )

    def _work(self) -> None:
        while (alert := self.queue.get()) is not None:
            self.deliver(alert)

    def deliver(self, alert: dict[str, Any]) -> None:
        """Send ``alert`` to each destination now (blocking, each at most ``timeout_seconds``), counting
        and logging (once per destination) what fails."""
        body = json.dumps(alert, default=str).encode()
        timeout = self.settings.timeout_seconds
        for name, target, fn in (
            ("url", self.settings.url, post),
            ("command", self.settings.command, run_command),
        ):
            if not target:
                continue
            try:
                fn(target, body, alert, timeout)
                self.sent += 1
            except Exception as err:  # noqa: BLE001 - a receiver's failure never reaches the run
                self.failures += 1
                self._warn(name, f"alert {alert['event']!r} to {name} {target!r} failed: {_why(err)}")

    def _warn(self, key: str, text: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning("%s (further failures are counted, not logged)", text)


def post(url: str, body: bytes, alert: dict[str, Any], timeout: float) -> None:
    """POST ``body`` (JSON) to ``url``; raises on a refusal, a timeout or an HTTP error status."""
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json", "User-Agent": "trine"}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - http(s) checked by the config
        response.read(1 << 16)


def run_command(command: str | list[str], body: bytes, alert: dict[str, Any], timeout: float) -> None:
    """Run ``command`` with ``body`` on stdin and the ``TRINE_ALERT_*`` variables; raises on a non-zero exit
    or when it runs past ``timeout`` (then it is killed with every process it started)."""
    env = {
        **os.environ,
        **{f"TRINE_ALERT_{k.upper()}": "" if alert.get(k) is None else str(alert[k]) for k in _ENV},
    }
    proc = subprocess.Popen(
        command,
        shell=isinstance(command, str),  # noqa: S602 - the user's own alert command, from their config
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(body, timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise TimeoutError(f"still running after {timeout:g}s (killed)") from None
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] if err else []
        raise RuntimeError(f"exit code {proc.returncode}" + (f": {tail[0][:200]}" if tail else ""))


_ENV = ("event", "run", "run_dir", "stage", "step", "reason")
"""The alert's fields given to a command as ``TRINE_ALERT_<FIELD>``."""


def _why(err: BaseException) -> str:
    if isinstance(err, urllib.error.HTTPError):
        return str(err)  # HTTP Error 500: Internal Server Error
    reason = getattr(err, "reason", None)  # urllib's URLError wraps the socket's error
    return f"{type(err).__name__}: {reason if reason is not None else err}"
