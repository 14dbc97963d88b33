"""``trine train CONFIG --replay RUN_DIR``: the steps a run trained, read back from its SQL buffer, train
CONFIG's model again (same rows, order, versions and rewards) into a new run directory, leaving the run's
buffer untouched; runs that cannot be replayed are refused before anything is written."""

from __future__ import annotations

import itertools
import sqlite3

import pytest
from typer.testing import CliRunner

from tests.helpers import exp, read_metrics, write_arithmetic_config, write_config
from trine.buffer import SamplingRules, SQLBuffer
from trine.buffer.replay import ReplayError, TrainedSteps
from trine.cli import app
from trine.config import load_config
from trine.launch.replay import replay
from trine.loop import run
from trine.types import Experience

runner = CliRunner()
TIMING = ("trainer/tokens_per_second",)  # wall-clock rates: the only trainer/* keys allowed to differ


def varied_reward(response: str, task: object = None) -> float:
    """A reward that differs between samples of one task, so the GRPO steps train on something."""
    return (sum(map(ord, response)) % 5) / 4


def _config(tmp_path, model_dir, mode: str, **extra):
    base = {
        "mode": mode,
        "tasks": {"total_steps": 4, "train": {"reward": "tests.unit.trainer.test_replay:varied_reward"}},
        "buffer": {"storage": "sql"},
        "trainer": {"save_every": 2},
    }
    return write_arithmetic_config(tmp_path, model_dir, "src", base, extra)


def _table(db) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT * FROM experiences ORDER BY seq").fetchall()


def _replayed_keys(row: dict) -> dict:
    keep = ("trainer/", "buffer/staleness", "buffer/reuse")
    return {k: v for k, v in row.items() if k.startswith(keep) and k not in TIMING}


@pytest.mark.slow
def test_replaying_a_sync_run_reproduces_its_trainer_metrics(tmp_path, tiny_model_dir, one_torch_thread):
    config = _config(tmp_path, tiny_model_dir, "sync")
    run(load_config(config))
    source = tmp_path / "src"
    table = _table(source / "buffer.db")
    # the same config: its run_dir is the run itself, so the replay goes next to it; stopped at step 2...
    first = runner.invoke(app, ["train", str(config), "stop_after_steps=2", "--replay", str(source)])
    assert first.exit_code == 0, first.output
    target = tmp_path / "src-replay"
    assert len(read_metrics(target)) == 2 and "stopped" in (target / "status.json").read_text()
    again = runner.invoke(app, ["train", str(config), "--replay", str(source)])  # ...resumed from there
    assert again.exit_code == 0, again.output

    ran, replayed = read_metrics(source), read_metrics(target)
    assert [r["step"] for r in replayed] == [1, 2, 3, 4]
    assert all(r["trainer/grad_norm"] > 0 for r in ran)  # the steps trained on something
    for a, b in zip(ran, replayed, strict=True):
        assert _replayed_keys(b) == _replayed_keys(a)  # bit for bit: loss, grad_norm, lr, staleness, version
        assert set(_replayed_keys(a)) >= {"trainer/loss", "buffer/staleness_max", "trainer/version"}
    assert _table(source / "buffer.db") == table  # the run's buffer is only read
    assert "status.json" in {p.name for p in target.iterdir()} and (target / "replay.json").is_file()
    assert sorted(p.name for p in (target / "checkpoints").iterdir())[-1].endswith("4")


@pytest.mark.slow
def test_replaying_an_async_run_trains_its_steps_in_order(tmp_path, tiny_model_dir, one_torch_thread):
    config = _config(tmp_path, tiny_model_dir, "async", buffer={"max_staleness": 1})
    run(load_config(config))
    (cfg,) = load_config(config)
    cfg = cfg.model_copy(update={"run_dir": str(tmp_path / "again")})
    replay([cfg], tmp_path / "src")
    ran, replayed = read_metrics(tmp_path / "src"), read_metrics(tmp_path / "again")
    assert len(replayed) == 4
    for a, b in zip(ran, replayed, strict=True):  # the explorer ran ahead: stale rows, replayed as stored
        assert _replayed_keys(b) == _replayed_keys(a)
    assert any(r["buffer/staleness_max"] == 1 for r in replayed)


def _clock():
    ticks = itertools.count(1000)
    return lambda: float(next(ticks))


def _group(name: str, rewards: list[float], version: int = 0) -> list[Experience]:
    return [exp(reward=r, group_id=name, version=version) for r in rewards]


