"""Missing optional extras are found by ``trine validate``, with every other problem, naming the key, the
package and the install command; light commands stay light (no torch, no transformers)."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.helpers import EXAMPLE, write_arithmetic_config
from trine import registry
from trine.cli import app
from trine.config import extras as config_extras
from trine.config import read_yaml, validate_dict

ROOT = Path(__file__).resolve().parents[3]
INSTALL = re.compile(r'pip install -e "\.\[(\w+)\]"')


@pytest.fixture
def absent(monkeypatch):
    """``absent("vllm", ...)``: validation finds those modules not installed (the lookup the check uses,
    not the features: nothing else changes)."""

    def hide(*modules: str) -> None:
        real = config_extras.installed
        monkeypatch.setattr(config_extras, "installed", lambda module: module not in modules and real(module))

    return hide


def _config(tmp_path: Path, *overrides: dict) -> Path:
    """A valid config whose model ``init_preset`` builds on first run (nothing is loaded to validate it)."""
    model = {"model": {"path": str(tmp_path / "model"), "init_preset": "tiny-0.5m"}}
    return write_arithmetic_config(tmp_path, tmp_path / "model", "c", model, *overrides)


def _validate(path: Path) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["validate", str(path)])
    return result.exit_code, result.output


def test_validate_reports_every_missing_extra_at_once_with_its_key_and_fix(tmp_path, absent):
    absent("peft", "wandb", "openai", "psycopg", "mcp", "textarena")
    eval_set = {"path": str(EXAMPLE / "data" / "eval.jsonl"), "repeat": 1}
    path = _config(
        tmp_path,
        {
            "trainer": {"lora": {"rank": 4}},
            "monitor": {"sinks": ["jsonl", "wandb"]},
            "buffer": {"storage": "sql", "url": "postgresql+psycopg://trine@127.0.0.1/trine"},
            "explorer": {"auxiliary_models": {"judge": {"base_url": "http://127.0.0.1:9/v1", "model": "j"}}},
            "tasks": {
                "eval": [
                    {**eval_set, "name": "tools", "workflow": "tool_agent",
                     "workflow_args": {"mcp_servers": [{"command": ["python", "server.py"]}]}},
                    {**eval_set, "name": "game", "workflow": "multi_turn",
                     "workflow_args": {"env": "textarena", "env_args": {"game": "GuessTheNumber-v0"}}},
                ],
            },
        },
    )  # fmt: skip
    code, out = _validate(path)
    assert code == 2, out
    expected = {
        "trainer.lora needs peft": "lora",
        "monitor.sinks: wandb needs wandb": None,
        "buffer.url (postgresql+psycopg) needs psycopg": "postgres",
        "explorer.auxiliary_models.judge.base_url (an OpenAI-compatible endpoint) needs openai": "agents",
        "tasks.eval.0.workflow_args.mcp_servers needs mcp": "agents",
        "tasks.eval.1.workflow_args.env: textarena needs textarena": "envs",
    }
    flat = " ".join(out.split())  # the terminal wraps long lines
    for start, extra in expected.items():
        assert start in flat, (start, out)
        tail = flat.split(start, 1)[1]
        fix = f'pip install -e ".[{extra}]"' if extra else "pip install wandb"
        assert tail.startswith(f", which is not installed: {fix} (or "), (start, tail[:120])
    assert out.count("error(s)") == 1  # one report with every problem


def test_engines_backends_and_commands_name_their_extra(tmp_path, absent):
    absent("vllm", "ray", "data_juicer", "fastapi")
    errors = validate_dict(read_yaml(_config(tmp_path, {"model": {"engine": "vllm"}})), tmp_path)[1]
    assert any('model.engine: vllm needs vllm, which is not installed: pip install -e ".[vllm]" (or use model.engine: hf)' in e for e in errors), errors  # fmt: skip
    ray = {"mode": "async", "cluster": {"backend": "ray"}, "buffer": {"storage": "sql"}}
    errors = validate_dict(read_yaml(_config(tmp_path, ray)), tmp_path)[1]
    assert any('cluster.backend: ray needs ray, which is not installed: pip install -e ".[ray]"' in e for e in errors), errors  # fmt: skip
    juicer = {"buffer": {"operators": [{"name": "data_juicer", "recipe": []}]}}
    errors = validate_dict(read_yaml(_config(tmp_path, juicer)), tmp_path)[1]
    assert any(
        "buffer.operators.0: data_juicer needs data_juicer" in e and '".[data]"' in e for e in errors
    ), errors
    for command, extra in (("serve", "serve"), ("studio", "studio")):
        args = [command, str(_config(tmp_path))] if command == "serve" else [command, "--runs", str(tmp_path)]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        assert (
            f'trine {command} needs fastapi, which is not installed: pip install -e ".[{extra}]"'
            in result.output
        )


def test_installed_extras_and_plain_sqlite_urls_pass(tmp_path):
    assert config_extras.installed("yaml") and not config_extras.installed("no_such_module_here")
    assert config_extras.installed("no.such.package") is False
    code, out = _validate(
        _config(tmp_path, {"buffer": {"storage": "sql", "url": f"sqlite:///{tmp_path}/b.db"}})
    )
    assert code == 0, out
    assert config_extras._driver_problem("sqlite:///x.db") is None


def test_a_postgresql_url_without_driver_says_to_name_psycopg(absent):
    absent("psycopg2")
    problem = config_extras._driver_problem("postgresql://u@h/db")
    assert problem.startswith("buffer.url (postgresql with the psycopg2 driver) needs psycopg2, which is not")
    assert (
        'pip install psycopg2-binary (or write postgresql+psycopg://... and pip install -e ".[postgres]")'
        in problem
    )


def test_extras_match_pyproject():
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python >= 3.11")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    module = {"py-data-juicer": "data_juicer"}
    for extra, modules in config_extras.EXTRAS.items():
        packages = {re.split(r"[<>=\[ ]", req)[0] for req in declared[extra]}
        assert set(modules) == {module.get(p, p) for p in packages}, extra
    for kind, name in config_extras.NAMED:
        assert name in registry.builtins(kind), (kind, name)
    for extra, modules in [*config_extras.NAMED.values(), *config_extras.COMMANDS.values()]:
        assert extra is None or set(modules) <= set(config_extras.EXTRAS[extra]), extra


def test_examples_name_the_extras_their_configs_need(monkeypatch):
    """Each example's README (or, without one, the config's header comments) names the install command of
    every extra its config needs: validated here with every optional module missing."""
    monkeypatch.setattr(config_extras, "installed", lambda module: False)
    monkeypatch.setattr(registry, "_extra", {kind: dict(names) for kind, names in registry._extra.items()})
    for plugin in ("examples/guess_number/game.py", "examples/agents/tools.py"):
        registry.load_plugin(ROOT / plugin)
    checked = 0
    for path in sorted((ROOT / "examples").glob("*/*.yaml")):
        data = read_yaml(path)
        data["model"] = {**data.get("model", {}), "init_preset": "tiny-0.5m"}
        errors = validate_dict(data, base_dir=path.parent)[1]
        needed = {extra for e in errors for extra in INSTALL.findall(e)}
        readme = path.parent / "README.md"
        header = "\n".join(
            itertools.takewhile(lambda line: line.startswith("#"), path.read_text().splitlines())
        )
        text = readme.read_text() if readme.is_file() else header
        for extra in needed:
            assert f'pip install -e ".[{extra}]"' in text, f"{path.relative_to(ROOT)} needs the {extra} extra"
        checked += bool(needed)
    assert checked >= 2  # the tool-use configs need the agents extra


LIGHT = """
import sys
from trine.cli import app
sys.argv = ["trine", *sys.argv[1:]]
try:
    app()
