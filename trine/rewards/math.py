"""Math answer checking with math-verify, under Trine's own timeout.

math-verify's built-in timeouts use ``signal.alarm``, which only works on the main thread, while
Trine scores responses from worker threads. So ``parse``/``verify`` run with their timeouts
disabled (``parsing_timeout=None``, ``timeout_seconds=None``) and Trine enforces its own.

A thread cannot enforce it: sympy may spend minutes inside one big-integer operation (try
``\\boxed{9^{9^{9}}}``) while holding the GIL, which would freeze the caller and every other
thread. The check therefore runs in a small pool of worker *processes* (``python -c ...``, so no
``__main__`` re-import as with multiprocessing's spawn). A worker that does not answer within the
timeout is killed, which frees its CPU and memory, and is replaced on the next call. Workers start
lazily (about half a second each) and live until the interpreter exits.

math-verify itself (and sympy) is imported only inside the workers, so ``import trine.rewards``
stays cheap.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from trine.rewards.basic import (
    DEFAULT_FORMAT_PATTERN,
    as_text,
    clean_response,
    extract_answer_tag,
    format_reward,
)
from trine.types import Task

logger = logging.getLogger(__name__)

POOL_SIZE = max(1, min(4, os.cpu_count() or 1))
"""Most math checks run at once (one worker process each); more callers wait for a free worker."""
STARTUP_TIMEOUT = 120.0
"""Seconds a new worker may take to import math-verify; not counted in a check's timeout."""
WORKER_MEMORY_BYTES = 8 << 30
"""Address-space limit of a worker (Linux/macOS); beyond it sympy gets a MemoryError -> 0.0."""

_ROOT = str(Path(__file__).resolve().parents[2])
_BOOT = (
    f"import sys; r = {_ROOT!r}; sys.path.insert(0, r) if r not in sys.path else None; "
    "from trine.rewards.math import serve; serve()"
)


def check_math(gold: str, response: str, strict: bool = True, float_rounding: int = 6) -> bool:
    """True if math-verify finds ``response`` equivalent to ``gold`` (no timeout: call in a worker).

    A gold answer that math-verify cannot find an expression in (``\\sqrt{2}``, ``(1,2)``) is
    retried inside ``$...$`` so bare LaTeX references work.
    """
    from math_verify import parse, verify

    gold_parsed = parse(gold, parsing_timeout=None)
    if not gold_parsed and "$" not in gold:
        gold_parsed = parse(f"${gold}$", parsing_timeout=None)
    if not gold_parsed:
        return False
    pred = parse(response, parsing_timeout=None)
    if not pred:
        return False
    return bool(verify(gold_parsed, pred, strict=strict, float_rounding=float_rounding, timeout_seconds=None))


class _Worker:
    """One worker process speaking JSON lines over its stdin/stdout."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
        )
        self.replies: queue.Queue[bytes | None] = queue.Queue()
        threading.Thread(target=self._read, name="trine-math-reader", daemon=True).start()
        try:
            ready = self.replies.get(timeout=STARTUP_TIMEOUT)
        except queue.Empty:
            ready = None
        if ready is None or json.loads(ready) != {"ready": True}:
            self.kill()
            raise RuntimeError(
                f"the math reward's worker process ({sys.executable} -c ...) did not start within "
                f"{STARTUP_TIMEOUT:.0f}s (got {ready!r}); check that `import math_verify` works "
                "in this environment (pip install 'math-verify[antlr4_13_2]')."
            )

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.replies.put(line)
        self.replies.put(None)

    def ask(self, request: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        """The worker's reply, or None if it did not answer within ``timeout`` or died."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(request).encode("ascii") + b"\n")
        except OSError:  # the worker died since its last check
            return None
        try:
            line = self.replies.get(timeout=timeout)
        except queue.Empty:
            return None
        try:
            return None if line is None else json.loads(line)
        except ValueError:  # not a reply (something else wrote to its stdout): treat it as broken
            logger.warning(
                "math reward: the worker sent %r instead of a JSON reply; restarting it", line[:200]
            )
            return None

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


class _Pool:
    """At most ``size`` workers; a worker that times out is killed and replaced on demand."""

    def __init__(self, size: int) -> None:
        self.slots = threading.BoundedSemaphore(size)
        self.lock = threading.Lock()
        self.idle: list[_Worker] = []
        self.live: set[_Worker] = set()

    def check(self, request: dict[str, Any], timeout: float) -> bool | None:
        """The worker's verdict, or None when it timed out or died (the worker is then killed)."""
        with self.slots:
            with self.lock:
                worker = self.idle.pop() if self.idle else None
            if worker is not None and worker.proc.poll() is not None:  # died while idle
                with self.lock:
                    self.live.discard(worker)
                worker = None
            if worker is None:
                worker = _Worker()
                with self.lock:
                    self.live.add(worker)
            reply = worker.ask(request, timeout)
            if reply is None:
                with self.lock:
                    self.live.discard(worker)
                worker.kill()
                return None
            with self.lock:
                self.idle.append(worker)
            if "error" in reply:
                logger.debug("math check failed in the worker: %s", reply["error"])
            return bool(reply.get("ok"))

    def close(self) -> None:
        with self.lock:
            workers, self.live, self.idle = list(self.live), set(), []
        for worker in workers:
            worker.kill()


