"""Plain helpers shared by every test tier: experience factories, config writers, jsonl readers, a
``trine`` child process, and the pieces that more than one test module uses (a test server, scripted
models and environments, weight-sync stand-ins); fixtures live in the conftests.

Import them as ``from tests.helpers import exp, write_config``: pytest puts the repository root on
``sys.path`` (``pythonpath = ["."]`` in pyproject.toml), however and wherever it is started.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trine.types import Completion, Experience, SamplingParams, Task

ROOT = Path(__file__).resolve().parents[1]
"""The repository."""

EXAMPLE = ROOT / "examples" / "arithmetic"
"""The main job's example directory (its shipped arithmetic tasksets)."""

GOOD_ROWS = '{"question": "1+1", "answer": "2"}\n{"question": "2+2", "answer": "4"}\n'
"""A good two-row taskset (jsonl): the ``good.jsonl`` of the ``project`` fixture."""


def exp(
    i: int = 0,
    *,
    reward: float | None = 1.0,
    version: int = 0,
    tokens: list[int] | None = None,
    prompt_length: int = 1,
    action_mask: list[int] | None = None,
    task_id: str | None = None,
    info: dict[str, Any] | None = None,
    **fields: Any,
) -> Experience:
    """Experience number ``i``: tokens ``[1, 2, 3]`` (a one-token prompt, two trained response tokens),
    ``reward`` (None: pending), ``policy_version=version``, task ``t{i}`` and ``info={"i": i}`` (what
    :func:`ids` reads back). Any other :class:`Experience` field by keyword (``run_id``, ``group_id``,
    ``logprobs``, ``kind``, ...)."""
    return Experience(
        tokens=[1, 2, 3] if tokens is None else tokens,
        prompt_length=prompt_length,
        action_mask=[1, 1] if action_mask is None else action_mask,
        reward=reward,
        task_id=f"t{i}" if task_id is None else task_id,
        policy_version=version,
        info={"i": i} if info is None else info,
        **fields,
    )


def pending(exp_id: str, response: tuple[int, ...] = (5, 6), **fields: Any) -> Experience:
    """A pending experience (no reward yet) with id ``exp_id``: prompt ``[1, 2, 3]``, then ``response``,
    every response token trained; any other :class:`Experience` field by keyword."""
    tokens = [1, 2, 3, *response]
    return Experience(tokens=tokens, prompt_length=3, action_mask=[1] * len(response), id=exp_id, **fields)


def f32(x: float) -> float:
    """``x`` rounded to the nearest float32 (what a float32 column gives back)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def ids(exps: list[Experience]) -> list[int]:
    """The numbers ``i`` of experiences made by :func:`exp`, in order."""
    return [e.info["i"] for e in exps]


def write_config(path: Path, data: dict[str, Any] | None = None, /, **sections: Any) -> Path:
    """Write ``data`` with ``sections`` (top-level keys) added as YAML into ``path``; returns ``path``.

    ``write_config(tmp_path / "config.yaml", buffer={"storage": "sql"})``
    """
    import yaml

    path.write_text(yaml.safe_dump({**(data or {}), **sections}))
    return path


def write_arithmetic_config(tmp_path: Path, model_dir: Path, name: str, *overrides: dict | None) -> Path:
    """Write a tiny GRPO config over the shipped arithmetic data into ``tmp_path/<name>.yaml`` (run
    directory ``tmp_path/<name>``) with each of ``overrides`` merged in, in order; returns its path."""
    from trine.config import merge

    data = {
        "name": name,
        "run_dir": str(tmp_path / name),
        "seed": 0,
        "num_threads": 1,
        "model": {"path": str(model_dir)},
        "tasks": {
            "batch_size": 4,
            "total_steps": 6,
            "train": {
                "path": str(EXAMPLE / "data" / "train.jsonl"),
                "repeat": 4,
                "sampling": {"temperature": 1.0, "max_tokens": 4},
            },
        },
        "trainer": {"lr": 1e-3},
        "eval": {"at_start": False},
        "monitor": {"sinks": ["jsonl"], "plot": False},
    }
    for extra in overrides:
        data = merge(data, extra or {})
    return write_config(tmp_path / f"{name}.yaml", data)


def dead_pid() -> int:
    """The pid of a process that has ended (and was reaped): a run whose process is gone."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def jsonl_rows(path: Path, *, missing_ok: bool = False) -> list[dict]:
    """The JSON objects of a ``.jsonl`` file, one a line, blank lines skipped (FileNotFoundError when the
    file is missing, none with ``missing_ok``)."""
    if missing_ok and not Path(path).exists():
        return []
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def read_metrics(run_dir: Path) -> list[dict]:
    """The lines of ``run_dir/metrics.jsonl`` (FileNotFoundError when the run wrote none)."""
    return jsonl_rows(Path(run_dir) / "metrics.jsonl")