except SystemExit as exit:
    code = exit.code
heavy = sorted({"torch", "transformers", "sqlalchemy"} & set(sys.modules))
print("HEAVY", heavy, code)
"""


@pytest.mark.parametrize(
    "args",
    [["--help"], ["run", "--help"], ["validate", str(EXAMPLE / "config.yaml")]],
    ids=["help", "run-help", "validate"],
)
def test_light_commands_import_neither_torch_nor_transformers(args):
    out = subprocess.run(
        [sys.executable, "-c", LIGHT, *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    ).stdout
    assert out.strip().splitlines()[-1] in ("HEAVY [] 0", "HEAVY [] None"), out


SIGNATURES = """
import inspect, sys
from trine import registry

def shape(signature):
    return [(p.name, p.kind, p.default is p.empty) for p in signature.parameters.values()]

read = {(kind, name): shape(registry.signature(kind, name))
        for kind in ("advantage", "loss", "engine", "workflow") for name in registry.builtins(kind)}
print(sorted({"torch", "transformers", "sqlalchemy"} & set(sys.modules)))
for (kind, name), found in read.items():
    if found != shape(inspect.signature(registry.resolve(kind, name))):
        print("differs:", kind, name)
"""


def test_arguments_of_builtins_are_checked_from_their_source_without_importing_them():
    """Name checks look in the tables and argument checks read a built-in's parameters from its source, so
    neither imports torch; what they read is what inspecting the imported object gives."""
    out = subprocess.run(
        [sys.executable, "-c", SIGNATURES], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_trine_check_says_how_long_it_will_take_before_loading_anything(tmp_path):
    from trine.config import load_config
    from trine.inspect.check import estimate

    cfg = load_config(_config(tmp_path))[0]
    said = estimate(cfg, turns=3, max_tokens=48)
    assert said.startswith(f"trine check: loads {tmp_path / 'model'} (0.") and "up to 4 tokens each" in said
    seconds = re.search(r"expect about (\d+) s \((\d+) s to (\d+) s\)", said)
    assert seconds and int(seconds[2]) <= int(seconds[1]) <= int(seconds[3]), said
    big = tmp_path / "big"  # a 1M-parameter bfloat16 model, as far as its files tell
    big.mkdir()
    (big / "config.json").write_text('{"torch_dtype": "bfloat16"}')
    with open(big / "model.safetensors", "wb") as weights:
        weights.truncate(2_000_000)
    cfg = load_config(_config(tmp_path, {"model": {"path": str(big), "init_preset": None, "device": "cpu"}}))[
        0
    ]
    assert "(1.0M parameters)" in estimate(cfg, 3, 48)


def test_lazy_packages_export_no_name_of_a_submodule():
    """A lazily exported name equal to a submodule's (a function ``f`` in ``f.py``) would become the module once
    anything imports the submodule: every name a lazy package exports must differ from its modules'."""
    import pkgutil

    import trine.algorithms
    import trine.models
    import trine.workflows

    for package in (trine.algorithms, trine.models, trine.workflows):
        modules = {m.name for m in pkgutil.iter_modules(package.__path__)}
        assert not modules & set(package._EXPORTS), package.__name__
