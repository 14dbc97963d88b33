"""Weight sync between processes: seconds per sync, by number of explorers and by model size.

The trainer is this process; explorers are spawned processes (one torch thread each), as under
``launch: processes`` or Ray on one machine. Two tables:

- ``explorers`` (the default): one version of ``--preset`` (bench-100m: ~100M parameters) pushed to 1, 2
  and 4 explorer processes by the **one group** of :class:`~trine.sync.broadcast.BroadcastSender` (the
  trainer sends each version once; explorers forward it down a route) and, side by side in the same
  explorer processes, by the **per-explorer groups** it replaced (issue 27: one two-rank group per
  explorer, the trainer uploads a copy to each), loaded from ``trine/sync/broadcast.py`` of commit
  ``--before`` (git). One sync = ``push`` until every explorer process holds the version (received, not
  loaded into an engine). Also per push: MB the trainer process wrote to its sockets (``/proc/self/io``
  ``wchar``) and CPU seconds it spent (all its threads).
- ``sizes``: seconds per sync against model size: broadcast to 1 and 2 explorers and ``published`` (the
  checkpoint directory: safetensors write + fsync + rename, then one explorer reads and loads it); one
  sync = ``push`` until every explorer has the version **loaded into its HFEngine**.

Sizes are tiny Qwen2 models: the ``tiny-*`` presets and larger ones defined here (``bench-100m``,
``bench-300m``), built once into ``benchmarks/.cache``. Sides alternate (A B A B ...) after a warm-up;
medians of ``--repeats`` syncs.

Usage: python benchmarks/weight_sync.py [explorers|sizes] [--counts 1,2,4] [--preset bench-100m]
       [--sizes tiny-1m,tiny-5m,tiny-30m,bench-100m] [--repeats 5] [--before 44b5cc8] [--no-write]
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from common import ROOT, markdown_table, median, report, threads, tiny_model

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
TIMEOUT = 300.0


def before_module(commit: str, into: Path) -> Path | None:
    """``trine/sync/broadcast.py`` of ``commit`` written into ``into`` (None: git cannot show it)."""
    try:
        text = subprocess.run(
            ["git", "show", f"{commit}:trine/sync/broadcast.py"], cwd=ROOT, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        print(f"the per-explorer groups of {commit} are not measured: {err}", file=sys.stderr)
        return None
    path = into / "broadcast_before.py"
    path.write_bytes(text)
    return path


def load_before(path: str) -> object:
    spec = importlib.util.spec_from_file_location("trine_broadcast_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _explorer(model_dir: str | None, before: str | None, commands, results) -> None:
    """An explorer process: named weight syncs (and an HFEngine when ``model_dir``), driven by commands."""
    torch.set_num_threads(1)
    engine = None
    if model_dir:
        from trine.models.engine import HFEngine

        engine = HFEngine(load_model(model_dir), load_tokenizer(model_dir))
    old = load_before(before) if before else None
    syncs: dict[str, object] = {}
    results.put("ready")
    while (command := commands.get())[0] != "exit":
        what, key, arg = command
        if what == "broadcast":
            syncs[key] = BroadcastReceiver(arg, f"explorer-{key}", backend="gloo", timeout=TIMEOUT)
        elif what == "before":
            syncs[key] = old.BroadcastReceiver(arg, f"explorer-{key}", backend="gloo", timeout=TIMEOUT)
        elif what == "published":
            syncs[key] = PublishedWeights(arg, keep=1)
        elif what == "hold":  # until version ``arg`` was received
            deadline = time.monotonic() + TIMEOUT
            while (syncs[key].latest() or -1) < arg and time.monotonic() < deadline:
                time.sleep(0.0005)
            assert syncs[key].latest() == arg
        else:  # pull version ``arg`` into the engine
            syncs[key].pull(engine, arg, timeout=TIMEOUT)
            assert engine.policy_version == arg
        results.put("ok")
    for sync in syncs.values():
        sync.close()


class Explorer:
    def __init__(self, model_dir: Path | None, before: Path | None = None) -> None:
        self.commands, self.results = CTX.Queue(), CTX.Queue()
        args = (
            str(model_dir) if model_dir else None,
            str(before) if before else None,
            self.commands,
            self.results,
        )
        self.process = CTX.Process(target=_explorer, args=args)
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


def _written() -> int:
    """Bytes this process passed to write/send calls so far (Linux; 0 elsewhere)."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("wchar"))
    except OSError:
        return 0


