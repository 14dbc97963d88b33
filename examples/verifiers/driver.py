"""Run a verifiers environment against ``trine serve`` and send its rewards back as its episodes finish.

verifiers (0.4, ``verifiers.v1``) plays its episodes with its own programs (``vf-eval``; here the ``null``
harness, one chat per task, in a ``subprocess`` runtime) against any OpenAI-compatible endpoint, and scores
each trace with the taskset's ``@vf.reward`` functions. It never sees Trine. This driver puts a small
recording proxy between the two:

- each ``/v1/chat/completions`` request is forwarded to ``trine serve`` with a ``task_id`` made from the
  prompt and how often it was asked (every ``--samples`` asks of one prompt are one group: the ``-r``
  rollouts of a task form one GRPO group), and the proxy notes the response id and each choice's text;
- one ``vf-eval`` plays every task (``--rounds`` × ``--questions``, ``--samples`` rollouts each, at most
  ``--in-flight`` at once) and appends each finished episode to its ``traces.jsonl``; the driver follows
  that file and posts each trace's reward (the sum of its weighted reward scores) to ``/v1/feedback`` for
  the responses whose prompt and text the trace holds (a multi-turn trace gives its reward to every call
  it made). No round waits for its slowest rollout, and vf-eval starts once (~6 s of imports);
- a call of round r waits in the proxy until the served weights are at most ``--max-lag`` rounds behind
  (the served ``policy_version``), so a busy machine cannot make the programs sample from ever older
  weights while the trainer, one process among many, falls behind.

``trine train`` (mode async, the same run directory) trains on those rows and publishes weights that
``trine serve`` loads, so later rounds sample the newer policy. Only the standard library is used: run it
with the verifiers venv's python (``scripts/side_venv.sh verifiers verifiers==0.4.0 uv``), from anywhere::

    .venv-verifiers/bin/python examples/verifiers/driver.py --base-url http://127.0.0.1:8000/v1 \\
        --model verifiers --rounds 11 --questions 8 --samples 4   # examples/verifiers/config.yaml's recipe

Each ``--questions`` × ``--samples`` finished traces (a "round", one trainer batch when ``trainer.batch_size``
equals it) print one JSON line: ``{"round", "reward", "traces", "posted", "unmatched"}``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent


class Recorder:
    """What the proxy saw: per (prompt text, reply text), the (response id, choice) pairs that answered it."""

    def __init__(
        self, upstream: str, samples: int, tag: str = "vf", per_round: int = 0, max_lag: int | None = None
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.samples, self.tag = samples, tag
        self.per_round, self.max_lag = per_round, max_lag
        self.answers: dict[tuple[str, str], list[tuple[str, int]]] = {}
        self.asked: dict[str, int] = {}  # prompt text -> how many calls asked it
        self.calls = 0  # chat calls relayed so far
        self.lock = threading.Lock()

    def task_id(self, key: str) -> str:
        """Every ``samples`` asks of one prompt form one group (two tasks with the same question, in
        flight together, are still groups of ``samples`` answers to that question)."""
        with self.lock:
            count = self.asked.get(key, 0)
            self.asked[key] = count + 1
        return f"{self.tag}-{hashlib.sha1(key.encode()).hexdigest()[:12]}-{count // self.samples}"

    def served_version(self, headers: dict[str, str]) -> int:
        """The policy version ``trine serve`` samples from (listed with its model)."""
        request = urllib.request.Request(self.upstream + "/models", headers=headers)
        with urllib.request.urlopen(request, timeout=60) as response:
            listed = json.loads(response.read())["data"]
        return int(listed[0].get("policy_version", 0)) if listed else 0

    def hold(self, headers: dict[str, str]) -> None:
        """Hold a chat call of round r (by arrival: ``per_round`` calls a round) until the served weights
        are at most ``max_lag`` rounds behind it. vf-eval starts many programs, the trainer is one
        process: on a busy machine the programs took the cores and sampled from weights ever further
        behind, and the stale rows taught less (or were dropped)."""
        with self.lock:
            round_, self.calls = self.calls // max(self.per_round, 1), self.calls + 1
        if self.max_lag is None:
            return
        while round_ - self.served_version(headers) > self.max_lag:
            time.sleep(0.5)

    def forward(
        self, path: str, method: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes, str]:
        """Relay one request; returns (status, body, content type). Streamed answers (verifiers' chat
        program asks for ``stream: true``) are read whole, noted, and relayed as they came."""
        if method == "POST" and path.endswith("/chat/completions") and body:
            self.hold(headers)
            request = json.loads(body)
            key = prompt_text(request.get("messages") or [])
            request.setdefault("task_id", self.task_id(key))
            body = json.dumps(request).encode()
        url = self.upstream + path.removeprefix("/v1")
        out = urllib.request.Request(url, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(out, timeout=300) as response:
                status, data = response.status, response.read()
                kind = response.headers.get("Content-Type", "application/json")
        except urllib.error.HTTPError as err:
            return err.code, err.read(), "application/json"
        if method == "POST" and path.endswith("/chat/completions") and status == 200:
            response_id, texts = answer_texts(data, kind)
            with self.lock:
                for index, text in texts.items():
                    self.answers.setdefault((key, text), []).append((response_id, index))
        return status, data, kind


def answer_texts(data: bytes, kind: str) -> tuple[str, dict[int, str]]:
    """The response id and each choice's text of a chat answer, whole or streamed (server-sent events)."""
    if "event-stream" not in kind:
        answer = json.loads(data)
        return answer["id"], {
            c["index"]: (c.get("message") or {}).get("content") or "" for c in answer["choices"]
        }
    response_id, texts = "", {}
    for line in data.decode().splitlines():
        if not line.startswith("data: ") or line.strip() == "data: [DONE]":
            continue
        chunk = json.loads(line[len("data: ") :])
        response_id = chunk.get("id", response_id)
        for choice in chunk.get("choices", []):
            piece = (choice.get("delta") or {}).get("content") or ""
            texts[choice["index"]] = texts.get(choice["index"], "") + piece
    return response_id, texts


