"""``trine serve``: an OpenAI-compatible server in front of the rollout model that records every call.

- :mod:`trine.serve.app`: :func:`create_app` (FastAPI, imported lazily) and :class:`OpenAIServer`
  (the endpoints, the concurrency gate, ``metrics()``);
- :mod:`trine.serve.sessions`: :class:`SessionStore`, the recorder: one-call experiences, sessions
  joined into one trajectory token-in token-out, commits, feedback (a reward once), expiry;
- :mod:`trine.serve.records`: what a session keeps and the experiences written from it;
- :mod:`trine.serve.schemas`: :class:`ServeSettings`, the request models and :class:`ApiError`
  (OpenAI error bodies); :mod:`trine.serve.limits`: the checks before the engine (key, body size,
  model, limits) and the concurrency gate (``max_concurrent`` + ``max_queue``, then 429);
- :mod:`trine.serve.render` and :mod:`trine.serve.responses`: messages to tokens, samples to OpenAI
  bodies and stream chunks;
- :mod:`trine.serve.journal`: the sessions saved on disk, so a restarted server continues them;
  :mod:`trine.serve.idempotency`: ``Idempotency-Key`` (a retried request answered and recorded once).

fastapi / uvicorn are imported only inside :func:`create_app` (and by whoever runs the app).
"""

from __future__ import annotations

from trine.serve.app import OpenAIServer, Sampler, create_app
from trine.serve.schemas import ApiError, ServeSettings
from trine.serve.sessions import Session, SessionStore, SessionTurn

__all__ = [
    "ApiError",
    "OpenAIServer",
    "Sampler",
    "ServeSettings",
    "Session",
    "SessionStore",
    "SessionTurn",
    "create_app",
]