def _wait_members(sender: object, n: int) -> None:
    deadline = time.monotonic() + 120
    while (len(sender.members) if hasattr(sender, "members") else sum(c.joined for c in sender.channels)) < n:
        assert time.monotonic() < deadline, f"{n} explorers did not join"
        time.sleep(0.02)


def measure_explorers(preset: str, count: int, repeats: int, before: Path | None) -> dict[str, float]:
    """Seconds, trainer MB written and trainer CPU seconds per push to ``count`` explorers, by arrangement."""
    model = load_model(tiny_model(preset))
    explorers = [Explorer(None, before) for _ in range(count)]
    senders = {"one": BroadcastSender("127.0.0.1", 0, backend="gloo", timeout=TIMEOUT)}
    if before is not None:
        senders["before"] = load_before(str(before)).BroadcastSender(
            "127.0.0.1", 0, backend="gloo", timeout=TIMEOUT
        )
    try:
        for e in explorers:
            e.done()
        for key, sender in senders.items():
            for e in explorers:
                e.send("broadcast" if key == "one" else "before", key, sender.address)
                e.done()
            _wait_members(sender, count)
        version = 0

        def sync(key: str) -> tuple[float, float, float]:
            nonlocal version
            version += 1
            for e in explorers:
                e.send("hold", key, version)
            written, cpu, start = _written(), time.process_time(), time.perf_counter()
            senders[key].push(model, version)
            written, cpu = _written() - written, time.process_time() - cpu
            for e in explorers:
                e.done()
            return time.perf_counter() - start, written / 2**20, cpu

        runs: dict[str, list[tuple[float, float, float]]] = {key: [] for key in senders}
        for round_ in range(repeats + 1):  # round 0: warm-up
            for key in senders:
                result = sync(key)
                if round_:
                    runs[key].append(result)
    finally:
        for e in explorers:  # first: they leave without the senders' closing being an error to report
            e.stop()
        for s in senders.values():
            s.close()
    out = {"count": count}
    for key, values in runs.items():
        for i, what in enumerate(("s", "mb", "cpu")):
            out[f"{key} {what}"] = median([v[i] for v in values])
    return out


def explorers_table(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="trine-weight-sync-"))
    before = before_module(args.before, work) if args.before else None
    model = load_model(tiny_model(args.preset))
    params = sum(p.numel() for p in model.parameters())
    del model
    rows = []
    for count in [int(c) for c in args.counts.split(",")]:
        r = measure_explorers(args.preset, count, args.repeats, before)
        print(r, flush=True)
        old = [r.get(f"before {w}", float("nan")) for w in ("s", "mb", "cpu")]
        rows.append(
            [count, f"{old[0]:.3f}", f"{r['one s']:.3f}", f"{old[0] / r['one s']:.2f}x"]
            + [f"{old[1]:.0f}", f"{r['one mb']:.0f}", f"{old[2]:.2f}", f"{r['one cpu']:.2f}"]
        )
    headers = ["explorers", "per-explorer groups s", "one group s", "per-explorer / one group"]
    headers += ["trainer MB sent, per-explorer", "trainer MB sent, one group"]
    headers += ["trainer CPU s, per-explorer", "trainer CPU s, one group"]
    report(
        f"Weight broadcast vs number of explorers, {args.preset} ({params / 1e6:.1f}M parameters): "
        "one group vs per-explorer groups",
        markdown_table(headers, rows),
        "One sync = `push` until every explorer process holds the version (gloo over loopback, float32, bare "
        "receivers, 1 torch thread each). Per-explorer groups: `trine/sync/broadcast.py` of "
        f"`{args.before}` (one two-rank group per explorer, a sender thread each); one group: this tree (the "
        "trainer sends once, explorers forward down the route). Trainer MB sent / CPU s: bytes this process "
        "wrote to its sockets and CPU seconds of all its threads, per push. Medians of "
        f"{args.repeats} alternating pushes after a warm-up. {args.command}",
        write=not args.no_write,
    )


