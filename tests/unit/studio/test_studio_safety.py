"""The studio's safety rules over real HTTP: run names never leave the runs directory, tokens, annotator
tokens, JSON-only and same-origin writes, loopback-only hosts without a token, and `trine studio`'s
refusal of bad options."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import httpx
import pytest

pytest.importorskip("fastapi", reason="the studio needs fastapi (pip install -e '.[dev]')")
pytest.importorskip("uvicorn", reason="the studio needs uvicorn (pip install -e '.[dev]')")
from typer.testing import CliRunner  # noqa: E402

from trine.cli import app as cli_app  # noqa: E402
from trine.studio.server import background, ensure_token  # noqa: E402
from trine.studio.settings import COOKIE, StudioSettings  # noqa: E402

SECRET = "S3CRET-outside-the-runs-dir"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A runs directory with one run, a run-like directory outside it full of secrets, and a symlink
    from the runs directory to it."""
    base = tmp_path_factory.mktemp("safety")
    outside = base / "outside"
    outside.mkdir()
    for name in ("config.yaml", "status.json", "metrics.jsonl", "annotations.db"):
        (outside / name).write_text(json.dumps({"step": 1, "state": "finished", "secret": SECRET}) + "\n")
    root = base / "runs"
    (root / "ok").mkdir(parents=True)
    (root / "ok" / "status.json").write_text(json.dumps({"state": "finished", "step": 1}))
    (root / "escape").symlink_to(outside, target_is_directory=True)
    return root


NAMES = [
    "..",
    "%2e%2e",
    "%2E%2E",
    "..%2Foutside",
    "%2e%2e%2foutside",
    "a%2Fb",
    "%2Fetc%2Fpasswd",
    "escape",
    ".hidden",
    "ok%00",
    "ok%2F..%2F..%2Foutside",
]
GETS = [
    "",
    "/metrics",
    "/evals",
    "/experiences",
    "/experiences/facets",
    "/experiences/x1",
    "/annotations",
    "/annotations/export",
]
POSTS = ["/annotations/claim", "/annotations/answer", "/annotations/import"]


def test_run_names_never_leave_the_runs_directory(runs):
    settings = StudioSettings(runs_dir=runs, annotators={"ann": "alice"})
    with background(settings) as url, httpx.Client(base_url=url) as api:
        listed = [r["name"] for r in api.get("/api/runs").json()["runs"]]
        assert listed == ["ok"]  # the symlink out is not a run
        assert api.get("/api/runs/ok").status_code == 200
        for name in NAMES:
            expected = (
                (400,) if name in ("escape", "%2e%2e", ".hidden") else (400, 404)
            )  # ".." is cut by httpx
            for tail in GETS:
                r = api.get(f"/api/runs/{name}{tail}")
                assert r.status_code in expected, (name, tail, r.status_code, r.text)
                assert SECRET not in r.text
            for tail in POSTS:
                body = [] if tail.endswith("import") else {"n": 1, "answers": []}
                r = api.post(f"/api/runs/{name}{tail}", json=body, headers={"X-Annotator-Token": "ann"})
                assert r.status_code in expected, (name, tail, r.status_code, r.text)
                assert SECRET not in r.text
        detail = api.get("/api/runs/escape").json()["detail"]
        assert "resolves outside the runs directory" in detail
        assert "not allowed" in api.get("/api/runs/%2e%2e/metrics").json()["detail"]
        parts = urlsplit(url)
        for raw in (
            "/api/runs/../outside",
            "/api/runs/../metrics",
            "/api/runs/..%2F..%2F/evals",
            "/api/runs//etc/passwd/metrics",
            f"/api/runs/{runs.parent / 'outside'}/metrics",
        ):
            conn = http.client.HTTPConnection(
                parts.hostname, parts.port, timeout=10
            )  # no client-side cleanup
            conn.request("GET", raw)
            response = conn.getresponse()
            body = response.read().decode()
            conn.close()
            assert response.status in (400, 404), (raw, response.status, body)
            assert SECRET not in body


