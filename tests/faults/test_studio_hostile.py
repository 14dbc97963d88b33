"""The studio against a hostile client, over real HTTP (issue 25): DNS-rebinding host names, origins of
another scheme, runs whose config writes outside the runs directory, symlinks leading out of it,
oversized and chunked bodies, and YAML that explodes (billion laughs) or nests without end.

Each test starts a real studio (:func:`trine.studio.server.background`) and speaks to it as an attacker
would: raw sockets where a client library would clean the request up.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

pytest.importorskip("fastapi", reason="the studio needs fastapi (pip install -e '.[dev]')")
pytest.importorskip("uvicorn", reason="the studio needs uvicorn (pip install -e '.[dev]')")

from trine.studio import configs  # noqa: E402
from trine.studio.server import background  # noqa: E402
from trine.studio.settings import StudioSettings  # noqa: E402

SECRET = "S3CRET-outside-the-runs-dir"
CONFIG = """\
num_threads: 1
model: {{path: {model}, init_preset: tiny-1m}}
tasks:
  batch_size: 2
  total_steps: 1
  train: {{path: {data}, reward: exact_match, repeat: 2, sampling: {{max_tokens: 3}}}}
monitor: {{plot: false}}
"""


def raw(url: str, head: str, chunks=(), limit_s: float = 20.0) -> tuple[int, str, float]:
    """Send ``head`` (request line and headers, without the blank line) then ``chunks`` on a plain socket,
    stopping early once the server answers; ``(status, body, seconds until the answer)``."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=limit_s)
    start = time.monotonic()
    sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n\r\n")
    answered = threading.Event()

    def send() -> None:
        try:
            for chunk in chunks:
                if answered.is_set():
                    return
                sock.sendall(chunk)
        except OSError:  # the server closed the connection after its answer: what we want
            pass

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    data = b""
    try:
        while b"\r\n\r\n" not in data or len(data) < data.index(b"\r\n\r\n") + 4 + _length(data):
            got = sock.recv(65536)
            if not got:
                break
            data += got
            answered.set()
    finally:
        seconds = time.monotonic() - start
        answered.set()
        sock.close()
        sender.join(10)
    head_part, _, body = data.partition(b"\r\n\r\n")
    status = int(head_part.split(b" ", 2)[1]) if head_part else 0
    return status, body.decode(errors="replace"), seconds


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


@pytest.fixture
def project(tmp_path):
    """``{"root", "runs", "outside", "data"}``: a studio root with a taskset, an empty runs directory and a
    directory outside it."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "outside").mkdir()
    rows = [{"question": f"{a}+1=", "answer": str(a + 1)} for a in range(4)]
    (tmp_path / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return {
        "root": tmp_path,
        "runs": tmp_path / "runs",
        "outside": tmp_path / "outside",
        "data": tmp_path / "data.jsonl",
    }


@pytest.fixture
def launched(monkeypatch):
    """The studio's starts, recorded instead of run (the pid is made up): nothing outlives the test."""
    started: list[Path] = []

    def fake_launch(launch: Path, settings: StudioSettings) -> int:
        started.append(launch)
        return 4242

    monkeypatch.setattr(configs, "launch_run", fake_launch)
    return started


# -- 1. DNS rebinding --------------------------------------------------------------------------------


def test_host_names_that_only_start_like_loopback_are_refused(project, launched):
    settings = StudioSettings(runs_dir=project["runs"], root=project["root"])
    text = CONFIG.format(model=project["runs"] / "model", data=project["data"])
    with background(settings) as url, httpx.Client(base_url=url, timeout=30) as api:
        port = urlsplit(url).port
        for name in (
            "127.evil.example",
            "127.0.0.1.nip.io",
            "localhost.evil.example",
            "127.0.0.1.",
            "0x7f.1",
        ):
            host = f"{name}:{port}"
            r = api.get("/api/runs", headers={"Host": host})
            assert r.status_code == 403 and "loopback" in r.json()["detail"], (host, r.status_code)
            origin = f"http://{host}"  # the rebound page's own origin: same-origin to the browser
            r = api.post(
                "/api/config/start",
                json={"yaml": text, "name": "rebound"},
                headers={"Host": host, "Origin": origin},
            )
            assert r.status_code == 403, (host, r.status_code, r.text)
        status, _, _ = raw(url, f"GET /api/runs HTTP/1.1\nHost: [::1:{port}")  # malformed: refused, not a 500
        assert status in (400, 403)
        assert not (project["runs"] / "rebound").exists() and launched == []
        for host in (
            f"127.0.0.1:{port}",
            f"127.0.0.2:{port}",
            f"localhost:{port}",
            f"[::1]:{port}",
            "localhost",
        ):
            assert api.get("/api/runs", headers={"Host": host}).status_code == 200, host