def measure_size(preset: str, repeats: int) -> dict[str, object]:
    """Seconds per sync of each method for ``preset`` (alternating, one warm-up round)."""
    path = tiny_model(preset)
    model = load_model(path)
    params = sum(p.numel() for p in model.parameters())
    megabytes = sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 2**20
    explorers = [Explorer(path), Explorer(path)]
    work = Path(tempfile.mkdtemp(prefix="trine-weight-sync-"))
    senders = {key: BroadcastSender("127.0.0.1", 0, backend="gloo", timeout=TIMEOUT) for key in ("b1", "b2")}
    published = PublishedWeights(work / "weights", keep=1)
    try:
        for e in explorers:
            e.done()
        for key, receivers in (("b1", explorers[:1]), ("b2", explorers)):
            for e in receivers:
                e.send("broadcast", key, senders[key].address)
                e.done()
            _wait_members(senders[key], len(receivers))
        explorers[0].send("published", "p", str(work / "weights"))
        explorers[0].done()
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
        assert failures == 0, f"{failures} explorer(s) dropped from a broadcast group"
    finally:
        for e in explorers:
            e.stop()
        for s in senders.values():
            s.close()
    return {"preset": preset, "params": params, "mb": megabytes, **{k: median(v) for k, v in times.items()}}


def sizes_table(args: argparse.Namespace) -> None:
    rows = []
    for preset in args.sizes.split(","):
        r = measure_size(preset.strip(), args.repeats)
        print(r, flush=True)
        b1, b2, p = r["broadcast, 1 explorer"], r["broadcast, 2 explorers"], r["published, 1 explorer"]
        rows.append(
            [r["preset"], f"{r['params'] / 1e6:.1f}M", f"{r['mb']:.0f}", f"{b1:.3f}", f"{b2:.3f}", f"{p:.3f}"]
            + [f"{p / b1:.1f}x", f"{r['mb'] / b1:.0f}"]
        )
    headers = ["model", "parameters", "state dict MB", "broadcast 1 explorer s", "broadcast 2 explorers s"]
    headers += ["published s", "published / broadcast 1", "broadcast 1 MB/s"]
    report(
        "Weight sync between processes: seconds per sync vs model size (gloo broadcast vs checkpoint directory)",
        markdown_table(headers, rows),
        "One sync = `push` until every explorer process has the version loaded into its HFEngine (float32, "
        "1 torch thread per explorer). Broadcast: one group over loopback, 64 MB buckets; published: "
        f"safetensors write + fsync + rename, then load. Medians of {args.repeats} alternating syncs after a "
        "warm-up. State dict MB counts the tied embedding twice (the state dict lists it twice); both methods "
        f"send and store it once. {args.command}",
        write=not args.no_write,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("table", nargs="?", default="explorers", choices=("explorers", "sizes"))
    parser.add_argument("--counts", default="1,2,4", help="explorers (table explorers)")
    parser.add_argument("--preset", default="bench-100m", help="model preset (table explorers)")
    parser.add_argument(
        "--sizes", default="tiny-1m,tiny-5m,tiny-30m,bench-100m", help="model presets (table sizes)"
    )
    parser.add_argument("--repeats", type=int, default=5, help="syncs per side (medians)")
    parser.add_argument("--before", default="44b5cc8", help="commit with the per-explorer groups ('': skip)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    threads(2)
    load = os.getloadavg()
    command = " ".join(["python benchmarks/weight_sync.py", *sys.argv[1:]])
    args.command = (
        f"Command: `{command}` (load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} at the start)."
    )
    (explorers_table if args.table == "explorers" else sizes_table)(args)


if __name__ == "__main__":
    main()
