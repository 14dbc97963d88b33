"""docs/algorithms.md stays in sync with the presets and the plugin example."""

from __future__ import annotations

import re
from pathlib import Path

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