def step_metrics(run_dir: Path) -> list[dict]:
    """The training steps' lines of ``run_dir/metrics.jsonl`` (those with explorer counters), in order
    (none when the run wrote none)."""
    return [m for m in jsonl_rows(Path(run_dir) / "metrics.jsonl", missing_ok=True) if "explorer/tasks" in m]


def run_dir_of(config: Path) -> Path:
    """The ``run_dir`` a config file names."""
    import yaml

    return Path(yaml.safe_load(Path(config).read_text())["run_dir"])


def run_status(run_dir: Path) -> dict:
    """``run_dir/status.json``."""
    return json.loads((Path(run_dir) / "status.json").read_text())


def _default_signals() -> None:
    """In the child before exec: SIGINT and SIGTERM unblocked and at their defaults, as in a terminal.
    A child inherits ignored signals and the signal mask of the thread that starts it, and after some
    tests the test process's no longer are the defaults (a SIGINT was then never delivered)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def trine(*args: str, **kwargs: Any) -> subprocess.Popen:
    """``python -m trine.cli ARGS`` as a child process in the repository, in its own session (a kill of
    its process group reaches any child it started), output piped, SIGINT and SIGTERM at their defaults;
    ``kwargs`` go to :class:`subprocess.Popen`."""
    return subprocess.Popen(
        [sys.executable, "-m", "trine.cli", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=_default_signals,
        **kwargs,
    )


def wait_built(proc: subprocess.Popen, status: Path, limit: float = 120.0) -> None:
    """Wait until explorer process ``proc`` is built and waits for the first weights (its ``status.json``):
    under load an explorer's start-up can outlast a whole short run that the other explorer feeds alone."""
    deadline = time.monotonic() + limit
    while not status.is_file():
        assert proc.poll() is None, f"the explorer ended early:\n{proc.stdout.read()}"
        assert time.monotonic() < deadline, f"the explorer writing {status} was not built within {limit}s"
        time.sleep(0.05)


def served_url(server: subprocess.Popen, lines: list[str] | None = None, limit: float = 120.0) -> str:
    """The URL a ``trine serve`` child process (:func:`trine`) prints once it listens; each line it printed
    before is appended to ``lines``. Kills the server and names what it printed when it never says."""
    seen = [] if lines is None else lines
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        line = server.stdout.readline()
        if not line and server.poll() is not None:
            raise AssertionError(f"trine serve exited {server.returncode}: {''.join(seen)}")
        seen.append(line)
        if found := re.search(r"listening on (http://\S+)", line):
            return found.group(1)
    server.kill()
    raise AssertionError(f"trine serve did not say where it listens: {''.join(seen)}")