# -- 6. the full origin ------------------------------------------------------------------------------


def test_origin_must_match_scheme_host_and_port(project):
    with background(StudioSettings(runs_dir=project["runs"])) as url, httpx.Client(base_url=url) as api:
        port = urlsplit(url).port
        body = {"yaml": "name: x"}
        for origin in (f"https://127.0.0.1:{port}", f"ws://127.0.0.1:{port}", "http://127.0.0.1", f"http://localhost:{port}",
                       f"http://127.0.0.1:{port + 1}", "null", "http://[::1"):  # fmt: skip
            r = api.post("/api/config/validate", json=body, headers={"Origin": origin})
            assert r.status_code == 403 and "cross-origin" in r.json()["detail"], (origin, r.status_code)
        for origin in (url, f"HTTP://127.0.0.1:{port}", f"http://127.0.0.1:{port}/"):
            assert (
                api.post("/api/config/validate", json=body, headers={"Origin": origin}).status_code == 200
            ), origin
        # default ports: Host without a port is port 80 of http, as the browser's origin says
        same = api.post(
            "/api/config/validate", json=body, headers={"Host": "127.0.0.1", "Origin": "http://127.0.0.1:80"}
        )
        assert same.status_code == 200
        other = api.post(
            "/api/config/validate", json=body, headers={"Host": "127.0.0.1", "Origin": "https://127.0.0.1"}
        )
        assert other.status_code == 403


# -- 2. writes outside the runs directory ------------------------------------------------------------


def test_a_started_run_writes_only_inside_the_runs_directory(project, launched):
    runs, out = project["runs"], project["outside"]
    settings = StudioSettings(runs_dir=runs, root=project["root"])
    inside = CONFIG.format(model=runs / "model", data=project["data"])
    hostile = {
        "sqlite and a model built outside": (
            CONFIG.format(model=out / "model", data=project["data"])
            + f"buffer: {{storage: sql, url: 'sqlite:///{out / 'buffer.db'}'}}\n",
            ["model.path", "buffer.url"],
        ),
        "a relative sqlite path leaves by ..": (
            inside + "buffer: {storage: sql, url: 'sqlite:///runs/../outside/buffer.db'}\n",
            ["buffer.url"],
        ),
        "a file buffer's path": (
            inside + f"buffer: {{storage: file, storage_args: {{path: {out / 'buffer.jsonl'}}}}}\n",
            ["buffer.storage_args.path"],
        ),
        "a stage of its own": (
            inside
            + f"stages:\n  - stage: a\n  - stage: b\n    buffer: {{storage: sql, url: 'sqlite:///{out}/b.db'}}\n",
            ["stages.1.buffer.url"],
        ),
    }
    with background(settings) as url, httpx.Client(base_url=url, timeout=60) as api:
        for i, (what, (text, keys)) in enumerate(hostile.items()):
            valid = api.post("/api/config/validate", json={"yaml": text}).json()
            assert valid["ok"], (what, valid)  # as `trine run` would run it
            r = api.post("/api/config/start", json={"yaml": text, "name": f"hostile-{i}"})
            assert r.status_code == 422, (what, r.status_code, r.text)
            errors = r.json()["detail"]["errors"]
            assert sorted(e["path"] for e in errors) == sorted(keys), (what, errors)  # every key, at once
            assert all("outside the runs directory" in e["message"] for e in errors), errors
            assert all(e["line"] for e in errors), errors
            assert not (runs / f"hostile-{i}").exists(), what
        assert list(out.iterdir()) == [] and launched == []  # nothing written, nothing started
        ok = api.post("/api/config/start", json={"yaml": inside, "name": "fine"})
        assert ok.status_code == 200, ok.text
        assert launched == [runs.absolute() / "fine" / "launch.yaml"]


