"""The one route from the ``buffer`` config section to a storage (trine.buffer.open_buffer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trine.buffer import FileBuffer, MemoryBuffer, SamplingRules, SQLBuffer, open_buffer
from trine.config import BufferConfig


def test_the_default_section_gives_the_default_rules():
    """The rules are the section's keys (declared once, tests/unit/config/test_declarations.py checks)."""
    assert SamplingRules.from_section(BufferConfig()) == SamplingRules()


def test_open_buffer_gives_each_storage_the_rules_and_its_run_directory_defaults(tmp_path: Path):
    options = {"sampler": "priority", "reuse_limit": 2, "cooldown": 1, "max_staleness": 3}
    expected = SamplingRules(**options)
    memory = open_buffer(BufferConfig(**options, storage_args={"capacity": 7}), tmp_path)
    assert type(memory) is MemoryBuffer and memory.rules == expected and memory.capacity == 7
    sql = open_buffer(BufferConfig(storage="sql", **options, storage_args={"table": "t1"}), tmp_path)
    assert isinstance(sql, SQLBuffer) and sql.rules == expected
    assert (sql.url, sql.table_name) == (f"sqlite:///{tmp_path / 'buffer.db'}", "t1")
    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    assert open_buffer(BufferConfig(storage="sqlite", url=url), tmp_path).url == url
    file = open_buffer(BufferConfig(storage="file", pending_timeout=5.0), tmp_path)
    assert isinstance(file, FileBuffer) and file.path == tmp_path / "buffer.jsonl"
    assert file.rules == SamplingRules(pending_timeout=5.0)


def test_storage_args_win_over_the_defaults_and_plugins_get_rules(tmp_path: Path):
    other = tmp_path / "other.jsonl"
    assert (
        open_buffer(BufferConfig(storage="file", storage_args={"path": str(other)}), tmp_path).path == other
    )
    plugin = open_buffer(
        BufferConfig(storage="trine.buffer.memory:MemoryBuffer", whole_groups=True), tmp_path
    )
    assert type(plugin) is MemoryBuffer and plugin.rules == SamplingRules(whole_groups=True)


def test_a_storage_argument_the_storage_does_not_take_is_named_with_its_section(tmp_path: Path):
    with pytest.raises(
        TypeError, match=r"buffer.storage='sql' \(SQLBuffer\) with buffer.storage_args=.*'tabel'"
    ):
        open_buffer(BufferConfig(storage="sql", storage_args={"tabel": "x"}), tmp_path)
