"""Regenerate the generated parts of README.md, docs/algorithms.md (config reference, presets, plugin example)
and docs/agents.md (its three examples, embedded from examples/)."""

from __future__ import annotations

import re
from pathlib import Path

from trine.algorithms.presets import presets_markdown
from trine.config import reference_markdown

ROOT = Path(__file__).resolve().parents[1]
AGENT_EXAMPLES = {
    "second_look": [("examples/agents/second_look.py", "python")],
    "tools": [("examples/agents/tools.py", "python"), ("examples/agents/tools.yaml", "yaml")],
    "tool_use": [("examples/tool_use/config.yaml", "yaml")],
    "serve_agent": [("examples/serve_agent/agent.py", "python")],
}
"""docs/agents.md's examples: (file, language) per marker; each file stays under 80 lines."""


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
    for name, files in AGENT_EXAMPLES.items():
        blocks = [f"```{lang}\n# {rel}\n{(ROOT / rel).read_text().rstrip()}\n```" for rel, lang in files]
        fill(ROOT / "docs" / "agents.md", name, "\n\n".join(blocks))