_POOL = _Pool(POOL_SIZE)
atexit.register(_POOL.close)


def _check_args(timeout: Any, float_rounding: Any) -> None:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"math reward: timeout={timeout!r}; expected seconds > 0 (e.g. timeout: 5).")
    if isinstance(float_rounding, bool) or not isinstance(float_rounding, int):
        raise ValueError(f"math reward: float_rounding={float_rounding!r}; expected an int (e.g. 6).")


def math_reward(
    response: str,
    task: Task,
    timeout: float = 5.0,
    answer_tag: str | None = "answer",
    strict: bool = True,
    float_rounding: int = 6,
) -> dict[str, float]:
    """Math-verify equivalence of the response with ``task.answer``: ``{"accuracy", "_timeout"}``.

    ``accuracy`` is 1.0 when math-verify finds the response's final answer (``\\boxed{}``, LaTeX
    or a plain expression) equal to the reference (e.g. ``\\boxed{\\frac{1}{2}}`` vs ``0.5``,
    ``x=2`` vs ``2``), else 0.0. When the response has an ``<answer_tag>`` block only its last
    one is checked (``answer_tag=None`` checks the whole text). ``_timeout`` is a diagnostic part
    (not added to the total): 1.0 when the check did not finish within ``timeout`` seconds, in
    which case accuracy is 0.0. ``strict`` and ``float_rounding`` are math-verify's ``verify``
    options. An empty response or a None answer gives 0.0 without running a check.
    """
    _check_args(timeout, float_rounding)
    gold = as_text(task.answer).strip()
    text = clean_response(response)
    if answer_tag:
        text = extract_answer_tag(text, answer_tag).strip()
    if not gold or not text:
        return {"accuracy": 0.0, "_timeout": 0.0}
    request = {"gold": gold, "response": text, "strict": bool(strict), "float_rounding": float_rounding}
    verdict = _POOL.check(request, float(timeout))
    if verdict is None:
        logger.warning("math reward: check of task %s did not finish within %ss", task.task_id, timeout)
        return {"accuracy": 0.0, "_timeout": 1.0}
    return {"accuracy": 1.0 if verdict else 0.0, "_timeout": 0.0}


def math_with_format(
    response: str,
    task: Task,
    format_weight: float = 0.5,
    pattern: str = DEFAULT_FORMAT_PATTERN,
    timeout: float = 5.0,
    answer_tag: str | None = "answer",
) -> dict[str, float]:
    """Math accuracy plus a weighted format part: ``{"accuracy", "format", "_timeout"}``.

    ``format`` is ``format_weight`` when the response matches ``pattern`` (by default
    ``<think>...</think><answer>...</answer>``), else 0.0; the total reward is accuracy + format.
    """
    parts = math_reward(response, task, timeout=timeout, answer_tag=answer_tag)
    parts["format"] = format_reward(response, task, pattern=pattern, weight=format_weight)
    return parts


# ---- worker side -------------------------------------------------------------------------------


class _DropTimeoutWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Timeout is disabled")


def _limit_worker() -> None:
    """Cap the worker's memory and make it exit when its parent goes away."""
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (WORKER_MEMORY_BYTES, WORKER_MEMORY_BYTES))
    except (ImportError, ValueError, OSError):
        pass
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def serve() -> None:
    """Worker process main loop: one JSON request per stdin line, one JSON reply per stdout line."""
    out = sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but replies may reach the protocol stream
    _limit_worker()
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutWarning())
    check_math("1", "1")  # import and warm up math-verify before saying ready
    out.write(b'{"ready": true}\n')
    out.flush()
    for line in sys.stdin.buffer:
        try:  # a malformed request or a sympy failure is a wrong answer, never the worker's death
            request = json.loads(line)
            if not isinstance(request, dict):
                raise TypeError(f"request {request!r} is not a JSON object")
            reply: dict[str, Any] = {"ok": check_math(**request)}
        except Exception as err:  # MemoryError, RecursionError, sympy bugs, bad JSON
            reply = {"ok": False, "error": f"{type(err).__name__}: {err}"[:500]}
        out.write(json.dumps(reply).encode("ascii") + b"\n")
        out.flush()