def trine_run(config: Path, plugin: Path, timeout: float = 240) -> tuple[subprocess.CompletedProcess, float]:
    """``trine run CONFIG --plugin PLUGIN`` in a fresh process (the console script, as a user runs it,
    unbuffered), waited for; returns it and its wall time."""
    script = Path(sys.executable).with_name("trine")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "trine.cli"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    proc = subprocess.run(
        [*command, "run", str(config), "--plugin", str(plugin)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    return proc, time.monotonic() - start


def trine_process(*args: str, unbuffered: bool = False) -> subprocess.Popen:
    """``trine ARGS`` as a child process in its own session (output piped, one torch thread, Ray's local
    auth off); ``unbuffered`` for tests that time each printed line."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_AUTH_MODE": "disabled"}
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    return subprocess.Popen(
        [sys.executable, "-m", "trine.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    )


class Crash(RuntimeError):
    """A simulated crash of the trainer (:func:`run_crashing_after_step`)."""


def run_crashing_after_step(config: Path, step: int, monkeypatch: Any) -> None:
    """Run ``config`` until the trainer has logged ``step``, then crash it (the next step's batch may be
    explored already, not trained); the run directory is left as a crash leaves it. ``monkeypatch`` is
    the test's (undone before returning)."""
    import pytest

    import trine.trainer.side
    from trine.config import load_config
    from trine.loop import run

    consume = trine.trainer.side.TrainerSide.consume

    def crash_after(side):
        if side.version == step:
            raise Crash(f"simulated crash after step {step}")
        return consume(side)

    monkeypatch.setattr(trine.trainer.side.TrainerSide, "consume", crash_after)
    with pytest.raises(Crash):
        run(load_config(config))
    monkeypatch.undo()


def wandb_history(run_dir: Path) -> list[dict]:
    """The history records of one offline W&B run directory, as W&B's own inspector prints them."""
    out = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_dir)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return [r["history"]["item"] for r in records if r.get("type") == "history"]


# ------------------------------------------------------------------------------ models and the trainer
QUESTIONS = ["hi", "What is 2+3? Tell me now, please.", "Once upon a time", "def f(x):"]
"""Four prompts of different lengths for the engine tests."""


def prompts(tokenizer: Any) -> list[list[int]]:
    """:data:`QUESTIONS` tokenized (no chat template)."""
    return [tokenizer(q)["input_ids"] for q in QUESTIONS]


def assert_greedy_matches_hf_generate(
    engine: Any, model: Any, tokenizer: Any, prompt: list[int], max_tokens: int = 12
) -> None:
    """The engine's greedy completion of ``prompt`` is HF ``generate``'s (on the model's device)."""
    import torch

    (completion,) = engine.generate_batch([(prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens))])[
        0
    ]
    with torch.no_grad():
        hf = model.generate(
            torch.tensor([prompt], device=model.device),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=model.device),
            do_sample=False,
            max_new_tokens=max_tokens,
            pad_token_id=tokenizer.pad_token_id,
        )
    expected = hf[0, len(prompt) :].tolist()
    if tokenizer.eos_token_id in expected:
        expected = expected[: expected.index(tokenizer.eos_token_id) + 1]
    assert completion.response_ids == expected


LORA = {"rank": 4, "alpha": 8.0, "dropout": 0.0, "target_modules": "all-linear"}
"""A small ``trainer.lora`` for the tiny model."""


def shifted_experiences(model: Any, tokenizer: Any, shift: float) -> list[Experience]:
    """Three rollout-like experiences (group ``g``, rewards 1, 0, 0.5) whose engine logprobs are ``model``'s
    own minus ``shift`` (a rollout engine that under-reports every token's probability by e^shift)."""
    import torch

    from trine.models.batching import collate, forward_logprobs

    out = []
    for q, a, r in [("2+3?", "5 is it", 1.0), ("Hi", "hello there", 0.0), ("x", "yes no", 0.5)]:
        prompt, response = tokenizer(q)["input_ids"], tokenizer(a)["input_ids"]
        e = Experience(
            tokens=prompt + response,
            prompt_length=len(prompt),
            action_mask=[1] * len(response),
            reward=r,
            group_id="g",
        )
        with torch.no_grad():
            lp, _ = forward_logprobs(model, collate([e], [0], tokenizer.pad_token_id, "cpu"))
        e.logprobs = (lp[0] - shift).tolist()
        out.append(e)
    return out