def test_a_started_run_starts_no_program_a_config_names(project, launched):
    runs = project["runs"]
    text = CONFIG.format(model=runs / "model", data=project["data"]).replace(
        "reward: exact_match,",
        "reward: exact_match, workflow: tool_agent, "
        "workflow_args: {mcp_servers: [{command: [touch, /tmp/trine-studio-pwned]}]},",
    )
    with background(StudioSettings(runs_dir=runs, root=project["root"])) as url:
        r = httpx.post(f"{url}/api/config/start", json={"yaml": text, "name": "mcp"}, timeout=60)
    assert r.status_code == 422, r.text
    (error,) = r.json()["detail"]["errors"]
    assert (
        error["path"] == "tasks.train.workflow_args.mcp_servers.0.command" and "trine run" in error["message"]
    )
    assert launched == [] and not (runs / "mcp").exists()


# -- 3. symlinks leading out -------------------------------------------------------------------------


@pytest.fixture
def linked(project):
    """A runs directory whose runs hold links leading out of it (and, as controls, a link that stays)."""
    runs, out = project["runs"], project["outside"]
    for name in ("metrics.jsonl", "status.json", "config.yaml"):
        (out / name).write_text(json.dumps({"step": 1, "state": "finished", "secret": SECRET}) + "\n")
    (out / "checkpoints" / "step_1").mkdir(parents=True)
    (out / "checkpoints" / "step_1" / "loop_state.pt").write_text(SECRET)
    status = json.dumps({"state": "finished", "step": 1})
    for name in ("metrics", "config", "checkpoints", "chain", "good", "inner"):
        (runs / name).mkdir()
        (runs / name / "status.json").write_text(status)
    (runs / "good" / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5}) + "\n")
    (runs / "metrics" / "metrics.jsonl").symlink_to(out / "metrics.jsonl")
    (runs / "config" / "config.yaml").symlink_to(out / "config.yaml")
    (runs / "checkpoints" / "config.yaml").write_text("buffer: {storage: memory}\n")
    (runs / "checkpoints" / "checkpoints").symlink_to(out / "checkpoints", target_is_directory=True)
    (runs / ".hop" / "explorers" / "0").mkdir(parents=True)  # a link inside, to a link out
    (runs / ".hop" / "explorers" / "0" / "status.json").symlink_to(out / "status.json")
    (runs / "chain" / "explorers").symlink_to(runs / ".hop" / "explorers", target_is_directory=True)
    (runs / "inner" / "metrics.jsonl").symlink_to(Path("..") / "good" / "metrics.jsonl")  # stays inside
    return project


def test_files_linked_from_outside_the_runs_directory_are_never_served(linked):
    with background(StudioSettings(runs_dir=linked["runs"])) as url, httpx.Client(base_url=url) as api:
        listing = api.get("/api/runs")
        assert listing.status_code == 200 and SECRET not in listing.text
        assert sorted(r["name"] for r in listing.json()["runs"]) == ["good", "inner"]
        notes = " ".join(listing.json()["notes"])
        for name in ("metrics", "config", "checkpoints", "chain"):
            assert f"'{name}'" in notes and "outside the runs directory" in notes
            for tail in (
                "",
                "/metrics",
                "/evals",
                "/experiences",
                "/experiences/facets",
                "/annotations/export",
            ):
                r = api.get(f"/api/runs/{name}{tail}")
                assert r.status_code == 400, (name, tail, r.status_code, r.text)
                assert SECRET not in r.text and "outside the runs directory" in r.json()["detail"]
        for name in ("metrics", "config", "checkpoints", "chain"):  # nor compared with a good run
            r = api.get("/api/compare", params={"runs": f"good,{name}"})
            assert r.status_code == 400 and SECRET not in r.text, (name, r.status_code, r.text)
            said = r.json()["detail"]
            assert f"run {name!r}" in said and "outside the runs directory" in said
        compared = api.get("/api/compare", params={"runs": "good,inner,../outside,x"})
        assert compared.status_code == 400 and "not allowed" in compared.json()["detail"]
        assert api.get("/api/compare", params={"runs": "good,inner"}).status_code == 200
        detail = api.get("/api/runs/metrics").json()["detail"]
        assert "metrics.jsonl" in detail and str(linked["outside"] / "metrics.jsonl") in detail
        assert "explorers" in api.get("/api/runs/chain").json()["detail"]
        template = api.get("/api/config/template", params={"id": "run:config"})
        assert template.status_code == 400 and SECRET not in template.text
        assert api.get("/api/config/templates").json()["templates"] == []  # `config` is not offered
        assert api.get("/api/runs/inner/metrics").json()["rows"] == [{"step": 1, "loss": 0.5}]


