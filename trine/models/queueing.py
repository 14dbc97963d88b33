"""The request queue of an in-process engine: concurrent ``await generate(...)`` calls become batches.

Workflows call ``await engine.generate(prompt_ids, params)`` concurrently; each call queues a request
(with its ``params`` and a ``future``) and the engine's serving task runs :func:`serve_queue`, which
hands the queued requests to the engine's worker thread a batch at a time (at most ``max_rows``
sampled rows, ``params.n`` each) and settles every request's future with its completions or the
batch's error (the callers decide to retry or skip). Shared by the ``hf`` and ``vllm`` engines.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


async def serve_queue(
    pending: list[Any], max_rows: int, run: Callable[[list[Any]], Awaitable[list[Any]]]
) -> None:
    """Until ``pending`` is empty: take the next batch off its front and settle its futures with
    ``await run(batch)`` (one result per request, in order)."""
    while pending:
        for _ in range(3):  # let workflows that are ready submit before the batch closes
            await asyncio.sleep(0)
        batch, rows = [], 0
        while pending and (not batch or rows + pending[0].params.n <= max_rows):
            batch.append(pending.pop(0))
            rows += batch[-1].params.n
        try:
            results = await run(batch)
        except Exception as err:  # the callers decide to retry or skip
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(err)
            continue
        for request, result in zip(batch, results):
            if not request.future.done():
                request.future.set_result(result)
