"""``trine serve`` against the engine it wraps: throughput, latency, and requests across a weight update.

1. **Throughput.** ``--clients`` concurrent ``openai``-client chat requests (one per prompt) against
   ``trine serve`` (the real FastAPI app under uvicorn on 127.0.0.1, recording every answer in a buffer)
   vs the same prompts as one direct batch of :class:`~trine.models.engine.HFEngine` calls. Each prompt
   has its own seed, so both sides sample exactly the same tokens and tokens/s compare like for like.
   Target: the server reaches >= 0.8x the engine's tokens/s. Sides alternate (A B A B ...); medians.
2. **Latency**: p50 / p99 seconds per request over all served rounds.
3. **A weight update while serving**: waves of requests run back to back while new weights are loaded
   into the engine the way ``trine serve``'s watcher loads them (between two generations). Counted:
   requests failed (target: none), the update's duration, and the slowest request overlapping it.

4. **Two servers of one run, new weights published three times** (``--no-pair`` skips it): each server
   has its own engine and :class:`~trine.launch.serve.WeightsWatcher`, clients keep calling both.
   Reported: each server's load intervals, the seconds both were loading at once (target: 0, the run's
   reload lock staggers them), and failed requests.

Everything runs in one process and one event loop (client, server and the direct side), so the
comparison is the server's own overhead: HTTP, JSON, validation, recording.

Usage: python benchmarks/serve.py [--preset tiny-5m] [--clients 32] [--tokens 64] [--rounds 5] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from common import markdown_table, median, report, threads, tiny_model

from trine.buffer.memory import MemoryBuffer
from trine.models import load_model, load_tokenizer
from trine.models.engine import HFEngine
from trine.serve.app import create_app
from trine.serve.schemas import ServeSettings
from trine.serve.sessions import SessionStore
from trine.types import SamplingParams

MODEL = "bench"


def prompts(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"Question {i}: what is {i} + {2 * i}? Explain."}] for i in range(n)]


async def served(client, chats, tokens: int, latencies: list[float]) -> tuple[int, float]:
    """All chats at once through the API; (completion tokens, seconds)."""

    async def one(i: int, chat) -> int:
        start = time.perf_counter()
        resp = await client.chat.completions.create(
            model=MODEL, messages=chat, max_tokens=tokens, temperature=1.0, seed=i
        )
        latencies.append(time.perf_counter() - start)
        return resp.usage.completion_tokens

    start = time.perf_counter()
    counts = await asyncio.gather(*(one(i, c) for i, c in enumerate(chats)))
    return sum(counts), time.perf_counter() - start


async def direct(engine: HFEngine, chats, tokens: int) -> tuple[int, float]:
    """The same chats and seeds as one batch of engine calls; (completion tokens, seconds)."""
    start = time.perf_counter()
    outs = await asyncio.gather(
        *(
            engine.chat(c, SamplingParams(temperature=1.0, max_tokens=tokens, seed=i, top_k=0))
            for i, c in enumerate(chats)
        )
    )
    return sum(len(o[0].response_ids) for o in outs), time.perf_counter() - start


async def across_update(client, engine: HFEngine, chats, tokens: int, waves: int) -> dict[str, float]:
    """Waves of requests back to back; new weights loaded during the second wave."""
    failed, spans, update = 0, [], [0.0, 0.0]

    async def one(i: int, chat) -> None:
        nonlocal failed
        start = time.perf_counter()
        try:
            await client.chat.completions.create(
                model=MODEL, messages=chat, max_tokens=tokens, temperature=1.0, seed=i
            )
        except Exception:  # noqa: BLE001 - what the benchmark counts
            failed += 1
        spans.append((start, time.perf_counter()))

    async def load() -> None:
        await asyncio.sleep(0.05)
        state = {k: v.clone() for k, v in engine.model.state_dict().items()}
        update[0] = time.perf_counter()
        await asyncio.to_thread(engine.load_weights, state, engine.policy_version + 1)
        update[1] = time.perf_counter()

    for w in range(waves):
        jobs = [one(i, c) for i, c in enumerate(chats)]
        await asyncio.gather(*jobs, *([load()] if w == 1 else []))
    during = [b - a for a, b in spans if a < update[1] and b > update[0]]
    others = [b - a for a, b in spans if not (a < update[1] and b > update[0])]
    return {
        "requests": float(len(spans)),
        "failed": float(failed),
        "update_s": update[1] - update[0],
        "slowest_during_s": max(during, default=0.0),
        "median_other_s": statistics.median(others) if others else 0.0,
    }


async def pair(path, tokens: int, clients: int) -> dict[str, float]:
    """Part 4: two servers on one run directory, three publications, clients on both."""
    import tempfile
    from pathlib import Path

    import uvicorn
    from openai import AsyncOpenAI

    from trine.launch.serve import WeightsWatcher
    from trine.sync import PublishedWeights

    run_dir = Path(tempfile.mkdtemp(prefix="serve-pair-"))
    trainer_model = load_model(str(path))
    publisher = PublishedWeights(run_dir / "weights")
    servers, watchers, loads, urls = [], [], [], []
    for _ in range(2):
        model, tokenizer = load_model(str(path)), load_tokenizer(str(path))
        engine = HFEngine(model, tokenizer, max_batch_size=64)
        spans: list[tuple[float, float]] = []
        original = engine.load_weights

        def timed_load(state, version, _orig=original, _spans=spans):
            start = time.perf_counter()
            _orig(state, version)
            _spans.append((start, time.perf_counter()))

        engine.load_weights = timed_load  # type: ignore[method-assign]
        app = create_app(engine, SessionStore(MemoryBuffer(), tokenizer), ServeSettings(model_name=MODEL))
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.02)
        urls.append(f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}/v1")
        watchers.append(WeightsWatcher(PublishedWeights(run_dir / "weights"), engine, run_dir, 0.02).start())
        servers.append((server, task, engine))
        loads.append(spans)
    clients_ = [AsyncOpenAI(base_url=u, api_key="EMPTY", max_retries=0, timeout=300) for u in urls]
    stop, failed, done = asyncio.Event(), 0, 0

    async def caller(i: int) -> None:
        nonlocal failed, done
        while not stop.is_set():
            try:
                await clients_[i % 2].chat.completions.create(
                    model=MODEL, messages=prompts(1)[0], max_tokens=tokens, temperature=1.0
                )
                done += 1
            except Exception:  # noqa: BLE001 - what the benchmark counts
                failed += 1

    callers = [asyncio.create_task(caller(i)) for i in range(clients)]
    for version in (1, 2, 3):
        await asyncio.sleep(0.5)
        await asyncio.to_thread(publisher.push, trainer_model, version)
    while any(e.policy_version != 3 for _, _, e in servers):
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    stop.set()
    await asyncio.gather(*callers)
    for w in watchers:
        w.close()
    for c in clients_:
        await c.close()
    for server, task, engine in servers:
        server.should_exit = True
        await task
        engine.close()
    overlap = sum(max(0.0, min(b1, b2) - max(a1, a2)) for a1, b1 in loads[0] for a2, b2 in loads[1])
    return {
        "loads": float(sum(len(x) for x in loads)),
        "load_s": statistics.fmean(b - a for spans in loads for a, b in spans) if any(loads) else 0.0,
        "both_loading_s": overlap,
        "requests": float(done),
        "failed": float(failed),
    }


async def main(args: argparse.Namespace) -> None:
    import uvicorn
    from openai import AsyncOpenAI

    path = tiny_model(args.preset)
    model, tokenizer = load_model(str(path)), load_tokenizer(str(path))
    engine = HFEngine(model, tokenizer, max_batch_size=max(64, args.clients))
    store = SessionStore(MemoryBuffer(), tokenizer)
    settings = ServeSettings(model_name=MODEL, max_concurrent=args.clients, max_tokens=max(1024, args.tokens))
    server = uvicorn.Server(
        uvicorn.Config(create_app(engine, store, settings), host="127.0.0.1", port=0, log_level="warning")
    )
    serving = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", max_retries=0, timeout=300)
    chats, latencies = prompts(args.clients), []
    await served(client, chats, args.tokens, [])  # warm-up
    await direct(engine, chats, args.tokens)
    rates: dict[str, list[float]] = {"trine serve": [], "engine batch": []}
    tokens = {}
    for _ in range(args.rounds):
        n, s = await served(client, chats, args.tokens, latencies)
        rates["trine serve"].append(n / s)
        tokens["trine serve"] = n
        n, s = await direct(engine, chats, args.tokens)
        rates["engine batch"].append(n / s)
        tokens["engine batch"] = n
    update = await across_update(client, engine, chats, args.tokens, waves=3)
    await client.close()
    server.should_exit = True
    await serving
    engine.close()

    both = None if args.no_pair else await pair(path, args.tokens, 8)
    base = median(rates["engine batch"])
    rows = [[side, tokens[side], f"{median(r):.0f}", f"{median(r) / base:.2f}x"] for side, r in rates.items()]
    lat = sorted(latencies)
    p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
    table = markdown_table(["side", "tokens per round", "tokens/s (median)", "vs engine"], rows)
    table += "\n\n" + markdown_table(
        ["requests", "p50 s", "p99 s"], [[len(lat), f"{statistics.median(lat):.3f}", f"{p99:.3f}"]]
    )
    table += "\n\n" + markdown_table(
        ["requests across the update", "failed", "update s", "slowest overlapping s", "median other s"],
        [
            [
                int(update["requests"]),
                int(update["failed"]),
                f"{update['update_s']:.3f}",
                f"{update['slowest_during_s']:.3f}",
                f"{update['median_other_s']:.3f}",
            ]
        ],
    )
    if both is not None:
        table += "\n\n" + markdown_table(
            ["two servers: loads", "mean load s", "both loading s", "requests", "failed"],
            [[int(both["loads"]), f"{both['load_s']:.3f}", f"{both['both_loading_s']:.3f}",
              int(both["requests"]), int(both["failed"])]],
        )  # fmt: skip
    notes = (
        f"{args.preset}, {args.clients} concurrent clients x {args.tokens} tokens max (seeded: both sides "
        f"sample the same tokens), {args.rounds} rounds, torch threads {args.threads}. Target >= 0.8x; "
        "no failed request across the update."
    )
    report(f"trine serve vs the engine ({args.preset})", table, notes, write=not args.no_write)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="tiny-5m")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--no-pair", action="store_true", help="skip part 4 (two servers)")
    args = parser.parse_args()
    threads(args.threads)
    asyncio.run(main(args))
