"""The studio's config API over real HTTP: schema, validation with key paths and lines, templates, start."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from trine import registry  # noqa: E402
from trine.studio.server import background  # noqa: E402
from trine.studio.settings import StudioSettings  # noqa: E402

GOOD = """\
name: tiny
num_threads: 1
model:
  path: model
  init_preset: tiny-1m
tasks:
  batch_size: 2
  total_steps: 1
  train:
    path: data/train.jsonl
    reward: exact_match
    repeat: 2
    sampling: {max_tokens: 3}
monitor: {plot: false}
"""


def _lines(text: str) -> dict[str, int]:
    """First line number (1-based) of each stripped line's text, for readable assertions."""
    found: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        found.setdefault(line.strip(), number)
    return found


@pytest.fixture
def studio(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a in range(3) for b in range(3)]
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "template.yaml").write_text(GOOD)
    runs = tmp_path / "runs"
    (runs / "r1").mkdir(parents=True)
    (runs / "r1" / "config.yaml").write_text("name: r1\n")
    (runs / "empty").mkdir()
    (runs / ".studio").mkdir()
    (runs / ".studio" / "config.yaml").write_text("not: a run\n")
    settings = StudioSettings(runs_dir=runs, root=tmp_path, config_files=[tmp_path / "template.yaml"])
    with background(settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def _validate(client: httpx.Client, text: str) -> dict:
    response = client.post("/api/config/validate", json={"yaml": text})
    assert response.status_code == 200, response.text
    return response.json()


def test_schema_lists_fields_with_type_default_and_doc(studio):
    from trine.config.learn import TrainerConfig

    fields = studio.get("/api/config/schema").json()["fields"]
    lr = fields["trainer.lr"]
    assert lr["default"] == TrainerConfig.model_fields["lr"].default
    assert "learning rate" in lr["doc"].lower() and lr["type"] == "float > 0" and lr["section"] is False
    assert fields["trainer"]["section"] is True and fields["trainer"]["default"] is None
    assert fields["tasks.train.sampling.temperature"]["section"] is False
    assert fields["tasks.eval"]["default"] == [] and "tasks.eval.reward" in fields
    assert fields["mode"]["type"] == "'sync' / 'async' / 'train'" and fields["mode"]["default"] == "sync"


def test_validate_good_config(studio):
    assert _validate(studio, GOOD) == {"ok": True, "errors": [], "stages": ["main"]}


def test_validate_reports_every_error_at_its_key_and_line(studio):
    text = GOOD.replace("  batch_size: 2", "  batch_size: 0").replace(
        "monitor: {plot: false}", "trainer:\n  lrr: 0.001\n  micro_batch_tokens: '64'\nmonitor: {plot: false}"
    )
    result = _validate(studio, text)
    assert result["ok"] is False and result["stages"] == []
    at = _lines(text)
    got = {e["path"]: (e["line"], e["message"]) for e in result["errors"]}
    assert {p: line for p, (line, _) in got.items()} == {
        "tasks.batch_size": at["batch_size: 0"],
        "trainer.lrr": at["lrr: 0.001"],
        "trainer.micro_batch_tokens": at["micro_batch_tokens: '64'"],
    }
    assert "did you mean 'lr'" in got["trainer.lrr"][1]
    assert "out of range; expected an integer >= 1" in got["tasks.batch_size"][1]
    assert "got the string '64'; expected an integer" in got["trainer.micro_batch_tokens"][1]


def test_yaml_syntax_error_has_its_line(studio):
    result = _validate(studio, GOOD.replace("  batch_size: 2", "  batch_size: [2"))
    assert result["ok"] is False and len(result["errors"]) == 1
    error = result["errors"][0]
    assert error["path"] is None and error["line"] == _lines(GOOD)["batch_size: 2"] + 1
    assert error["message"].startswith("not valid YAML")
    top = _validate(studio, "- a\n- b\n")["errors"]
    assert top[0]["line"] == 1 and "expected a mapping" in top[0]["message"]


def test_multi_stage_errors_carry_the_stage_and_inherited_keys_point_at_the_top_level(studio):
    text = GOOD + (
        "trainer: {micro_batch_tokens: 4096}\n"
        "stages:\n"
        "  - stage: first\n"
        "  - stage: second\n"
        "    trainer:\n"
        "      lr: -1.0\n"
        "    explorer: {max_retriez: 2}\n"
    )
    result = _validate(studio, text)
    at = _lines(text)
    got = {e["path"]: e["line"] for e in result["errors"]}
    assert got == {
        "stages.1.trainer.lr": at["lr: -1.0"],
        "stages.1.explorer.max_retriez": at["explorer: {max_retriez: 2}"],
    }
    missing = _validate(studio, text.replace("  train:\n", "  training:\n"))  # an inherited problem
    paths = {e["path"]: e["line"] for e in missing["errors"]}
    assert paths["stages.0.tasks.training"] == at["train:"]  # the unknown key at its top-level line


def test_missing_file_points_at_its_key(studio):
    text = GOOD.replace("data/train.jsonl", "data/nope.jsonl")
    (error,) = _validate(studio, text)["errors"]
    assert error["path"] == "tasks.train.path" and error["line"] == _lines(text)["path: data/nope.jsonl"]
    assert "nope.jsonl" in error["message"]


def test_import_paths_are_refused_and_never_imported(studio, tmp_path, monkeypatch):
    marker = tmp_path / "imported.txt"
    module = "trine_studio_probe_reward"
    (tmp_path / f"{module}.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n\ndef reward(response, task):\n    return 0.0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in (f"{module}:reward", "os:system"):
        text = GOOD.replace("reward: exact_match", f"reward: '{name}'")
        (error,) = _validate(studio, text)["errors"]
        assert error["path"] == "tasks.train.reward" and error["line"] == _lines(text)[f"reward: '{name}'"]
        assert "import paths are not loaded from the studio" in error["message"]
        assert "trine run" in error["message"] and "exact_match" in error["message"]
    assert not marker.exists() and module not in sys.modules
    started = studio.post("/api/config/start", json={"yaml": text, "name": "evil"})
    assert started.status_code == 422 and not (tmp_path / "runs" / "evil").exists()
    # control: outside the studio the same name is imported (the probe would have shown an import)
    assert registry.check("reward", f"{module}:reward") is None and marker.exists()
    sys.modules.pop(module, None)


def test_plugin_registered_names_stay_valid(studio):
    registry.register("reward", "studio_probe_plugin_reward")(lambda response, task: 1.0)
    try:
        text = GOOD.replace("reward: exact_match", "reward: studio_probe_plugin_reward")
        assert _validate(studio, text)["ok"] is True
    finally:
        registry._extra["reward"].pop("studio_probe_plugin_reward")


def test_templates_list_and_read(studio, tmp_path):
    listed = studio.get("/api/config/templates").json()["templates"]
    assert [t["id"] for t in listed] == ["run:r1", "file:0"]
    # with a fresh name to start under: the template run's own name is taken
    assert studio.get("/api/config/template", params={"id": "run:r1"}).json() == {
        "yaml": "name: r1\n",
        "name": "r1-2",
    }
    assert studio.get("/api/config/template", params={"id": "file:0"}).json() == {
        "yaml": GOOD,
        "name": "tiny",
    }
    for taken in ("tiny", "tiny-2", "r1-2"):
        (tmp_path / "runs" / taken).mkdir()
    assert studio.get("/api/config/template", params={"id": "file:0"}).json()["name"] == "tiny-3"
    assert studio.get("/api/config/template", params={"id": "run:r1"}).json()["name"] == "r1-3"
    for taken in ("tiny", "tiny-2", "r1-2"):
        (tmp_path / "runs" / taken).rmdir()
    for bad, code in (("run:nope", 404), ("run:empty", 404), ("file:1", 404), ("file:x", 404), ("x", 404)):
        assert studio.get("/api/config/template", params={"id": bad}).status_code == code, bad
    assert studio.get("/api/config/template", params={"id": "run:../runs"}).status_code == 400
    assert studio.get("/api/config/template", params={"id": "run:.studio"}).status_code == 400


def test_start_refuses_invalid_existing_and_bad_names(studio, tmp_path):
    runs = tmp_path / "runs"
    bad = GOOD.replace("  batch_size: 2", "  batch_size: 0")
    refused = studio.post("/api/config/start", json={"yaml": bad, "name": "new"})
    assert refused.status_code == 422
    assert refused.json()["detail"]["errors"] == _validate(studio, bad)["errors"]
    assert not (runs / "new").exists()
    exists = studio.post("/api/config/start", json={"yaml": GOOD, "name": "r1"})
    assert exists.status_code == 409 and "config.yaml" in exists.json()["detail"]
    assert "would write into that run" in exists.json()["detail"] and "e.g. 'r1-2'" in exists.json()["detail"]
    assert (tmp_path / "runs" / "r1" / "config.yaml").read_text() == "name: r1\n"  # untouched
    for name in ("../x", "a/b", ".hidden", ""):
        assert studio.post("/api/config/start", json={"yaml": GOOD, "name": name}).status_code == 400, name
    assert not (tmp_path / "x").exists() and sorted(p.name for p in runs.iterdir()) == [
        ".studio",
        "empty",
        "r1",
    ]
    # valid for `trine run`, but init_preset would build the model under the root, outside the runs directory
    outside = studio.post("/api/config/start", json={"yaml": GOOD, "name": "new"})
    assert outside.status_code == 422 and not (runs / "new").exists() and not (tmp_path / "model").exists()
    (error,) = outside.json()["detail"]["errors"]
    assert error["path"] == "model.path" and error["line"] == _lines(GOOD)["path: model"]
    assert "outside the runs directory" in error["message"] and "trine init-model tiny-1m" in error["message"]


@pytest.mark.slow
def test_start_runs_a_detached_run_to_the_end(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text(
        "".join(json.dumps({"question": f"{a}+1=", "answer": str(a + 1)}) + "\n" for a in range(4))
    )
    settings = StudioSettings(runs_dir=tmp_path / "runs", root=tmp_path)
    run = (tmp_path / "runs" / "live").absolute()
    text = GOOD.replace("path: model", "path: runs/shared-model")  # a model it builds: inside the runs dir
    with background(settings) as url:
        response = httpx.post(f"{url}/api/config/start", json={"yaml": text, "name": "live"}, timeout=30)
        assert response.status_code == 200, response.text
        pid = response.json()["pid"]
        assert response.json()["name"] == "live" and os.getsid(pid) == pid  # its own session
        assert response.json()["note"] == f"named 'live' (the config said name: 'tiny'); it writes to {run}"
        environ = Path(f"/proc/{pid}/environ")
        seen = environ.read_bytes() if environ.is_file() else b""  # empty once the process has ended
        assert not seen or f"{registry.NO_IMPORTS_ENV}=".encode() in seen  # the run refuses import paths too
        again = httpx.post(f"{url}/api/config/start", json={"yaml": text, "name": "live"}, timeout=30)
        assert again.status_code == 409
    launch = run / "launch.yaml"  # the studio has stopped; the run goes on
    resolved = launch.read_text()
    assert f"run_dir: {run}" in resolved and f"path: {data / 'train.jsonl'}" in resolved
    assert (
        "name: live\n" in resolved and "name: tiny" not in resolved
    )  # the run's own name, not the template's
    deadline = time.monotonic() + 90
    state = None
    while time.monotonic() < deadline:
        status = run / "status.json"
        state = json.loads(status.read_text()).get("state") if status.is_file() else None
        if state in ("finished", "failed"):
            break
        time.sleep(0.5)
    log = (run / "launch.log").read_text() if (run / "launch.log").is_file() else ""
    assert state == "finished", log[-3000:]
    assert (run / "config.yaml").is_file() and (run / "metrics.jsonl").is_file()
    assert (tmp_path / "runs" / "shared-model" / "config.json").is_file()  # built by init_preset, inside


def test_a_config_file_template_resolves_relative_paths_against_its_own_directory(tmp_path):
    """As ``trine run FILE`` does: the text of ``--config sub/exp.yaml`` names ``data/train.jsonl`` beside
    it, not beside the studio's root; other texts resolve against the root."""
    sub = tmp_path / "sub"
    (sub / "data").mkdir(parents=True)
    rows = [{"question": "1+1=", "answer": "2"}, {"question": "2+2=", "answer": "4"}]
    (sub / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (sub / "exp.yaml").write_text(GOOD)
    root = tmp_path / "elsewhere"
    root.mkdir()
    settings = StudioSettings(runs_dir=tmp_path / "runs", root=root, config_files=[sub / "exp.yaml"])
    with background(settings) as url, httpx.Client(base_url=url, timeout=60) as client:
        from_file = client.post("/api/config/validate", json={"yaml": GOOD, "template": "file:0"}).json()
        assert from_file["ok"], from_file["errors"]
        typed = client.post("/api/config/validate", json={"yaml": GOOD}).json()
        assert not typed["ok"]
        assert any(e["path"] == "tasks.train.path" and str(root) in e["message"] for e in typed["errors"])
