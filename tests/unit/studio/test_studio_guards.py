"""The studio's guards as functions (the hostile-client tests over HTTP are tests/faults/test_studio_hostile.py):
loopback host names, full origins, where a started run may write, links leading out of a run, YAML bounds."""

from __future__ import annotations

import json

import pytest
import yaml

pytest.importorskip("fastapi", reason="the studio needs fastapi (pip install -e '.[dev]')")

from trine.config import load_yaml, validate_dict  # noqa: E402
from trine.studio import annotations  # noqa: E402
from trine.studio.confine import write_problems  # noqa: E402
from trine.studio.guards import BodyLimit, loopback_host, same_origin  # noqa: E402
from trine.studio.paths import escaping_links, location_problem, run_problem  # noqa: E402
from trine.studio.settings import StudioSettings  # noqa: E402
from trine.studio.yaml_lines import MAX_DEPTH, MAX_NODES, YamlTooBig, compose  # noqa: E402


@pytest.mark.parametrize(
    ("host", "ok"),
    [
        ("127.0.0.1:8765", True), ("127.1.2.3", True), ("localhost:1", True), ("[::1]:8765", True),
        ("127.evil.example:8765", False), ("127.0.0.1.nip.io", False), ("localhost.evil", False),
        ("evil.example", False), ("[::1", False), ("", False), ("10.0.0.1", False), ("127.0.0.1:8765@evil", False),
    ],
)  # fmt: skip
def test_loopback_host(host, ok):
    assert loopback_host(host) is ok


@pytest.mark.parametrize(
    ("origin", "scheme", "host", "ok"),
    [
        ("http://127.0.0.1:8765", "http", "127.0.0.1:8765", True),
        ("HTTP://LOCALHOST:8765/", "http", "localhost:8765", True),
        ("http://127.0.0.1:80", "http", "127.0.0.1", True),
        ("https://studio.lan", "https", "studio.lan:443", True),
        ("https://127.0.0.1:8765", "http", "127.0.0.1:8765", False),
        ("http://127.0.0.1", "http", "127.0.0.1:8765", False),
        ("http://localhost:8765", "http", "127.0.0.1:8765", False),
        ("null", "http", "127.0.0.1:8765", False),
        ("http://[::1", "http", "[::1]:8765", False),
        ("http://127.0.0.1:99999", "http", "127.0.0.1:8765", False),
    ],
)
def test_same_origin_compares_scheme_host_and_port(origin, scheme, host, ok):
    assert same_origin(origin, scheme, host) is ok


def test_location_problem(tmp_path):
    runs, root = tmp_path / "runs", tmp_path
    runs.mkdir()
    for value in (
        "runs/a/buffer.db",
        f"sqlite:///{runs}/a.db",
        "sqlite:///runs/x.db",
        "sqlite://",
        "sqlite:///:memory:",
    ):
        assert location_problem(value, runs, root) is None, value
    assert location_problem("https://judge.example/v1", runs, root, network=True) is None
    refused = {
        "postgresql+psycopg://u:p@db/x": "postgresql+psycopg store",
        "file:///etc/x": "file store",
        "https://judge.example/v1": "https store",
        f"sqlite:///file:{runs}/a.db?uri=true": "SQLite URI filename",
        "sqlite:///runs/../x.db": f"writes {tmp_path / 'x.db'}",
        "~/x.jsonl": "outside the runs directory",
    }
    for value, words in refused.items():
        problem = location_problem(value, runs, root)
        assert problem is not None and words in problem and "outside the runs directory" in problem, value
    (runs / "out").symlink_to(tmp_path, target_is_directory=True)
    assert "writes" in location_problem("runs/out/b.db", runs, root)  # resolved: the link is followed


def _stages(text: str, tmp_path, model: str = "runs/m"):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"question": "1+1=", "answer": "2"}) + "\n")
    base = f"num_threads: 1\nmodel: {{path: {tmp_path / model}, init_preset: tiny-1m}}\n"
    base += f"tasks: {{batch_size: 2, total_steps: 1, train: {{path: {data}, repeat: 2}}}}\n"
    stages, errors = validate_dict(load_yaml(base + text), base_dir=tmp_path)
    assert errors == []
    return stages