# ------------------------------------------------------------------------------------- weight sync
def filled_model(value: float, size: int = 1000) -> Any:
    """An ``nn.Module`` whose every weight equals ``value`` (so a reader can tell which version it holds):
    ``embed`` and ``head`` (``Linear(size, 4)``, ``head`` tied to ``embed`` like a language model's output
    layer) and ``norm`` (``size`` values)."""
    import torch
    from torch import nn

    module = nn.Module()
    module.embed = nn.Linear(size, 4, bias=False)
    module.head = nn.Linear(size, 4, bias=False)
    module.head.weight = module.embed.weight
    module.norm = nn.Parameter(torch.empty(size))
    with torch.no_grad():
        for p in module.parameters():
            p.fill_(value)
    return module


class WeightsChecker:
    """A rollout model that records what it was loaded with and checks it is one whole version of
    :func:`filled_model` (every tensor equal to the version, the keys ``keys``)."""

    def __init__(self, keys: list[str]) -> None:
        self.policy_version = 0
        self.keys = keys
        self.loaded: list[int] = []

    def load_weights(self, state_dict: dict[str, Any], version: int) -> None:
        if list(state_dict) != self.keys:
            raise AssertionError(f"version {version} has keys {list(state_dict)}, expected {self.keys}")
        for key, value in state_dict.items():
            if not bool((value == float(version)).all()):
                raise AssertionError(f"version {version}: {key} holds other values {value.unique()[:4]}")
        self.policy_version = version
        self.loaded.append(version)


# -------------------------------------------------------------------------------------- environments
class ScriptedModel:
    """A rollout model for environment workflows whose reply is ``policy(observation)``; tokens are the
    text's bytes."""

    def __init__(self, policy: Callable[[str], str]) -> None:
        self.policy = policy
        self.observations: list[str] = []

    async def chat(self, messages: list[dict[str, Any]], params: SamplingParams) -> list[Completion]:
        observation = messages[-1]["content"]
        self.observations.append(observation)
        await asyncio.sleep(0)  # let concurrent episodes interleave
        text = self.policy(observation)
        response = list(text.encode()) or [0]
        return [
            Completion(list(observation.encode())[:64] or [0], response, [-0.5] * len(response), text, "stop")
        ]

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> list[Completion]:
        raise NotImplementedError


def env_task(task_id: str = "t/0", repeat: int = 1, **raw: Any) -> Task:
    """A ``step_wise`` task (question ``play``, ``raw`` the row's other columns: ``seed``, env options)."""
    return Task(
        task_id=task_id,
        question="play",
        raw={"question": "play", **raw},
        workflow="step_wise",
        repeat=repeat,
        sampling=SamplingParams(temperature=1.0, max_tokens=8),
    )


class FaultyEnv:
    """A Gymnasium-style env that raises or hangs at a chosen call, once: in the first episode that reaches it
    (the plan set by :func:`arm_faulty_env`); four steps of reward 0.5 otherwise."""

    built = 0
    closed = 0
    plan: dict[str, object] = {}

    def __init__(self) -> None:
        type(self).built += 1
        self.armed = type(self).plan  # the plan it was built under: an env left running by an earlier test
        self.turns = 0  # (an abandoned thread) never fires, nor uses up, a later test's plan

    def _maybe_fail(self, call: str) -> None:
        plan = self.plan
        if (
            self.armed is plan
            and not plan.get("fired")
            and plan.get("call") == call
            and plan.get("at", 0) == self.turns
        ):
            plan["fired"] = True  # the first env to reach the call fails, once
            if self.plan.get("mode") == "hang":
                time.sleep(float(self.plan.get("seconds", 3.0)))
            elif self.plan.get("mode") == "own_timeout":
                raise TimeoutError("the simulator's own clock ran out")
            else:
                raise ConnectionError(f"simulator lost during {call}")

    def reset(self, *, seed=None, options=None):
        self.turns = 0
        self._maybe_fail("reset")
        return "go", {}

    def step(self, action: str):
        self._maybe_fail("step")
        self.turns += 1
        return f"turn {self.turns}", 0.5, self.turns >= 4, False, {}

    def close(self) -> None:
        type(self).closed += 1