def test_a_token_protected_studio(runs):
    settings = StudioSettings(runs_dir=runs, token="tok-123", annotators={"ann-456": "alice"})
    with background(settings) as url:
        with httpx.Client(base_url=url) as api:
            assert api.get("/api/runs").status_code == 401
            assert "needs its token" in api.get("/api/runs/ok").json()["detail"]
            assert api.get("/api/runs", headers={"Authorization": "Bearer nope"}).status_code == 401
            assert api.get("/api/runs", headers={"Authorization": "Bearer tok-123"}).status_code == 200
            assert api.get("/api/runs", headers={"Authorization": "tok-123"}).status_code == 200
            assert api.get("/", params={"token": "wrong"}).cookies.get(COOKIE) is None
            assert api.get("/", params={"token": "é✓"}).status_code == 200  # a non-ASCII guess: just wrong
            assert api.get("/api/runs").status_code == 401
            assert api.get("/static/vendor/uPlot.min.css").status_code == 200  # no data: no token needed
        with httpx.Client(base_url=url, cookies={COOKIE: "wrong"}) as forged:
            assert forged.get("/api/runs").status_code == 401
        with httpx.Client(base_url=url, follow_redirects=False) as browser:
            opened = browser.get("/", params={"token": "tok-123"})
            assert opened.status_code == 303 and opened.headers["location"] == "/"
            assert "httponly" in opened.headers["set-cookie"].lower()
            assert browser.cookies.get(COOKIE) == "tok-123"
            assert browser.get("/api/runs").status_code == 200  # the cookie opens the API
        with httpx.Client(base_url=url, headers={"X-Annotator-Token": "ann-456"}) as annotator:
            assert annotator.get("/api/annotator").status_code != 401
            for path in ("/api/runs/ok/annotations/claim", "/api/runs/ok/annotations/answer"):
                assert annotator.post(path, json={"n": 1, "answers": []}).status_code != 401
            for path in (
                "/api/runs",
                "/api/runs/ok",
                "/api/runs/ok/metrics",
                "/api/runs/ok/annotations",
                "/api/runs/ok/annotations/export",
                "/api/runs/ok/experiences",
                "/api/config/schema",
            ):
                assert annotator.get(path).status_code == 401, path
            for path in ("/api/runs/ok/annotations/import", "/api/config/validate", "/api/config/start"):
                assert annotator.post(path, json={}).status_code == 401, path
        with httpx.Client(base_url=url, headers={"X-Annotator-Token": "ann-wrong"}) as stranger:
            assert stranger.get("/api/annotator").status_code == 401
            assert stranger.post("/api/runs/ok/annotations/claim", json={"n": 1}).status_code == 401


def test_writes_must_be_json_and_same_origin_and_hosts_loopback(runs):
    with background(StudioSettings(runs_dir=runs)) as url, httpx.Client(base_url=url) as api:
        r = api.post("/api/config/validate", content="yaml: 1", headers={"Content-Type": "text/plain"})
        assert r.status_code == 415 and "application/json" in r.json()["detail"]
        assert (
            api.post(
                "/api/config/validate",
                content=b"a=1",
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            ).status_code
            == 415
        )
        r = api.post(
            "/api/config/validate", json={"yaml": "name: x"}, headers={"Origin": "https://evil.example"}
        )
        assert r.status_code == 403 and "evil.example" in r.json()["detail"]
        assert (
            api.post("/api/config/validate", json={"yaml": "x"}, headers={"Origin": "null"}).status_code
            == 403
        )
        same = api.post("/api/config/validate", json={"yaml": "name: x"}, headers={"Origin": url})
        assert same.status_code not in (401, 403, 415)
        # DNS rebinding: evil.example resolved to 127.0.0.1 reaches the port, with its own Host header
        r = api.get("/api/runs", headers={"Host": "evil.example:80"})
        assert r.status_code == 403 and "loopback" in r.json()["detail"]
        port = urlsplit(url).port
        for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
            assert api.get("/api/runs", headers={"Host": host}).status_code == 200, host
    with background(StudioSettings(runs_dir=runs, token="t")) as url, httpx.Client(base_url=url) as api:
        # with a token, any host name may reach it (behind a proxy, on a LAN) but needs the token
        assert (
            api.get("/api/runs", headers={"Host": "studio.lan", "Authorization": "Bearer t"}).status_code
            == 200
        )


def test_ensure_token_only_off_loopback(runs):
    for host in ("0.0.0.0", "192.168.1.5", "::"):
        settings = StudioSettings(runs_dir=runs)
        assert ensure_token(settings, host) is True and settings.token and len(settings.token) >= 20
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2"):
        settings = StudioSettings(runs_dir=runs)
        assert ensure_token(settings, host) is False and settings.token is None
    given = StudioSettings(runs_dir=runs, token="mine")
    assert ensure_token(given, "0.0.0.0") is False and given.token == "mine"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--annotator", ""], "--annotator '': expected a non-empty name"),
        (["--annotator", "  "], "expected a non-empty name"),
        (["--annotator", "bob", "--annotator", "bob"], "--annotator 'bob' is given twice"),
        (["--config", "missing.yaml"], "--config missing.yaml: no such file"),
        (["--plugin", "missing.py"], "--plugin missing.py: no such file"),
    ],
)
def test_trine_studio_refuses_bad_options(tmp_path, monkeypatch, options, message):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli_app, ["studio", "--runs", str(tmp_path / "runs"), *options])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "runs").exists()  # refused before anything was made or served
