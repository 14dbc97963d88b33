"""The README's two commands and config reference stay true to the code and CI."""

from __future__ import annotations

import re
from pathlib import Path

from trine.config import reference_markdown

ROOT = Path(__file__).resolve().parents[2]


def _commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.+?)\n```", text)


def test_ci_runs_exactly_the_readme_test_command():
    install_and_run, install_and_test = _commands()[:2]
    assert "trine run examples/arithmetic/config.yaml" in install_and_run
    assert "pytest" in install_and_test
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert install_and_test in ci, "'.ci/run' must run the README's test command verbatim"


def test_config_reference_is_up_to_date():
    text = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- config-reference:start -->\n(.*)\n<!-- config-reference:end -->", text, re.S)
    assert found, "README.md lost its config-reference markers"
    assert found.group(1) == reference_markdown(), (
        "README's config reference is stale; regenerate it with `python scripts/sync_docs.py`"
    )
