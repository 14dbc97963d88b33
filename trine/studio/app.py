"""The studio's FastAPI app: settings, access control and the pages' routers.

Access: on loopback with no token, anyone on this machine may use the studio (as with a notebook
server). With a token (``--token``, required and generated when bound to anything but loopback), every
``/api`` request needs it, as ``Authorization: Bearer <token>`` or the cookie that opening
``/?token=<token>`` sets. An annotator's own token (``--annotator NAME``) opens only the annotation
endpoints, as ``X-Annotator-Token``. Requests that change something must be JSON and, when the browser
sends an ``Origin``, come from the studio's own origin: another web site open in the same browser cannot
post to the studio (no cross-site request forgery). Without a token, a request must name a loopback
host (``Host: 127.0.0.1:PORT`` or ``localhost``): a web site whose name is made to resolve to 127.0.0.1
(DNS rebinding) is then another origin the browser keeps out, not a page that reads the studio.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from trine.studio.settings import COOKIE, LOOPBACK, StudioSettings, same_token

STATIC = Path(__file__).parent / "static"


def _is_annotator_path(path: str) -> bool:
    return path == "/api/annotator" or (
        "/annotations/" in path and path.rsplit("/", 1)[-1] in ("claim", "answer")
    )


def _loopback_host(host: str) -> bool:
    """Whether the ``Host`` header ``host`` names this machine's loopback (any port)."""
    name = urlsplit(f"//{host}").hostname or ""
    return name in LOOPBACK or name.startswith("127.")


def _denied(request: Request, settings: StudioSettings) -> JSONResponse | None:
    """Why ``request`` may not go on (a response to send instead), or None."""
    host = request.headers.get("host", "")
    if settings.token is None and not _loopback_host(host):
        return JSONResponse(
            {
                "detail": f"Host {host!r} refused: a studio without a token answers only to loopback names "
                "(open http://127.0.0.1:PORT or http://localhost:PORT), or start it with --token"
            },
            403,
        )
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        origin = request.headers.get("origin")
        if origin and urlsplit(origin).netloc != request.headers.get("host"):
            return JSONResponse({"detail": f"cross-origin request from {origin} refused"}, 403)
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return JSONResponse({"detail": "send JSON (Content-Type: application/json)"}, 415)
    if settings.token is None or not request.url.path.startswith("/api/"):
        return None
    given = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
    given = given or request.cookies.get(COOKIE, "")
    if given and same_token(given, settings.token):
        return None
    if _is_annotator_path(request.url.path) and settings.annotator(request.headers.get("x-annotator-token")):
        return None
    return JSONResponse(
        {
            "detail": "this studio needs its token: open the address `trine studio` printed (…/?token=…), "
            "or send Authorization: Bearer <token>"
        },
        401,
    )


def create_app(settings: StudioSettings) -> FastAPI:
    """The studio app over ``settings.runs_dir``."""
    from trine.studio import annotations, configs, experiences, runs

    app = FastAPI(title="Trine Studio", docs_url="/api/docs", openapi_url="/api/openapi.json")
    app.state.studio = settings

    @app.middleware("http")
    async def guard(request: Request, call_next):
        denied = _denied(request, settings)
        return denied if denied is not None else await call_next(request)

    for module in (runs, experiences, configs, annotations):
        app.include_router(module.router, prefix="/api")
    annotations.install(app)  # lands answered annotations in the background while the app serves

    @app.get("/", include_in_schema=False)
    def index(token: str | None = None):
        if token is not None and settings.token is not None and same_token(token, settings.token):
            response = RedirectResponse("/", 303)
            response.set_cookie(COOKIE, token, httponly=True, samesite="strict")
            return response
        return FileResponse(STATIC / "index.html")

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app
