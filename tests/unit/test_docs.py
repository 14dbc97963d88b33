"""docs/algorithms.md stays in sync with the presets and the plugin example; the examples of
docs/workflows.md run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trine.algorithms.presets import presets_markdown

ROOT = Path(__file__).resolve().parents[2]


def _between(text: str, name: str) -> str:
    found = re.search(rf"<!-- {name}:start -->\n(.*)\n<!-- {name}:end -->", text, re.S)
    assert found, f"docs/algorithms.md lost its {name} markers"
    return found.group(1)


def test_presets_table_is_generated_from_the_presets():
    text = (ROOT / "docs" / "algorithms.md").read_text()
    assert _between(text, "presets") == presets_markdown(), "regenerate with python scripts/sync_docs.py"


def test_plugin_example_is_the_shipped_file():
    text = (ROOT / "docs" / "algorithms.md").read_text()
    source = (ROOT / "examples" / "plugins" / "median_baseline.py").read_text().rstrip("\n")
    assert _between(text, "plugin") == f"```python\n{source}\n```"
    assert len(source.splitlines()) < 30


# ---------------------------------------------------------------------------------- docs/workflows.md


def _doc_files() -> dict[str, str]:
    """The code blocks of docs/workflows.md that start with ``# file: NAME``, by name."""
    text = (ROOT / "docs" / "workflows.md").read_text()
    blocks = re.findall(r"```(?:python|yaml)\n# file: (\S+)\n(.*?)```", text, re.S)
    return {name: body for name, body in blocks}


@pytest.fixture
def doc_plugins(tmp_path, monkeypatch):
    """The doc's plugin file written to ``tmp_path`` and loaded as ``--plugin`` would (registry restored
    afterwards); returns the directory holding it and the doc's configs, with their data files."""
    from trine import registry

    monkeypatch.setattr(registry, "_extra", {k: dict(v) for k, v in registry._extra.items()})
    for name, body in _doc_files().items():
        (tmp_path / name).write_text(body)
    data = tmp_path / "data"
    data.mkdir()
    sums = [{"question": f"{a}+{b}=", "answer": str(a + b)} for a, b in [(3, 4), (1, 2), (2, 2), (5, 1)]]
    (data / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in sums))
    guesses = [{"question": "guess the digit", "secret": s} for s in (3, 8)]
    (data / "guess.jsonl").write_text("".join(json.dumps(r) + "\n" for r in guesses))
    registry.load_plugin(tmp_path / "my_workflows.py")
    return tmp_path


def test_workflows_doc_has_the_files_it_promises():
    assert set(_doc_files()) == {"my_workflows.py", "hinted.yaml", "guess.yaml", "show_prompt.py"}


def test_workflows_doc_configs_validate_with_the_plugin(doc_plugins, monkeypatch):
    from typer.testing import CliRunner

    from trine import registry
    from trine.cli import app

    monkeypatch.setattr(registry, "_extra", {})  # as in a fresh process: only --plugin registers them
    result = CliRunner().invoke(app, ["validate", str(doc_plugins / "hinted.yaml")])
    assert result.exit_code != 0 and "--plugin" in result.output  # without it the names are unknown
    for config in ("hinted.yaml", "guess.yaml"):
        plugin = str(doc_plugins / "my_workflows.py")
        result = CliRunner().invoke(app, ["validate", str(doc_plugins / config), "--plugin", plugin])
        assert result.exit_code == 0, result.output


def test_workflows_doc_examples_run_in_the_explorer(doc_plugins, tiny_model_dir, one_torch_thread):
    from trine.explorer import Explorer
    from trine.models import load_model, load_tokenizer
    from trine.models.engine import HFEngine
    from trine.tasks import TaskSet

    engine = HFEngine(load_model(tiny_model_dir), load_tokenizer(tiny_model_dir), seed=0)
    explorer = Explorer(engine, timeout=60)
    data = doc_plugins / "data"
    try:
        hinted = TaskSet(
            data / "sums.jsonl", workflow="hinted", reward="digits_only", reward_args={"bonus": 0.2}, repeat=3
        )
        exps, metrics = explorer.explore(list(hinted), batch_index=0, version=0)
        assert metrics["explorer/skipped"] == 0 and len(exps) == 4 * 3
        for e in exps:
            parts = e.info["reward_parts"]
            assert set(parts) == {"accuracy", "format"} and e.reward == sum(parts.values())
            assert "\nReply with the number only." in engine.tokenizer.decode(e.tokens[: e.prompt_length])
        guess = TaskSet(
            data / "guess.jsonl",
            answer_key=None,
            workflow="guess_digit",
            workflow_args={"max_steps": 3},
            repeat=2,
            sampling={"max_tokens": 3},
        )
        exps, metrics = explorer.explore(list(guess), batch_index=1, version=0)
        assert metrics["explorer/skipped"] == 0
        episodes = [e for e in exps if e.info["last_step"]]
        assert len(episodes) == 2 * 2 and all(1 <= e.info["episode_length"] <= 3 for e in episodes)
        assert all(e.info["env_state_hash"] == "" for e in exps if e.step == 0)  # no guess yet
        assert {e.reward for e in exps} <= {0.0, 1.0}
    finally:
        explorer.close()
        engine.close()


def test_workflows_doc_prompt_snippet_prints_the_templated_prompt(tiny_model_dir, capsys):
    code = _doc_files()["show_prompt.py"]
    assert 'MODEL = "examples/arithmetic/model"' in code
    exec(code.replace("examples/arithmetic/model", str(tiny_model_dir)), {})
    out = capsys.readouterr().out
    assert "<|im_start|>system\nAnswer with a number.<|im_end|>" in out
    assert "<|im_start|>user\nWhat is 3+4?<|im_end|>\n<|im_start|>assistant\n" in out
    assert out.rstrip().endswith("apples 7")


def test_readme_and_docs_link_only_to_files_in_the_repository():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        assert "shared/DESIGN" not in text, f"{page.name} points outside the repository"
        for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.name} links to missing {target}"
    assert "docs/architecture.md" in (ROOT / "README.md").read_text()
