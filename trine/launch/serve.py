"""Mode ``serve``: ``trine serve CONFIG`` puts the rollout model behind an OpenAI-compatible API (:mod:`trine.serve`).

A server is an explorer whose tasks come from outside: black-box agents call it over HTTP. It runs on the
run directory of an async run, like ``trine explore``: every call becomes experience in the run's SQL
buffer (rewards pending until ``POST /v1/feedback``), a ``trine train`` process on the same config trains
on them and publishes new weights into ``<run_dir>/weights``, and the server loads each newer version
between two generations (:class:`WeightsWatcher`) — requests in flight wait for the load, none fails.

Several servers (``--server-id i --servers n``, each on its own port) reload one at a time: a server
takes ``<run_dir>/weights/reload.lock`` for its load, so while one loads the others answer (the
"always one server ready" of the issue; :mod:`benchmarks.serve` measures it).

Server ``i`` saves its sessions to ``<run_dir>/servers/<i>/sessions.db`` (:mod:`trine.serve.journal`):
started again on the run directory after a crash, it continues the sessions that were open.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trine.config import RunConfig

log = logging.getLogger(__name__)


class WeightsWatcher:
    """Polls the published weights every ``poll`` seconds and loads a newer version into ``engine``
    (one server at a time across the run, see the module docstring). ``loads`` counts the versions
    loaded, ``load_seconds`` their total time."""

    def __init__(
        self,
        sync: Any,
        engine: Any,
        run_dir: Path,
        poll: float,
        report: Any = None,
        report_every: float = 10.0,
    ) -> None:
        self.sync, self.engine, self.poll = sync, engine, poll
        self.report, self.report_every = report, report_every  # report(): log the server's counters
        self.lock_path = run_dir / "weights" / "reload.lock"
        self.stop = threading.Event()
        self.loads, self.load_seconds = 0, 0.0
        self.error: str | None = None
        self._thread = threading.Thread(target=self._loop, name="trine-serve-weights", daemon=True)

    def start(self) -> WeightsWatcher:
        self._thread.start()
        return self

    def close(self) -> None:
        self.stop.set()
        self.sync.close()  # ends a pull that waits
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        if self.report is not None:
            self.report()  # the last counts

    def check(self) -> bool:
        """Load the newest published version if it is newer than the engine's; True if one was loaded."""
        latest = self.sync.latest()
        if latest is None or latest <= self.engine.policy_version:
            return False
        with self._turn():
            start = time.monotonic()
            self.sync.pull(self.engine, latest)
            self.loads += 1
            self.load_seconds += time.monotonic() - start
        log.info("serving weights version %d (loaded in %.2fs)", latest, time.monotonic() - start)
        return True

    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock_path.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)  # one server of the run reloads at a time
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _loop(self) -> None:
        reported = time.monotonic()
        while not self.stop.wait(self.poll):
            if self.report is not None and time.monotonic() - reported >= self.report_every:
                reported = time.monotonic()
                self.report()
            try:
                self.check()
            except TimeoutError:  # closed while waiting
                return
            except Exception as err:  # noqa: BLE001 - keep serving the weights it has; say why
                self.error = f"{type(err).__name__}: {err}"
                log.warning(
                    "could not load new weights (still serving version %s): %s",
                    self.engine.policy_version,
                    self.error,
                )


def settings_of(cfg: RunConfig, max_context: int | None) -> Any:
    """The :class:`~trine.serve.schemas.ServeSettings` of ``cfg.serve``: the section's values, with the model
    name (default: the run's name), the token (read from its environment variable) and the prompt limit
    (default: the context length left after ``max_tokens``) resolved."""
    from trine.launch.processes import ProcessSetupError
    from trine.serve.schemas import ServeSettings

    s = cfg.serve
    api_key = None
    if s.api_key_env is not None:
        api_key = os.environ.get(s.api_key_env) or None
        if api_key is None:
            raise ProcessSetupError(
                f"serve.api_key_env={s.api_key_env!r} names an environment variable that is not set or "
                "empty; export the token there (it never goes into a config file), or remove api_key_env."
            )
    prompt = s.max_prompt_tokens or max(1, (max_context or 4096) - s.max_tokens)
    resolved = {"model_name": s.model_name or cfg.name, "max_prompt_tokens": prompt, "api_key": api_key}
    return ServeSettings(**{**s.model_dump(), **resolved})


def serve(
    stages: list[RunConfig],
    *,
    host: str | None = None,
    port: int | None = None,
    index: int = 0,
    ready: Any = None,
) -> str:
    """``trine serve``: serve until interrupted; returns why it stopped. ``ready(url)`` is called once the
    server listens (tests; the CLI prints the URL)."""
    from trine import build
    from trine.launch.processes import ProcessSetupError, as_process, check_shared_config
    from trine.monitor import build_monitor
    from trine.serve.app import create_app
    from trine.threads import use_threads

    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError as err:
        raise ProcessSetupError(
            f'trine serve needs fastapi and uvicorn ({err.name} is not installed): pip install -e ".[serve]"'
        ) from None
    cfg = as_process(stages, "serve")
    run_dir = cfg.run_path
    check_shared_config(cfg, run_dir)
    use_threads(cfg.num_threads)
    model, tokenizer = build.load_policy(cfg, say=lambda text: print(text, flush=True))
    engine, store, sync = build.build_server(cfg, model, tokenizer, run_dir, index)
    settings = settings_of(cfg, getattr(model.config, "max_position_embeddings", None))
    app = create_app(engine, store, settings)
    out = run_dir / "servers" / str(index)
    out.mkdir(parents=True, exist_ok=True)
    restored = store.persist(out / "sessions.db")
    if restored:
        print(f"trine serve: continuing {restored} open session(s) saved by an earlier server", flush=True)
    monitor = build_monitor(["jsonl"], out, total_steps=None, config={}, resume_step=0)
    reports = iter(range(1, 1 << 62))

    def report() -> None:  # serve/* counters, weights loads, into servers/<i>/metrics.jsonl
        loads = {
            "serve/weight_loads": float(watcher.loads),
            "serve/weight_load_seconds": watcher.load_seconds,
        }
        monitor.log({**app.state.server.metrics(), **loads}, next(reports))

    watcher = WeightsWatcher(sync, engine, run_dir, cfg.serve.weights_poll_seconds, report)
    watcher.check()  # start on the newest published weights, if the trainer published any
    config = uvicorn.Config(
        app,
        host=host or cfg.serve.host,
        port=cfg.serve.port if port is None else port,
        log_level="warning",
        lifespan="on",
        timeout_keep_alive=settings.keep_alive_timeout,
    )
    server = uvicorn.Server(config)
    watcher.start()
    announcer = threading.Thread(target=_announce, args=(server, ready), daemon=True)
    announcer.start()
    try:
        server.run()
    finally:
        watcher.close()
        monitor.close()
        engine.close()
        store.buffer.close()
    return "interrupted" if server.should_exit else "stopped"


def _announce(server: Any, ready: Any) -> None:
    while not server.started:
        if server.should_exit:
            return
        time.sleep(0.05)
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    url = f"http://{host}:{port}/v1"
    print(f"trine serve: listening on {url}", flush=True)
    if ready is not None:
        ready(url)
