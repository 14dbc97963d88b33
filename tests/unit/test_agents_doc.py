"""docs/agents.md: its examples are the shipped files (under 80 lines each), they validate, and the custom
multi-turn workflow and the Python tools run for real."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from trine import registry
from trine.config import load_config

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.setattr(registry, "_extra", {k: dict(v) for k, v in registry._extra.items()})
    registry.load_plugin(ROOT / "examples" / "agents" / "second_look.py")
    registry.load_plugin(ROOT / "examples" / "agents" / "tools.py")


def test_the_doc_embeds_the_shipped_examples_each_under_80_lines():
    import importlib.util

    spec = importlib.util.spec_from_file_location("sync_docs", ROOT / "scripts" / "sync_docs.py")
    sync = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sync)
    text = (ROOT / "docs" / "agents.md").read_text()
    for name, files in sync.AGENT_EXAMPLES.items():
        body = re.search(rf"<!-- {name}:start -->\n(.*)\n<!-- {name}:end -->", text, re.S).group(1)
        for rel, _ in files:
            source = (ROOT / rel).read_text().rstrip()
            assert source in body, f"docs/agents.md is behind {rel}: run python scripts/sync_docs.py"
            assert len(source.splitlines()) < 80, rel


def test_the_example_configs_validate(plugins, tmp_path):
    for config in ("examples/agents/tools.yaml", "examples/tool_use/config.yaml"):
        stages = load_config(ROOT / config, [f"run_dir={tmp_path / 'run'}"])
        assert stages and stages[-1].tasks.train.workflow == "tool_agent"


def test_the_custom_multi_turn_workflow_runs_in_the_explorer(plugins, tiny_model_dir):
    from trine.explorer import Explorer
    from trine.models import load_model, load_tokenizer
    from trine.models.engine import HFEngine
    from trine.types import SamplingParams, Task

    engine = HFEngine(load_model(tiny_model_dir), load_tokenizer(tiny_model_dir), seed=0)
    explorer = Explorer(engine)
    task = Task(
        "t", "2+3=", answer="5", workflow="second_look", repeat=2, sampling=SamplingParams(max_tokens=6)
    )
    try:
        exps, metrics = explorer.explore([task], batch_index=0, version=0)
    finally:
        explorer.close()
        engine.close()
    assert len(exps) == 2 and metrics["explorer/skipped"] == 0
    for e in exps:
        e.check()
        assert e.info["turns"] == 2 and 0 in e.action_mask  # "Check your answer." is masked out


def test_the_example_tools_have_schemas_and_answer(plugins):
    from trine.tools import ToolBox, ToolCall, function_tool

    box = ToolBox([function_tool(registry.resolve("tool", n)) for n in ("multiply", "convert")], timeout=2)
    specs = {s["function"]["name"]: s["function"] for s in box.specs()}
    assert specs["convert"]["parameters"]["properties"]["unit"]["enum"] == ["km", "mi"]
    results = asyncio.run(
        box.run(
            [
                ToolCall("1", "multiply", {"a": 347, "b": 29}),
                ToolCall("2", "convert", {"value": 10, "unit": "mi"}),
            ]
        )
    )
    assert [r.content for r in results] == ["10063", "16.093"]