def test_write_problems_name_every_key(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    stages = _stages(
        "buffer: {storage: sql, url: 'postgresql+psycopg://u@db/x', storage_args: {table: t}, operators: [{name: invalid_reward, dir: /tmp/o}]}\n"
        "algorithm: {loss_args: {clip_low: 0.2}}\n",
        tmp_path,
    )
    lines = write_problems(stages, runs, tmp_path)
    assert [line.split(":")[0] for line in lines] == ["buffer.operators.0.dir", "buffer.url"]
    inside = _stages("buffer: {storage: sql, url: 'sqlite:///runs/b.db'}\n", tmp_path)
    assert write_problems(inside, runs, tmp_path) == []
    # reads are not writes: the taskset outside the runs directory, a model that exists outside it
    (tmp_path / "model").mkdir()
    assert write_problems(_stages("", tmp_path, model="model"), runs, tmp_path) == []
    (built,) = write_problems(
        _stages("", tmp_path, model="new-model"), runs, tmp_path
    )  # init_preset builds it
    assert built.startswith("model.path: ") and "init_preset builds the model there" in built


def test_escaping_links_follow_chains_and_survive_cycles(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "out"
    (runs / "a" / "sub").mkdir(parents=True)
    (runs / "b").mkdir()
    out.mkdir()
    (runs / "a" / "loop").symlink_to(runs / "a", target_is_directory=True)  # a cycle: visited once
    (runs / "a" / "hop").symlink_to(runs / "b", target_is_directory=True)
    (runs / "b" / "x.json").symlink_to(out / "x.json")
    (runs / "a" / "sub" / "ok.json").symlink_to(runs / "b" / "missing.json")  # dangling but inside
    assert escaping_links(runs, runs / "a") == [f"hop/x.json -> {out / 'x.json'}"]
    assert "hop/x.json" in run_problem(runs, runs / "a") and run_problem(runs, runs / "a" / "sub") is None


def test_the_lander_skips_runs_that_lead_out(tmp_path, monkeypatch):
    runs, out = tmp_path / "runs", tmp_path / "out"
    (runs / "linked").mkdir(parents=True)
    out.mkdir()
    (out / "annotations.db").write_text("")
    (runs / "linked" / "annotations.db").symlink_to(out / "annotations.db")
    (runs / "escape").symlink_to(out, target_is_directory=True)
    opened = []
    monkeypatch.setattr(annotations, "open_queue", lambda run_dir: opened.append(run_dir))
    assert annotations.Lander(runs).pass_once() == 0 and opened == []


def test_yaml_bounds_count_aliases_at_their_expanded_size():
    assert compose("a: &a [1, 2]\nb: *a\nc: {x: *a}\n") is not None  # anchors a config may use
    laughs = "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}' if i else '0'] * 10)}]\n" for i in range(6))
    with pytest.raises(YamlTooBig, match=f"more than {MAX_NODES} nodes"):
        compose(laughs)  # 10**6 nodes once expanded, a few hundred bytes
    with pytest.raises(YamlTooBig, match=f"nested more than {MAX_DEPTH} levels"):
        compose("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    assert compose("[" * MAX_DEPTH + "]" * MAX_DEPTH) is not None
    for endless in ("a: &a {x: *a}\n", "a: {x: &b [1, *b]}\n"):
        with pytest.raises(YamlTooBig, match="endless value"):
            compose(endless)
    with pytest.raises(yaml.YAMLError):  # still a YAML error for whoever catches those
        compose("x: " + "{a: " * 100 + "1" + "}" * 100)


def test_body_limits_by_path(tmp_path):
    limit = BodyLimit(None, StudioSettings(runs_dir=tmp_path, max_body_bytes=10, max_import_bytes=20)).limit
    assert limit("/api/config/start") == (10, "max_body_bytes")
    assert limit("/api/runs/r/annotations/answer") == (10, "max_body_bytes")
    assert limit("/api/runs/r/annotations/import") == (20, "max_import_bytes")
