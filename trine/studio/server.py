"""Serving the studio: ``trine studio`` (:func:`serve`) and a server in a background thread
(:func:`background`) for scripts and tests that talk to it over real HTTP."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import time
from collections.abc import Iterator

from trine.studio.app import create_app
from trine.studio.settings import LOOPBACK, StudioSettings, new_token

GRACE_SECONDS = 5
"""On SIGTERM / Ctrl-C, requests still running get this long before the server stops anyway."""


def is_loopback(host: str) -> bool:
    if host in LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ensure_token(settings: StudioSettings, host: str) -> bool:
    """Give ``settings`` a token when ``host`` is not loopback and it has none; True if one was made."""
    if settings.token is None and not is_loopback(host):
        settings.token = new_token()
        return True
    return False


def _server(settings: StudioSettings, host: str, port: int):
    import uvicorn

    config = uvicorn.Config(
        create_app(settings),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=GRACE_SECONDS,
    )
    return uvicorn.Server(config)


def serve(settings: StudioSettings, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serve the studio until Ctrl-C (a token is made when ``host`` is not loopback)."""
    ensure_token(settings, host)
    _server(settings, host, port).run()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def background(settings: StudioSettings, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """A studio served from a daemon thread; yields its base URL (``http://127.0.0.1:PORT``)."""
    port = port or free_port(host)
    ensure_token(settings, host)
    server = _server(settings, host, port)
    thread = threading.Thread(target=server.run, name="trine-studio", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError(f"the studio did not start on {host}:{port}")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