def _run_dir_with(tmp_path, buffer: dict) -> SQLBuffer:
    """A run directory whose config.yaml names ``buffer`` and whose SQL buffer is returned, empty."""
    write_config(tmp_path / "config.yaml", name="r", buffer=buffer)
    rules = SamplingRules(**{k: v for k, v in buffer.items() if k != "storage"})
    return SQLBuffer(f"sqlite:///{tmp_path / 'buffer.db'}", rules=rules, clock=_clock())


def test_steps_are_the_gets_in_order_with_their_rows_in_hand_out_order(tmp_path):
    buffer = _run_dir_with(tmp_path, {"storage": "sql", "sampler": "priority", "whole_groups": True})
    mixed = [*_group("a", [0.0], version=0), *_group("b", [0.5], version=1), *_group("a", [1.0], version=2)]
    buffer.put(mixed)
    gets = [buffer.get(None, timeout=5)]
    buffer.put([])  # an empty explored batch: trained as an empty step
    gets.append(buffer.get(None, timeout=5))
    buffer.put(_group("c", [1.0, 0.0, 0.5], version=2))
    gets += [buffer.get(2, current_version=3, timeout=5), buffer.get(1, timeout=5)]
    buffer.close()
    # freshest first, a group's members together (in neither put nor version order), the empty batch...
    assert [[e.group_id for e in g] for g in gets] == [["a", "a", "b"], [], ["c", "c"], ["c"]]
    assert [e.policy_version for e in gets[0]] == [2, 0, 1]

    steps = TrainedSteps.open(tmp_path)
    assert len(steps) == 4 and steps.exact
    for i, handed_out in enumerate(gets):
        experiences, metrics = steps.get(i, current_version=3)
        assert [e.id for e in experiences] == [e.id for e in handed_out]
        assert [e.reward for e in experiences] == [e.reward for e in handed_out]
        if handed_out:
            lag = [3 - e.policy_version for e in handed_out]
            assert metrics["buffer/staleness_max"] == max(lag) and metrics["buffer/reuse"] == 1.0
    steps.close()


def test_reused_rows_are_replayed_at_their_last_use(tmp_path):
    rules = {"storage": "sql", "sampler": "priority", "reuse_limit": 2}
    buffer = _run_dir_with(tmp_path, rules)
    buffer.put(_group("a", [0.0, 1.0]))
    first, second = buffer.get(2, timeout=5), buffer.get(1, timeout=5)  # get 2 hands the first row out again
    buffer.close()
    steps = TrainedSteps.open(tmp_path)
    assert not steps.exact and len(steps) == 2
    assert [e.id for e in steps.get(0)[0]] == [first[1].id] and [e.id for e in steps.get(1)[0]] == [
        second[0].id
    ]
    assert steps.get(1)[1]["buffer/reuse"] == 2.0
    steps.close()


def test_runs_that_cannot_be_replayed_are_refused_before_anything_is_written(tmp_path, tiny_model_dir):
    config = write_arithmetic_config(tmp_path, tiny_model_dir, "replay", {"buffer": {"storage": "sql"}})

    def refused(source) -> str:
        result = runner.invoke(app, ["train", str(config), "--replay", str(source)])
        assert result.exit_code == 2, result.output
        assert not (tmp_path / "replay").exists()
        return " ".join(result.output.split())

    assert "does not exist; pass a run directory" in refused(tmp_path / "nowhere")
    for storage in ("memory", "file"):
        (tmp_path / storage).mkdir()
        write_config(tmp_path / storage / "config.yaml", buffer={"storage": storage})
        said = refused(tmp_path / storage)
        assert f"buffer.storage={storage!r}" in said and "run with buffer.storage: sql" in said
    idle = tmp_path / "idle"
    idle.mkdir()
    buffer = _run_dir_with(idle, {"storage": "sql"})
    buffer.put(_group("a", [1.0, 0.0]))  # explored, never trained
    buffer.close()
    assert "trained nothing: its buffer" in refused(idle) and "holds 2 experience(s)" in refused(idle)
    with pytest.raises(ReplayError, match="trained nothing"):
        TrainedSteps.open(idle)


def test_a_replay_never_writes_into_another_runs_directory(tmp_path, tiny_model_dir):
    config = write_arithmetic_config(tmp_path, tiny_model_dir, "replay", {"buffer": {"storage": "sql"}})
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.yaml").write_text("name: other\n")
    result = runner.invoke(app, ["train", str(config), f"run_dir={other}", "--replay", str(tmp_path / "x")])
    assert result.exit_code == 2 and "is the directory of another run" in " ".join(result.output.split())
    assert [p.name for p in other.iterdir()] == ["config.yaml"]
