"""What every request to the studio passes before a route sees it: its size, its host, its origin, its
content type and its token (see :mod:`trine.studio.app` for the access rules these implement).

- :class:`BodyLimit` (ASGI middleware, outermost): a body over :attr:`StudioSettings.max_body_bytes`
  (``max_import_bytes`` for a Label Studio import) gets 413 before anything parses it, whether its
  ``Content-Length`` says so or a chunked body runs past the limit while it streams. The counting is
  :func:`trine.serve.limits.read_body`, the one ``trine serve`` uses.
- :func:`loopback_host`: without a token, the ``Host`` must be ``localhost`` or a loopback IP literal
  (``127.0.0.0/8``, ``[::1]``). Host *names* that merely start like one (``127.evil.example``,
  ``127.0.0.1.nip.io``) are names an attacker's DNS can point at 127.0.0.1 (DNS rebinding): refused.
- :func:`same_origin`: a request that changes something and carries an ``Origin`` must come from the
  studio's own origin, scheme included (``https://127.0.0.1:PORT`` is another origin than
  ``http://127.0.0.1:PORT``), default ports filled in (``http://h`` is ``http://h:80``).
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse

from trine.studio.settings import COOKIE, StudioSettings, same_token

DEFAULT_PORTS = {"http": 80, "https": 443}


def loopback_host(host: str) -> bool:
    """Whether the ``Host`` header ``host`` names this machine's loopback (any port): ``localhost`` or a
    loopback IP literal, never a name that resolves there."""
    try:
        name = urlsplit(f"//{host}").hostname or ""
    except ValueError:  # "[::1" and other malformed hosts
        return False
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _origin(scheme: str, netloc: str) -> tuple[str, str, int | None] | None:
    """``(scheme, host, port)`` with the scheme's default port filled in; None when malformed."""
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    scheme = scheme.lower()
    return scheme, parts.hostname.lower(), port if port is not None else DEFAULT_PORTS.get(scheme)


def same_origin(origin: str, scheme: str, host: str) -> bool:
    """Whether the browser's ``Origin`` header is the studio's own origin: the scheme the request came
    in on (``request.url.scheme``: ``https`` behind a proxy that says so) and the ``Host`` it named."""
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    given = _origin(parts.scheme, parts.netloc) if parts.scheme and parts.netloc else None
    own = _origin(scheme, host)
    return given is not None and given == own


def _is_annotator_path(path: str) -> bool:
    return path == "/api/annotator" or (
        "/annotations/" in path and path.rsplit("/", 1)[-1] in ("claim", "answer")
    )


def denied(request: Request, settings: StudioSettings) -> JSONResponse | None:
    """Why ``request`` may not go on (a response to send instead), or None."""
    host = request.headers.get("host", "")
    if settings.token is None and not loopback_host(host):
        return JSONResponse(
            {
                "detail": f"Host {host!r} refused: a studio without a token answers only to loopback names "
                "(open http://127.0.0.1:PORT or http://localhost:PORT), or start it with --token"
            },
            403,
        )
    scheme, path = request.scope.get("scheme", "http"), request.scope.get("path", "")  # not request.url:
    if request.method not in ("GET", "HEAD", "OPTIONS"):  # it parses the Host header, which may be malformed
        origin = request.headers.get("origin")
        if origin and not same_origin(origin, scheme, host):
            own = f"{scheme}://{host}"
            return JSONResponse(
                {
                    "detail": f"cross-origin request from {origin} refused: only pages of {own} may change things"
                },
                403,
            )
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return JSONResponse({"detail": "send JSON (Content-Type: application/json)"}, 415)
    if settings.token is None or not path.startswith("/api/"):
        return None
    given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    given = given or request.cookies.get(COOKIE, "")
    if given and same_token(given, settings.token):
        return None
    if _is_annotator_path(path) and settings.annotator(request.headers.get("x-annotator-token")):
        return None
    return JSONResponse(
        {
            "detail": "this studio needs its token: open the address `trine studio` printed (…/?token=…), "
            "or send Authorization: Bearer <token>"
        },
        401,
    )


class BodyLimit:
    """ASGI middleware: read each HTTP request's body up to its limit (413 beyond, before the app sees
    it), then hand the app the body it read."""

    def __init__(self, app: Any, settings: StudioSettings) -> None:
        self.app, self.settings = app, settings

    def limit(self, path: str) -> tuple[int, str]:
        """The body limit of a request to ``path`` and the setting that gives it."""
        if path.startswith("/api/runs/") and path.endswith("/annotations/import"):
            return self.settings.max_import_bytes, "max_import_bytes"
        return self.settings.max_body_bytes, "max_body_bytes"

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        from trine.serve.limits import read_body
        from trine.serve.schemas import ApiError

        limit, setting = self.limit(scope.get("path", ""))
        try:
            body = await read_body(Request(scope, receive), limit)
        except ApiError:
            detail = (
                f"the request body is larger than {limit} bytes (the studio's {setting}); send a smaller "
                "one (a config is a few KB; split a large import into several files)"
            )
            await JSONResponse({"detail": detail}, 413, headers={"Connection": "close"})(scope, receive, send)
            return
        except ClientDisconnect:
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as the server would

        await self.app(scope, replay, send)
