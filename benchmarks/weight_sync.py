"""Weight sync between processes: seconds per sync against model size, by method.

One sync = the trainer's ``push`` of a new version until every explorer process has it **loaded into its
HFEngine** (``pull``). The trainer is this process; explorers are spawned processes (one torch thread
each), as under ``launch: processes`` or Ray on one machine. Methods:

- ``broadcast, 1 explorer`` / ``broadcast, 2 explorers``: :class:`~trine.sync.broadcast.BroadcastSender`
  over gloo (loopback TCP), default bucket (64 MB);
- ``published``: :class:`~trine.sync.published.PublishedWeights`, the checkpoint directory (safetensors
  write + fsync + rename, then one explorer reads and loads it).

Sizes are tiny Qwen2 models: the ``tiny-*`` presets and larger ones defined here (``bench-100m``,
``bench-300m``), built once into ``benchmarks/.cache``. Methods alternate (A B C A B C ...) after a
warm-up; medians of ``--repeats`` syncs.

Usage: python benchmarks/weight_sync.py [--sizes tiny-1m,tiny-5m,tiny-30m,bench-100m] [--repeats 10] [--no-write]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import markdown_table, median, report, threads, tiny_model

from trine.models import load_model, load_tokenizer
from trine.registry import register
from trine.sync import BroadcastReceiver, BroadcastSender, PublishedWeights

register("model_preset", "bench-100m")(
    dict(
        vocab_size=4096,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=8,
        max_position_embeddings=4096,
    )
)
register("model_preset", "bench-300m")(
    dict(
        vocab_size=4096,
        hidden_size=1536,
        intermediate_size=4096,
        num_hidden_layers=10,
        num_attention_heads=16,
        num_key_value_heads=8,
        max_position_embeddings=4096,
    )
)
CTX = mp.get_context("spawn")


def _explorer(model_dir: str, commands, results) -> None:
    """An explorer process: an HFEngine and named weight syncs, driven by ``(command, *args)``."""
    from trine.models.engine import HFEngine

    torch.set_num_threads(1)
    engine = HFEngine(load_model(model_dir), load_tokenizer(model_dir))
    syncs: dict[str, object] = {}
    results.put("ready")
    while (command := commands.get())[0] != "exit":
        what, key, arg = command
        if what == "broadcast":
            syncs[key] = BroadcastReceiver(arg, f"explorer-{key}", backend="gloo", timeout=120)
        elif what == "published":
            syncs[key] = PublishedWeights(arg, keep=1)
        else:  # pull version ``arg``
            syncs[key].pull(engine, arg, timeout=300)
            assert engine.policy_version == arg
        results.put("ok")
    for sync in syncs.values():
        sync.close()


class Explorer:
    def __init__(self, model_dir: Path) -> None:
        self.commands, self.results = CTX.Queue(), CTX.Queue()
        self.process = CTX.Process(target=_explorer, args=(str(model_dir), self.commands, self.results))
        self.process.start()

    def send(self, *command) -> None:
        self.commands.put(command)

    def done(self) -> None:
        assert self.results.get(timeout=600) in ("ready", "ok")

    def stop(self) -> None:
        self.commands.put(("exit",))
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()


def measure_size(preset: str, repeats: int) -> dict[str, object]:
    """Seconds per sync of each method for ``preset`` (alternating, one warm-up round)."""
    path = tiny_model(preset)
    model = load_model(path)
    params = sum(p.numel() for p in model.parameters())
    megabytes = sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 2**20
    explorers = [Explorer(path), Explorer(path)]
    work = Path(tempfile.mkdtemp(prefix="trine-weight-sync-"))
    senders = {
        "b1": BroadcastSender("127.0.0.1", 0, backend="gloo", timeout=120),
        "b2": BroadcastSender("127.0.0.1", 0, backend="gloo", timeout=120),
    }
    published = PublishedWeights(work / "weights", keep=1)
    try:
        for e in explorers:
            e.done()
        explorers[0].send("broadcast", "b1", senders["b1"].address)
        explorers[0].done()
        for e in explorers:
            e.send("broadcast", "b2", senders["b2"].address)
            e.done()
        explorers[0].send("published", "p", str(work / "weights"))
        explorers[0].done()
        while sum(c.joined for s in senders.values() for c in s.channels) < 3:
            time.sleep(0.02)
        version = 0

        def sync(key: str, receivers: list[Explorer]) -> float:
            nonlocal version
            version += 1
            start = time.perf_counter()
            (published if key == "p" else senders[key]).push(model, version)
            for e in receivers:
                e.send("pull", key, version)
            for e in receivers:
                e.done()
            return time.perf_counter() - start

        sides = {
            "broadcast, 1 explorer": lambda: sync("b1", explorers[:1]),
            "broadcast, 2 explorers": lambda: sync("b2", explorers),
            "published, 1 explorer": lambda: sync("p", explorers[:1]),
        }
        times: dict[str, list[float]] = {name: [] for name in sides}
        for round_ in range(repeats + 1):  # round 0: warm-up
            for name, fn in sides.items():
                seconds = fn()
                if round_:
                    times[name].append(seconds)
        failures = sum(s.metrics()["sync/broadcast_failures"] for s in senders.values())
        assert failures == 0, f"{failures} broadcast channel(s) failed"
    finally:
        for e in explorers:  # first: they leave without the senders' closing being an error to report
            e.stop()
        for s in senders.values():
            s.close()
    return {"preset": preset, "params": params, "mb": megabytes, **{k: median(v) for k, v in times.items()}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="tiny-1m,tiny-5m,tiny-30m,bench-100m", help="model presets")
    parser.add_argument("--repeats", type=int, default=10, help="syncs per method and size (medians)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    threads(2)
    load = os.getloadavg()
    command = " ".join(["python benchmarks/weight_sync.py", *sys.argv[1:]])
    rows = []
    for preset in args.sizes.split(","):
        r = measure_size(preset.strip(), args.repeats)
        print(r, flush=True)
        b1, b2, p = r["broadcast, 1 explorer"], r["broadcast, 2 explorers"], r["published, 1 explorer"]
        rows.append(
            [
                r["preset"],
                f"{r['params'] / 1e6:.1f}M",
                f"{r['mb']:.0f}",
                f"{b1:.3f}",
                f"{b2:.3f}",
                f"{p:.3f}",
                f"{p / b1:.1f}x",
                f"{r['mb'] / b1:.0f}",
            ]
        )
    headers = [
        "model",
        "parameters",
        "state dict MB",
        "broadcast 1 explorer s",
        "broadcast 2 explorers s",
        "published s",
        "published / broadcast 1",
        "broadcast 1 MB/s",
    ]
    report(
        "Weight sync between processes: seconds per sync vs model size (gloo broadcast vs checkpoint directory)",
        markdown_table(headers, rows),
        f"One sync = `push` until every explorer process has the version loaded into its HFEngine (float32, "
        f"1 torch thread per explorer). Broadcast: gloo over loopback, 64 MB buckets; published: safetensors "
        f"write + fsync + rename, then load. Medians of {args.repeats} alternating syncs after a warm-up. "
        "State dict MB counts the tied embedding twice (the state dict lists it twice); both methods send and store it once. "
        f"Command: `{command}` (load average {load[0]:.1f} at the start).",
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
