"""Regenerate the generated parts of README.md and docs/algorithms.md (config reference, presets, plugin example)."""

from __future__ import annotations

import re
from pathlib import Path

from trine.algorithms.presets import presets_markdown
from trine.config import reference_markdown

ROOT = Path(__file__).resolve().parents[1]


def fill(path: Path, name: str, body: str) -> None:
    text = path.read_text()
    new = re.sub(
        rf"<!-- {name}:start -->.*<!-- {name}:end -->",
        lambda _: f"<!-- {name}:start -->\n{body}\n<!-- {name}:end -->",
        text,
        flags=re.S,
    )
    path.write_text(new)


if __name__ == "__main__":
    fill(ROOT / "README.md", "config-reference", reference_markdown())
    fill(ROOT / "docs" / "algorithms.md", "presets", presets_markdown())
    plugin = (ROOT / "examples" / "plugins" / "median_baseline.py").read_text().rstrip("\n")
    fill(ROOT / "docs" / "algorithms.md", "plugin", f"```python\n{plugin}\n```")
