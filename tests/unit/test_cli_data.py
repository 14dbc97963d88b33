"""`trine buffer stats|head|export|import|reward` and `trine tasks process` on real files."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from trine.buffer.files import import_experiences
from trine.buffer.inspect import read_rows
from trine.buffer.sql import SQLBuffer
from trine.cli import app
from trine.types import Experience

runner = CliRunner()


@pytest.fixture
def run_dir(tmp_path):
    """A run directory with a SQL buffer: 4 consumed, 2 ready, 2 pending experiences."""
    (tmp_path / "config.yaml").write_text(
        yaml.safe_dump({"buffer": {"storage": "sql"}, "model": {"path": "nowhere"}})
    )
    buffer = SQLBuffer(f"sqlite:///{tmp_path / 'buffer.db'}")
    exps = [
        Experience(
            tokens=[1, 2, 3, 4 + i],
            prompt_length=2,
            action_mask=[1, 1],
            logprobs=[-1.0, -0.5],
            reward=None if i >= 6 else float(i % 2),
            task_id=f"t{i}",
            run_id=f"r{i}",
            group_id=f"g{i // 2}",
            policy_version=i // 4,
            info={"response": f"answer {i}"},
        )
        for i in range(8)
    ]
    buffer.put(exps)
    buffer.get(4)
    buffer.close()
    return tmp_path


def test_stats_shows_counts_by_status_and_version_and_a_histogram(run_dir):
    result = runner.invoke(app, ["buffer", "stats", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert "8 experiences" in result.output
    lines = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") > 3}
    assert lines["consumed"].split("│")[2].strip() == "4"
    assert lines["pending"].split("│")[2].strip() == "2"
    assert "reward histogram" in result.output and "█" in result.output


def test_head_lists_top_rewards(run_dir):
    result = runner.invoke(app, ["buffer", "head", str(run_dir), "-n", "2"])
    assert result.exit_code == 0, result.output
    assert result.output.count("1.000") == 2


def test_reward_fills_pending_by_id_and_by_task_and_run(run_dir, tmp_path):
    pending = [e for e, _ in read_rows(run_dir, "pending")]
    rewards = tmp_path / "rewards.jsonl"
    rewards.write_text(
        json.dumps({"id": pending[0].id, "reward": 0.5})
        + "\n"
        + json.dumps({"task_id": "t7", "run_id": "r7", "reward": 1.0})
        + "\n"
    )
    result = runner.invoke(app, ["buffer", "reward", str(run_dir), str(rewards)])
    assert result.exit_code == 0, result.output
    assert "filled 2 of 2" in result.output
    assert read_rows(run_dir, "pending") == []
    assert sorted(e.reward for e, _ in read_rows(run_dir, "ready")) == [0.0, 0.5, 1.0, 1.0]


def test_reward_file_errors_name_the_line(run_dir, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"reward": 1}\n')
    result = runner.invoke(app, ["buffer", "reward", str(run_dir), str(bad)])
    assert result.exit_code == 2 and "bad.jsonl:1" in result.output


def test_export_and_import_round_trip(run_dir, tmp_path):
    out = tmp_path / "all.parquet"
    assert runner.invoke(app, ["buffer", "export", str(run_dir), str(out)]).exit_code == 0
    exported = import_experiences(out)
    assert len(exported) == 8
    fresh = tmp_path / "other"
    fresh.mkdir()
    (fresh / "config.yaml").write_text(yaml.safe_dump({"buffer": {"storage": "file"}}))
    result = runner.invoke(app, ["buffer", "import", str(fresh), str(out)])
    assert result.exit_code == 0, result.output
    assert len(read_rows(fresh)) == 8


def test_memory_buffers_cannot_take_rewards(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"buffer": {"storage": "memory"}}))
    rewards = tmp_path / "r.jsonl"
    rewards.write_text('{"id": "x", "reward": 1}\n')
    result = runner.invoke(app, ["buffer", "reward", str(tmp_path), str(rewards)])
    assert result.exit_code == 2 and "buffer.storage: sql" in result.output


def test_tasks_process_runs_the_task_pipeline(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {"question": "1+1?", "solution": "so \\boxed{2}"},
                {"question": "1+1?", "solution": "\\boxed{2}"},
                {"question": "half", "solution": "\\boxed{\\frac{1}{2}}"},
            ]
        )
    )
    steps = tmp_path / "steps.yaml"
    steps.write_text(
        "- {name: extract_boxed, field: solution, to: answer}\n- {name: dedup, field: question}\n"
    )
    out = tmp_path / "out.jsonl"
    result = runner.invoke(app, ["tasks", "process", str(source), str(out), "--steps", str(steps)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["answer"] for r in rows] == ["2", "\\frac{1}{2}"]


def test_memory_buffer_runs_say_what_they_cannot_show(tmp_path):
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"buffer": {"storage": "memory"}}))
    for command in (["stats"], ["head"], ["export", str(tmp_path / "out.jsonl")]):
        result = runner.invoke(app, ["buffer", *command[:1], str(tmp_path), *command[1:]])
        assert result.exit_code == 0, result.output
        assert "kept its buffer in memory" in result.stderr, command
        assert "only the 0 not yet trained (it has no checkpoint yet)" in result.stderr
        assert "buffer.storage: sql" in result.stderr


def test_persistent_buffer_runs_print_no_memory_note(run_dir):
    result = runner.invoke(app, ["buffer", "stats", str(run_dir)])
    assert result.exit_code == 0 and "in memory" not in result.output
