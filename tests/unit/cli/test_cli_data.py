"""`trine buffer stats|head|export|import|reward` and `trine tasks process` on real files."""

from __future__ import annotations

import json
import re

import pytest
import yaml
from typer.testing import CliRunner

from tests.helpers import write_arithmetic_config, write_config
from trine.buffer.files import import_experiences
from trine.buffer.inspect import read_rows
from trine.buffer.sql import SQLBuffer
from trine.cli import app
from trine.types import Experience

runner = CliRunner()


@pytest.fixture
def run_dir(tmp_path):
    """A run directory with a SQL buffer: 4 consumed, 2 ready, 2 pending experiences."""
    write_config(tmp_path / "config.yaml", buffer={"storage": "sql"}, model={"path": "nowhere"})
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
            status={5: "tool_error", 6: "timeout"}.get(i, "ok"),
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
    assert lines["trained"].split("│")[2].strip() == "4"
    assert lines["pending"].split("│")[2].strip() == "2"
    assert "reward histogram" in result.output and "█" in result.output
    assert "by trajectory status" in result.output  # stored with the rows: a real column
    assert [lines[s].split("│")[2].strip() for s in ("ok", "tool_error", "timeout", "env_error")] == [
        "6",
        "1",
        "1",
        "0",
    ]


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