def arm_faulty_env(**plan: Any) -> None:
    """Reset :class:`FaultyEnv`'s counters and set its plan: ``call`` (``reset`` or ``step``), ``at`` (the
    turn), ``mode`` (raise ConnectionError by default, ``hang`` for ``seconds``, ``own_timeout``)."""
    FaultyEnv.built, FaultyEnv.closed, FaultyEnv.plan = 0, 0, dict(plan)


# ---------------------------------------------------------------------------------------- trine serve
SERVE_MODEL = "tiny"
"""The model name the servers of :func:`serving` answer to."""

GOOD_CHAT = {"model": SERVE_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
"""A good chat-completions request body for :func:`serving`'s servers."""


@dataclass
class Served:
    """A running server: base URL, its recorder, buffer and ``OpenAIServer``."""

    url: str
    store: Any
    server: Any

    @property
    def buffer(self) -> Any:
        return self.store.buffer

    def client(self, api_key: str = "unused") -> Any:
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=api_key, max_retries=0, timeout=20)

    def post(self, path: str, body: Any = None, **kwargs: Any) -> Any:
        import httpx

        return httpx.post(f"{self.url}{path}", json=body, timeout=20, **kwargs)


def serve_settings() -> Any:
    """The default settings of :func:`serving`: model :data:`SERVE_MODEL`, ``max_tokens`` 16 (6 by
    default), prompts up to 300 tokens, ``n`` up to 4, sessions kept 60 s."""
    from trine.serve import ServeSettings

    return ServeSettings(
        model_name=SERVE_MODEL,
        max_tokens=16,
        default_max_tokens=6,
        max_prompt_tokens=300,
        max_n=4,
        session_timeout=60,
    )


@contextlib.contextmanager
def serving(
    engine: Any,
    buffer: Any,
    settings: Any = None,
    write_timeout: float = 10.0,
    extend: Callable[[Any], None] | None = None,
) -> Iterator[Served]:
    """Run ``create_app`` (``settings``, default :func:`serve_settings`) under uvicorn on 127.0.0.1 (a free
    port) in a thread until the block ends (``extend(app)`` may add routes first)."""
    import uvicorn

    from trine.serve import SessionStore, create_app

    settings = serve_settings() if settings is None else settings
    timeout = settings.session_timeout
    store = SessionStore(buffer, engine.tokenizer, session_timeout=timeout, write_timeout=write_timeout)
    app = create_app(engine, store, settings)
    if extend is not None:
        extend(app)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error"))
    thread = threading.Thread(target=server.run, name="trine-serve-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the test server did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield Served(f"http://127.0.0.1:{port}", store, app.state.server)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def shared_once(tmp_path_factory: Any, name: str, build: Callable[[Path], Path]) -> Path:
    """``build(root)`` once per test session, also across pytest-xdist workers: the first worker builds it
    in a directory every worker sees while holding a file lock, the others wait and reuse what it built
    (``build`` returns the path to reuse; it is written into ``<root>/done``)."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    root = shared / f"shared-{name}"
    root.mkdir(parents=True, exist_ok=True)
    with open(shared / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        done = root / "done"
        if not done.is_file():
            done.write_text(str(build(root)))
        return Path(done.read_text())


class Receiver:
    """A local webhook (an HTTP server in a thread): ``url``, ``got`` (the JSON bodies POSTed to it, in
    order) and ``types`` (their content types); it answers ``status``."""

    def __init__(self, status: int = 200) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        got: list[dict] = []
        types: list[str] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                types.append(self.headers["Content-Type"])
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.got, self.types = got, types
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """The URL of a server that accepts connections and never answers."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(listener.accept()[0])

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/hook"
    finally:
        stop.set()
        for conn in held:
            conn.close()
        listener.close()


def closed_port() -> str:
    """The URL of a local port nothing listens on."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/hook"
