"""The studio's FastAPI app: settings, access control and the pages' routers.

Access: on loopback with no token, anyone on this machine may use the studio (as with a notebook
server). With a token (``--token``, required and generated when bound to anything but loopback), every
``/api`` request needs it, as ``Authorization: Bearer <token>`` or the cookie that opening
``/?token=<token>`` sets. An annotator's own token (``--annotator NAME``) opens only the annotation
endpoints, as ``X-Annotator-Token``. Requests that change something must be JSON and, when the browser
sends an ``Origin``, come from the studio's own origin (scheme, host and port): another web site open in
the same browser cannot post to the studio (no cross-site request forgery). Without a token, a request
must name a loopback host (``Host: 127.0.0.1:PORT``, another ``127.x.y.z`` or ``[::1]`` literal, or
``localhost``): a web site whose name is made to resolve to 127.0.0.1 (DNS rebinding) is then another
origin the browser keeps out, not a page that reads the studio. Request bodies are bounded
(``StudioSettings.max_body_bytes``). The checks are :mod:`trine.studio.guards`.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from trine.studio.guards import BodyLimit, denied
from trine.studio.settings import COOKIE, StudioSettings, same_token

__all__ = ["StudioSettings", "create_app"]

STATIC = Path(__file__).parent / "static"


def create_app(settings: StudioSettings) -> FastAPI:
    """The studio app over ``settings.runs_dir``."""
    from trine.studio import annotations, compare_api, configs, experiences, runs

    app = FastAPI(title="Trine Studio", docs_url="/api/docs", openapi_url="/api/openapi.json")
    app.state.studio = settings

    @app.middleware("http")
    async def guard(request: Request, call_next):
        refused = denied(request, settings)
        return refused if refused is not None else await call_next(request)

    app.add_middleware(BodyLimit, settings=settings)  # added last: outermost, before anything reads a body

    for module in (runs, compare_api, experiences, configs, annotations):
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