# -- 4. bodies and YAML that cost too much -----------------------------------------------------------


def test_oversized_bodies_are_refused_before_they_are_read(project):
    with background(StudioSettings(runs_dir=project["runs"])) as url:
        host = urlsplit(url).netloc
        declared = f"POST /api/config/validate HTTP/1.1\nHost: {host}\nContent-Type: application/json\n"
        status, body, seconds = raw(
            url, declared + "Content-Length: 20000000", [b'{"yaml": "'] + [b"a" * 65536] * 4
        )
        assert status == 413 and seconds < 5, (status, body, seconds)
        assert "1048576 bytes" in body and "max_body_bytes" in body
        chunk = b"10000\r\n" + b"a" * 65536 + b"\r\n"  # 64 KiB chunks, no Content-Length, up to 200 MB
        status, body, seconds = raw(url, declared + "Transfer-Encoding: chunked", [chunk] * 3200)
        assert status == 413 and seconds < 10, (status, body, seconds)
        small = httpx.post(f"{url}/api/config/validate", json={"yaml": "name: x\n" + "# pad\n" * 100_000})
        assert small.status_code == 200  # ~600 KB: under the limit
        assert httpx.get(f"{url}/api/runs").status_code == 200  # the studio still answers


def test_a_smaller_body_limit_from_the_settings(project):
    settings = StudioSettings(runs_dir=project["runs"], max_body_bytes=1000)
    with background(settings) as url:
        assert httpx.post(f"{url}/api/config/validate", json={"yaml": "x" * 2000}).status_code == 413
        assert httpx.post(f"{url}/api/config/validate", json={"yaml": "name: x"}).status_code == 200


LAUGHS = "".join(
    f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}' if i else 'lol'] * 9)}]\n" for i in range(10)
)  # 9**10 'lol's once expanded: what a run's resolved config would hold


def _curriculum(value: str) -> str:
    """A valid config whose ``tasks.curriculum`` (free-form arguments) holds ``value`` (indented lines)."""
    text = CONFIG.format(model="runs/model", data="data.jsonl")
    return text.replace("monitor:", f"  curriculum:\n{value}monitor:")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (_curriculum(LAUGHS), "nodes"),
        (_curriculum("    x: " + "[" * 5000 + "]" * 5000 + "\n"), "nested"),
        (_curriculum("    x: " + "{a: " * 3000 + "1" + "}" * 3000 + "\n"), "nested"),
        (_curriculum("    x: &x {y: *x}\n"), "endless"),
    ],
    ids=["billion-laughs", "deep-list", "deep-map", "endless-alias"],
)
def test_yaml_that_explodes_or_nests_deeply_is_refused_quickly(project, launched, text, words):
    settings = StudioSettings(runs_dir=project["runs"], root=project["root"])
    with background(settings) as url, httpx.Client(base_url=url, timeout=20) as api:
        start = time.monotonic()
        r = api.post("/api/config/validate", json={"yaml": text})
        assert r.status_code == 200 and time.monotonic() - start < 5, (r.status_code, r.text[:300])
        (error,) = r.json()["errors"]
        assert r.json()["ok"] is False and words in error["message"] and error["line"], error
        r = api.post("/api/config/start", json={"yaml": text, "name": "boom"})
        assert r.status_code == 422 and time.monotonic() - start < 10
        assert not (project["runs"] / "boom").exists() and launched == []
