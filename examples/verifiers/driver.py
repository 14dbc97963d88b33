"""Run a verifiers environment against ``trine serve`` and send its rewards back, round after round.

verifiers (0.4, ``verifiers.v1``) plays its episodes with its own programs (``vf-eval``; here the ``null``
harness, one chat per task, in a ``subprocess`` runtime) against any OpenAI-compatible endpoint, and scores
each trace with the taskset's ``@vf.reward`` functions. It never sees Trine. This driver puts a small
recording proxy between the two:

- each ``/v1/chat/completions`` request is forwarded to ``trine serve`` with a ``task_id`` made from the
  round and the prompt, so the ``-r`` rollouts of one task form one GRPO group, and the proxy notes the
  response id and each choice's text;
- after the round, each trace's reward (the sum of its weighted reward scores) is posted to
  ``/v1/feedback`` for the responses whose prompt and text the trace holds (a multi-turn trace gives its
  reward to every call it made).

``trine train`` (mode async, the same run directory) trains on those rows and publishes weights that
``trine serve`` loads, so later rounds sample the newer policy. Only the standard library is used: run it
with the verifiers venv's python (``scripts/side_venv.sh verifiers verifiers==0.4.0 uv``), from anywhere::

    .venv-verifiers/bin/python examples/verifiers/driver.py --base-url http://127.0.0.1:8000/v1 \\
        --model serve_agent --rounds 10 --questions 8 --samples 4

Each round prints one JSON line: ``{"round", "reward", "traces", "posted", "unmatched"}``.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import statistics
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

HERE = Path(__file__).resolve().parent


class Recorder:
    """What the proxy saw: per (prompt text, reply text), the (response id, choice) pairs that answered it."""

    def __init__(self, upstream: str, round_tag: str = "r0") -> None:
        self.upstream = upstream.rstrip("/")
        self.round_tag = round_tag
        self.answers: dict[tuple[str, str], list[tuple[str, int]]] = {}
        self.lock = threading.Lock()

    def forward(
        self, path: str, method: str, body: bytes | None, headers: dict[str, str]
    ) -> tuple[int, bytes, str]:
        """Relay one request; returns (status, body, content type). Streamed answers (verifiers' chat
        program asks for ``stream: true``) are read whole, noted, and relayed as they came."""
        if method == "POST" and path.endswith("/chat/completions") and body:
            request = json.loads(body)
            key = prompt_text(request.get("messages") or [])
            request.setdefault("task_id", f"{self.round_tag}-{hashlib.sha1(key.encode()).hexdigest()[:12]}")
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


def trace_rewards(traces_file: Path) -> list[tuple[float, list[tuple[str, str]]]]:
    """Per trace of a ``vf-eval`` run: its reward and the (prompt text, reply text) of each model call."""
    found = []
    for line in traces_file.read_text().splitlines():
        episode = json.loads(line)
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


def run_round(args: argparse.Namespace, round_index: int, proxy_url: str, out: Path) -> Path:
    """One ``vf-eval`` over ``--questions`` tasks × ``--samples`` rollouts through the proxy."""
    vf_eval = Path(sys.executable).with_name("vf-eval")
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
        str(args.questions),
        "-r",
        str(args.samples),
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
        "--env.taskset.seed",
        str(args.seed + round_index),
        "-o",
        str(out),
        "--run.dir",
        f"round-{round_index}",
    ]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "TRINE_API_KEY": os.environ.get("TRINE_API_KEY", "unused"),
    }
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.round_timeout)
    files = glob.glob(str(out / f"round-{round_index}" / "traces.jsonl"))
    if done.returncode != 0 or not files:
        raise SystemExit(
            f"vf-eval failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    return Path(files[0])


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="trine serve's /v1 URL")
    parser.add_argument("--model", default="serve_agent", help="the served model's name")
    parser.add_argument(
        "--taskset", default="trine-sums", help="the verifiers taskset id (a package to import)"
    )
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--questions", type=int, default=8, help="tasks per round (vf-eval -n)")
    parser.add_argument(
        "--samples", type=int, default=4, help="rollouts per task (vf-eval -r; the GRPO group)"
    )
    parser.add_argument("--max-tokens", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0, help="round i uses taskset seed seed + i")
    parser.add_argument("--out", default="outputs/verifiers", help="vf-eval's output directory")
    parser.add_argument("--round-timeout", type=float, default=600)
    args = parser.parse_args(argv)
    recorder = Recorder(args.base_url)
    proxy = serve_proxy(recorder)
    proxy_url = f"http://127.0.0.1:{proxy.server_address[1]}/v1"
    log = []
    try:
        for r in range(args.rounds):
            recorder.round_tag, recorder.answers = f"r{r}", {}
            traces = trace_rewards(run_round(args, r, proxy_url, Path(args.out).absolute()))
            posted = unmatched = 0
            for reward, calls in traces:
                for call in calls:
                    matches = recorder.answers.get(call) or []
                    if not matches:
                        unmatched += 1
                        continue
                    response_id, choice = matches.pop(0)
                    post_feedback(args.base_url, response_id, choice, reward)
                    posted += 1
            score = statistics.fmean(reward for reward, _ in traces) if traces else 0.0
            log.append(
                {"round": r, "reward": score, "traces": len(traces), "posted": posted, "unmatched": unmatched}
            )
            print(json.dumps(log[-1]), flush=True)
    finally:
        proxy.shutdown()
    return log


if __name__ == "__main__":
    main()