def prompt_text(messages: list) -> str:
    """The text of the messages a reply answered (role and content, in order)."""
    return "\n".join(f"{m.get('role')}: {content_text(m.get('content'))}" for m in messages)


def content_text(content) -> str:
    if isinstance(content, list):  # content parts
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def serve_proxy(recorder: Recorder) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def _relay(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {
                k: v for k, v in self.headers.items() if k.lower() in ("content-type", "authorization")
            }
            try:
                status, data, kind = recorder.forward(self.path, method, body, headers)
            except Exception as err:  # the upstream is down: say so to the caller
                status, kind = 502, "application/json"
                data = json.dumps({"error": {"message": f"trine serve: {err}"}}).encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's names
            self._relay("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._relay("POST")

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def trace_rewards(episode: dict) -> list[tuple[float, list[tuple[str, str]]]]:
    """Per trace of one episode line of ``traces.jsonl``: its reward and the (prompt text, reply text) of
    each model call."""
    found = []
    for trace in episode.get("traces", []):
        rewards = trace.get("rewards") or {}
        reward = sum(r["score"] * r.get("weight", 1.0) for r in rewards.values() if r)
        messages = [node.get("message") or {} for node in trace.get("nodes", [])]
        calls = []
        for i, message in enumerate(messages):
            if message.get("role") == "assistant":
                calls.append((prompt_text(messages[:i]), content_text(message.get("content"))))
        found.append((reward, calls))
    return found


def post_feedback(base_url: str, response_id: str, choice: int, reward: float) -> None:
    body = json.dumps({"response_id": response_id, "choice": choice, "reward": reward}).encode()
    request = urllib.request.Request(
        base_url.rstrip("/") + "/feedback",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60):
        pass


def launch(args: argparse.Namespace, proxy_url: str, out: Path) -> subprocess.Popen:
    """One ``vf-eval`` over every task (``--rounds`` × ``--questions``, ``--samples`` rollouts each, at most
    ``--in-flight`` episodes at once) through the proxy; its output goes to ``out/vf-eval.log``."""
    vf_eval = Path(sys.executable).with_name("vf-eval")
    tasks = args.rounds * args.questions
    command = [
        str(vf_eval),
        args.taskset,
        "--model",
        args.model,
        "--client.base-url",
        proxy_url,
        "--client.api-key-var",
        "TRINE_API_KEY",
        "-n",
        str(tasks),
        "-r",
        str(args.samples),
        "-c",
        str(args.in_flight),
        "--no-push",
        "--no-rich",
        "--clean",
        "--env.agent.harness.id",
        "null",
        "--env.agent.runtime.type",
        "subprocess",
        "--sampling.max-tokens",
        str(args.max_tokens),
        "--sampling.temperature",
        "1.0",
        "--env.taskset.num-tasks",
        str(tasks),
        "--env.taskset.seed",
        str(args.seed),
        "-o",
        str(out),
        "--run.dir",
        "run",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "TRINE_API_KEY": os.environ.get("TRINE_API_KEY", "unused"),
        # every rollout is a new Python process: without bytecode (uv compiles none by default) each one
        # compiles openai, httpx and mcp again, 1.5 s of CPU a rollout instead of 1.0
        "UV_COMPILE_BYTECODE": os.environ.get("UV_COMPILE_BYTECODE", "1"),
    }
    out.mkdir(parents=True, exist_ok=True)
    log = (out / "vf-eval.log").open("w")
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)


def follow(path: Path, proc: subprocess.Popen, deadline: float):
    """Each complete line appended to ``path`` while ``proc`` runs (and what is left once it ends)."""
    offset, partial = 0, ""
    while True:
        running = proc.poll() is None
        if path.exists():
            with path.open() as f:
                f.seek(offset)
                chunk = f.read()
                offset = f.tell()
            lines = (partial + chunk).split("\n")
            partial = lines.pop()
            for line in lines:
                if line.strip():
                    yield json.loads(line)
        if not running:
            return
        if time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"vf-eval ran past --timeout; its log: {path.parent.parent / 'vf-eval.log'}")
        time.sleep(0.2)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="trine serve's /v1 URL")
    parser.add_argument("--model", default="verifiers", help="the served model's name (the config's name)")
    parser.add_argument(
        "--taskset", default="trine-sums", help="the verifiers taskset id (a package to import)"
    )
    parser.add_argument(
        "--rounds", type=int, default=11, help="batches of tasks to play (one more than the trainer's steps)"
    )
    parser.add_argument("--questions", type=int, default=8, help="tasks per round")
    parser.add_argument(
        "--samples", type=int, default=4, help="rollouts per task (vf-eval -r; the GRPO group)"
    )
    parser.add_argument(
        "--in-flight",
        type=int,
        default=8,
        help="episodes at once (vf-eval -c): each runs a Python process, so about 4 per core",
    )
    parser.add_argument(
        "--max-lag",
        type=int,
        default=2,
        help="rounds a chat call may run ahead of the served weights (-1: no bound)",
    )
    parser.add_argument("--max-tokens", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0, help="the taskset's seed (its operands)")
    parser.add_argument("--out", default="outputs/verifiers", help="vf-eval's output directory")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds for the whole vf-eval run")
    args = parser.parse_args(argv)
    out = Path(args.out).absolute()
    per_round = args.questions * args.samples
    recorder = Recorder(
        args.base_url,
        args.samples,
        tag=f"vf{args.seed}-{int(time.time())}",
        per_round=per_round,
        max_lag=None if args.max_lag < 0 else args.max_lag,
    )
    proxy = serve_proxy(recorder)
    proxy_url = f"http://127.0.0.1:{proxy.server_address[1]}/v1"
    log, rewards, posted, unmatched = [], [], 0, 0
    try:
        proc = launch(args, proxy_url, out)
        traces_file = out / "run" / "traces.jsonl"
        for episode in follow(traces_file, proc, time.monotonic() + args.timeout):
            for reward, calls in trace_rewards(episode):
                for call in calls:
                    with recorder.lock:
                        matches = recorder.answers.get(call) or []
                        found = matches.pop(0) if matches else None
                    if found is None:
                        unmatched += 1
                        continue
                    post_feedback(args.base_url, found[0], found[1], reward)
                    posted += 1
                rewards.append(reward)
                if len(rewards) == per_round:
                    log.append(
                        {
                            "round": len(log),
                            "reward": statistics.fmean(rewards),
                            "traces": len(rewards),
                            "posted": posted,
                            "unmatched": unmatched,
                        }
                    )
                    print(json.dumps(log[-1]), flush=True)
                    rewards, posted, unmatched = [], 0, 0
        if proc.returncode != 0 or len(log) < args.rounds:
            tail = (out / "vf-eval.log").read_text()[-3000:]
            raise SystemExit(f"vf-eval failed (exit {proc.returncode}, {len(log)} rounds):\n{tail}")
    finally:
        proxy.shutdown()
    return log


if __name__ == "__main__":
    main()
