"""Trine Studio: a local web app over what runs write (``trine studio``; the ``studio`` extra).

:func:`trine.studio.app.create_app` builds the FastAPI app; each page's API lives in its own module
(``runs``, ``experiences``, ``configs``, ``annotations``) as an ``APIRouter``; the browser side is plain
JavaScript modules and a vendored charting library under ``static/`` (no build step).
"""