def test_reward_says_why_each_row_was_not_filled(run_dir, tmp_path):
    rows = read_rows(run_dir)
    ready = [e for e, s in rows if s == "ready"]
    trained = [e for e, s in rows if s == "trained"]
    pending = [e for e, s in rows if s == "pending"]
    lines = [
        {"id": ready[0].id, "reward": 1.0},
        {"id": ready[1].id, "reward": 1.0},
        {"id": trained[0].id, "reward": 1.0},
        {"id": "no-such-id", "reward": 1.0},
        {"task_id": "t99", "run_id": "r0", "reward": 1.0},
        {"id": pending[0].id, "reward": 0.25},
    ]
    rewards = tmp_path / "rewards.jsonl"
    rewards.write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = runner.invoke(app, ["buffer", "reward", str(run_dir), str(rewards)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"filled 1 of 6 rewards in {run_dir}",
        "not filled:",
        "  2 not found: no experience with that id (or task_id and run_id) in the buffer: no-such-id, (t99, r0)",
        f"  2 already has a reward (ready: waiting for the trainer): {ready[0].id}, {ready[1].id}",
        f"  1 already has a reward and was trained: {trained[0].id}",
    ]
    again = runner.invoke(app, ["buffer", "reward", str(run_dir), str(rewards)])  # the same file twice
    assert again.output.splitlines()[0] == f"filled 0 of 6 rewards in {run_dir}"
    assert f"  3 already has a reward (ready: waiting for the trainer): {ready[0].id}, {ready[1].id}, " in (
        again.output
    )


def test_reward_names_expired_rows_of_a_file_buffer(tmp_path):
    """A file log (read by replaying it, not through SQL): a pending row dropped at its timeout."""
    from trine.buffer.files import FileBuffer
    from trine.buffer.sampling import SamplingRules

    write_config(tmp_path / "config.yaml", buffer={"storage": "file"})
    clock = [0.0]
    buffer = FileBuffer(
        tmp_path / "buffer.jsonl", rules=SamplingRules(pending_timeout=5.0), clock=lambda: clock[0]
    )
    late = Experience(tokens=[1, 2, 3], prompt_length=2, action_mask=[1], reward=None, task_id="t")
    buffer.put([late])
    clock[0] = 10.0
    buffer.metrics()  # expires what is pending past the timeout
    buffer.close()
    assert [s for _, s in read_rows(tmp_path)] == ["expired"]
    rewards = tmp_path / "r.jsonl"
    rewards.write_text(json.dumps({"id": late.id, "reward": 1.0}) + "\n")
    result = runner.invoke(app, ["buffer", "reward", str(tmp_path), str(rewards)])
    assert result.exit_code == 0, result.output
    assert "filled 0 of 1" in result.output
    assert (
        f"  1 expired: its reward did not come within buffer.pending_timeout, so it was dropped: {late.id}"
        in (result.output)
    )


def test_export_and_import_round_trip(run_dir, tmp_path):
    out = tmp_path / "all.parquet"
    assert runner.invoke(app, ["buffer", "export", str(run_dir), str(out)]).exit_code == 0
    exported = import_experiences(out)
    assert len(exported) == 8
    fresh = tmp_path / "other"
    fresh.mkdir()
    write_config(fresh / "config.yaml", buffer={"storage": "file"})
    result = runner.invoke(app, ["buffer", "import", str(fresh), str(out)])
    assert result.exit_code == 0, result.output
    assert len(read_rows(fresh)) == 8


def test_memory_buffers_cannot_take_rewards(tmp_path):
    write_config(tmp_path / "config.yaml", buffer={"storage": "memory"})
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


def test_memory_buffer_runs_print_only_the_note_when_nothing_was_kept(tmp_path):
    write_config(tmp_path / "config.yaml", buffer={"storage": "memory"})
    for command in (["stats"], ["head"], ["export", str(tmp_path / "out.jsonl")]):
        result = runner.invoke(app, ["buffer", *command[:1], str(tmp_path), *command[1:]])
        assert result.exit_code == 0, result.output
        assert result.stdout == "", command  # no empty tables, no "wrote 0 experiences"
        assert "kept its buffer in memory" in result.stderr, command
        assert "it has no checkpoint yet" in result.stderr and "none can be shown" in result.stderr
        assert "buffer.storage: sql" in result.stderr
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.slow
def test_head_of_a_finished_memory_buffer_run_is_the_note_alone(tmp_path, tiny_model_dir):
    """A real run with the default in-memory buffer: its last checkpoint holds nothing untrained, so
    ``trine buffer head`` prints the note (what is kept, how to keep every experience) and no table."""
    from trine.config import load_config
    from trine.loop import run

    small = {"tasks": {"batch_size": 2, "total_steps": 1, "train": {"repeat": 2}}, "num_threads": 1}
    run(load_config(write_arithmetic_config(tmp_path, tiny_model_dir, "mem", small)))
    result = runner.invoke(app, ["buffer", "head", str(tmp_path / "mem")])
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    note = result.stderr
    assert note.startswith(f"note: {tmp_path / 'mem'} kept its buffer in memory"), note
    assert "its last checkpoint holds no experience that was not trained yet, so none can be shown" in note
    assert "run with buffer.storage: sql (or file)" in note and "┃" not in note


def test_persistent_buffer_runs_print_no_memory_note(run_dir):
    result = runner.invoke(app, ["buffer", "stats", str(run_dir)])
    assert result.exit_code == 0 and "in memory" not in result.output


def _stored(run_dir, buffer_section, experiences, *, table_decoy=False):
    """Store ``experiences`` with the run's own route (open_buffer) and write its resolved config."""
    from trine.buffer import open_buffer
    from trine.config import BufferConfig

    config = BufferConfig.model_validate(buffer_section)
    write_config(run_dir / "config.yaml", stage="main", buffer=config.model_dump(mode="json"))
    if table_decoy:  # a row in the default table of the same database, which is not the run's
        decoy = SQLBuffer(f"sqlite:///{run_dir / 'buffer.db'}")
        decoy.put(
            [Experience(tokens=[9, 9, 9], prompt_length=2, action_mask=[1], reward=5.0, task_id="decoy")]
        )
        decoy.close()
    buffer = open_buffer(config, run_dir)
    buffer.put(experiences)
    return buffer


def test_buffer_commands_open_the_table_the_run_used(tmp_path):
    """``storage_args: {table: my_table}``: stats, head, export and reward read and write my_table."""
    exps = [
        Experience(
            tokens=[1, 2, 3 + i], prompt_length=2, action_mask=[1], reward=None if i == 2 else float(i),
            task_id=f"mine{i}", run_id="r", info={"response": f"mine {i}"},
        )
        for i in range(3)
    ]  # fmt: skip
    buffer = _stored(
        tmp_path, {"storage": "sql", "storage_args": {"table": "my_table"}}, exps, table_decoy=True
    )
    assert buffer.table_name == "my_table"
    buffer.get(1)
    buffer.close()

    result = runner.invoke(app, ["buffer", "stats", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "3 experiences" in result.output
    lines = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") > 3}
    assert [lines[s].split("│")[2].strip() for s in ("trained", "ready", "pending")] == ["1", "1", "1"]

    result = runner.invoke(app, ["buffer", "head", str(tmp_path), "-n", "5"])
    assert result.exit_code == 0, result.output
    assert "1.000" in result.output and "5.000" not in result.output  # not the decoy's reward

    out = tmp_path / "all.jsonl"
    assert runner.invoke(app, ["buffer", "export", str(tmp_path), str(out)]).exit_code == 0
    assert sorted(e.task_id for e in import_experiences(out)) == ["mine0", "mine1", "mine2"]

    rewards = tmp_path / "rewards.jsonl"
    rewards.write_text(json.dumps({"task_id": "mine2", "run_id": "r", "reward": 0.5}) + "\n")
    result = runner.invoke(app, ["buffer", "reward", str(tmp_path), str(rewards)])
    assert result.exit_code == 0 and "filled 1 of 1" in result.output, result.output
    assert sorted(e.reward for e, _ in read_rows(tmp_path, "ready")) == [0.5, 1.0]


def test_multi_stage_runs_open_the_last_persistent_buffer_or_the_named_stage(tmp_path):
    exps = [Experience(tokens=[1, 2, 3], prompt_length=2, action_mask=[1], reward=1.0, task_id="t")]
    _stored(tmp_path, {"storage": "file"}, exps).close()
    file_stage = yaml.safe_load((tmp_path / "config.yaml").read_text())
    stages = [
        {"stage": "warmup", "buffer": {"storage": "memory"}},
        {**file_stage, "stage": "rl"},
        {"stage": "eval_only", "buffer": {"storage": "memory"}},
    ]
    write_config(tmp_path / "config.yaml", stages=stages)

    assert [e.task_id for e, _ in read_rows(tmp_path)] == ["t"]  # the last stage with a persistent buffer
    assert read_rows(tmp_path, stage="warmup") is None  # memory: its checkpoints only
    result = runner.invoke(app, ["buffer", "stats", str(tmp_path), "--stage", "warmup"])
    assert result.exit_code == 0 and "kept its buffer in memory" in result.stderr
    result = runner.invoke(app, ["buffer", "stats", str(tmp_path), "--stage", "nope"])
    assert result.exit_code == 2 and "has stages ['warmup', 'rl', 'eval_only']" in result.output


def test_a_plugin_storage_is_opened_with_the_plugin_file_the_run_loaded(tmp_path, monkeypatch):
    from trine import registry

    monkeypatch.setattr(registry, "_extra", {})  # what the plugin registers is gone afterwards
    plugin = tmp_path / "my_storage.py"
    plugin.write_text(
        "import trine\nfrom trine.buffer import SQLBuffer\n\n"
        "@trine.register('storage', 'audited_sql')\nclass AuditedSQL(SQLBuffer):\n    pass\n"
    )
    registry.load_plugin(plugin)  # as `trine run --plugin` did
    exps = [Experience(tokens=[1, 2, 3], prompt_length=2, action_mask=[1], reward=1.0, task_id="p")]
    _stored(
        tmp_path,
        {
            "storage": "audited_sql",
            "url": None,
            "storage_args": {"url": f"sqlite:///{tmp_path / 'a.db'}", "table": "audit"},
        },
        exps,
    ).close()
    monkeypatch.setattr(registry, "_extra", {})  # a fresh `trine buffer` process

    result = runner.invoke(app, ["buffer", "stats", str(tmp_path)])
    assert result.exit_code == 2 and "trine buffer --plugin FILE" in result.output
    result = runner.invoke(app, ["buffer", "--plugin", str(plugin), "stats", str(tmp_path)])
    assert result.exit_code == 0 and "1 experiences" in result.output, result.output


def test_plugin_operators_of_the_run_are_not_needed_to_read_its_buffer(tmp_path):
    exps = [Experience(tokens=[1, 2, 3], prompt_length=2, action_mask=[1], reward=1.0, task_id="t")]
    _stored(tmp_path, {"storage": "file"}, exps).close()
    config = yaml.safe_load((tmp_path / "config.yaml").read_text())
    config["buffer"]["operators"] = [{"name": "only_in_a_plugin_file"}]
    write_config(tmp_path / "config.yaml", config)
    assert [e.task_id for e, _ in read_rows(tmp_path)] == ["t"]


def test_drop_pending_by_age_session_or_id_prints_what_it_dropped(run_dir):
    """Rows a reward will never come for (an agent that crashed): dropped by age, session or id, shown
    as ``expired`` afterwards, never trained; other rows are left alone."""
    import time

    def served(i: int, session: str) -> Experience:
        info = {"session_id": session, "response_ids": [f"chatcmpl-{i}"]}
        return Experience(tokens=[1, 2, 3], prompt_length=2, action_mask=[1], task_id=session, info=info)

    old = SQLBuffer(f"sqlite:///{run_dir / 'buffer.db'}", clock=lambda: time.time() - 7200)
    old.put([served(0, "s-old"), served(1, "s-old")])  # put two hours ago
    old.close()
    new = SQLBuffer(f"sqlite:///{run_dir / 'buffer.db'}")
    new.put([served(2, "s-new")])
    new.close()
    pending = {e.task_id: e.id for e, _ in read_rows(run_dir, "pending")}  # t6, t7, s-old (x2), s-new

    aged = runner.invoke(app, ["buffer", "drop-pending", str(run_dir), "--older-than", "1h"])
    assert aged.exit_code == 0, aged.output
    lines = aged.output.splitlines()
    assert lines[0] == f"dropped 2 pending experience(s) in {run_dir} (now expired, never trained):"
    assert len(lines) == 3 and all(
        "put 2.0h ago  task_id=s-old  session_id=s-old" in line for line in lines[1:]
    ), lines
    by_session = runner.invoke(app, ["buffer", "drop-pending", str(run_dir), "--session", "s-new"])
    assert by_session.output.splitlines()[1].startswith(f"  {pending['s-new']}  put ")
    by_id = runner.invoke(
        app, ["buffer", "drop-pending", str(run_dir), "--id", pending["t6"], "--id", "nope"]
    )
    said = by_id.output.splitlines()  # put a moment ago: 0s, or 1s on a loaded machine
    assert said[0] == f"dropped 1 pending experience(s) in {run_dir} (now expired, never trained):"
    assert len(said) == 2 and re.fullmatch(rf"  {pending['t6']}  put [01]s ago  task_id=t6", said[1]), said
    again = runner.invoke(app, ["buffer", "drop-pending", str(run_dir), "--id", pending["t6"]])
    assert again.output.strip() == f"no pending experience in {run_dir} matches; nothing dropped"

    assert [e.task_id for e, _ in read_rows(run_dir, "pending")] == ["t7"]
    assert sorted(e.task_id for e, _ in read_rows(run_dir, "expired")) == ["s-new", "s-old", "s-old", "t6"]
    assert len(read_rows(run_dir, "trained")) == 4 and len(read_rows(run_dir, "ready")) == 2


@pytest.mark.parametrize(
    ("args", "words"),
    [([], "give --older-than, --session or --id"), (["--older-than", "soon"], "expected a duration")],
)
def test_drop_pending_needs_a_filter_and_a_duration(run_dir, args, words):
    result = runner.invoke(app, ["buffer", "drop-pending", str(run_dir), *args])
    assert result.exit_code == 2 and words in result.output, result.output
    assert len(read_rows(run_dir, "pending")) == 2
