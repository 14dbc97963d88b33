"""Mode async (``launch: thread``) under a staleness bound never deadlocks on a partial batch: the explorer
paces itself by rows (:mod:`trine.explorer.pacing`), so it fills a batch the trainer is waiting for; and a
trainer that waits longer than ``sync.wait_timeout`` stops with an error saying what it waits for.

Each run is a real tiny-model loop. The runs that used to hang carry a pytest timeout (and a
``sync.wait_timeout``), so a regression fails instead of hanging.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import time
from pathlib import Path

import pytest

from tests.helpers import jsonl_rows, write_arithmetic_config
from trine.config import load_config
from trine.loop import run

pytestmark = pytest.mark.slow

HERE = "tests.faults.test_async_pacing"


def _loaded():
    """This module as the configs' import paths load it (pytest imports it under another name), whose
    counters the runs use."""
    return importlib.import_module(HERE)


def _config(tmp_path: Path, model_dir: Path, name: str, *overrides: dict) -> Path:
    """Mode async in one process, 4 tasks × 4 samples per batch, one torch thread."""
    base = {
        "mode": "async",
        "num_threads": 1,
        "tasks": {"total_steps": 12},
        "sync": {"wait_timeout": 60},
    }
    return write_arithmetic_config(tmp_path, model_dir, name, base, *overrides)


def _trained(run_dir: Path) -> list[dict]:
    return [r for r in jsonl_rows(run_dir / "metrics.jsonl", missing_ok=True) if "trainer/loss" in r]


def _logged_step(run_dir: Path) -> int:
    """The last training step ``<run_dir>/metrics.jsonl`` holds (0 if none)."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    steps = [0]
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:  # a line being written
            continue
        if "trainer/loss" in row:
            steps.append(int(row["step"]))
    return max(steps)


class _SingleTurn:
    """The single-turn workflow with a hook before each task (subclasses override :meth:`before`)."""

    def __init__(self, reward=None, run_dir: str = "", **kwargs):
        from trine.workflows import SingleTurnWorkflow

        self.inner = SingleTurnWorkflow(reward, **kwargs)
        self.run_dir = Path(run_dir)

    async def run(self, task, model):
        """Run :meth:`before`, then the single-turn workflow."""
        await self.before()
        return await self.inner.run(task, model)

    async def before(self) -> None:
        """Nothing by default."""


class LongTails(_SingleTurn):
    """Two long tails: the first task it runs returns only once the trainer has logged step 3, the second
    one not before the run ends (it is still in flight, deferred, when the first one's rows arrive)."""

    started = 0

    async def before(self) -> None:
        """Hold the first task until ``<run_dir>/metrics.jsonl`` shows step 3, the second for good."""
        LongTails.started += 1
        if LongTails.started == 1:
            while _logged_step(self.run_dir) < 3:
                await asyncio.sleep(0.05)
        elif LongTails.started == 2:
            await asyncio.sleep(3600)  # cancelled when the run ends


@pytest.mark.timeout(120)
def test_a_tail_task_dropped_stale_leaves_a_partial_batch_the_explorer_fills(tmp_path, tiny_model_dir):
    """The issue's deadlock: the deferred task's rows arrive 2+ versions old and are dropped stale, 12 of 16
    rows wait in the buffer; counted as a whole queued step (and the other deferred task as one more),
    they stopped the explorer for good while the trainer polled for 16 rows."""
    _loaded().LongTails.started = 0
    over = {
        "tasks": {"train": {"workflow": f"{HERE}:LongTails"}},  # trine passes it run_dir
        "buffer": {"max_staleness": 1},
        "explorer": {"tail_seconds": 0.3},
    }
    run(load_config(_config(tmp_path, tiny_model_dir, "tail", over)))
    rows = _trained(tmp_path / "tail")
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert rows[-1]["buffer/dropped_stale"] >= 4  # the first task's rows were too old
    assert all(r["buffer/staleness_max"] <= 1 for r in rows)


def drop_first_group(experiences):
    """An operator that drops the first group of the first batch it sees (4 of 16 rows)."""
    if drop_first_group.calls == 0 and experiences:
        group = experiences[0].group_id
        experiences = [e for e in experiences if e.group_id != group]
    drop_first_group.calls += 1
    return experiences


drop_first_group.calls = 0


@pytest.mark.timeout(120)
def test_a_filter_that_drops_rows_leaves_a_partial_batch_the_explorer_fills(tmp_path, tiny_model_dir):
    """A filter leaves 12 of 16 rows; with ``max_staleness: 0`` the explorer may start one task more (its rows
    land in the trainer's next batch) and puts it as a smaller batch instead of holding it for 3 more."""
    _loaded().drop_first_group.calls = 0
    over = {
        "tasks": {"total_steps": 4},
        "buffer": {"max_staleness": 0, "operators": [{"name": f"{HERE}:_drop_first_group"}]},
    }
    run(load_config(_config(tmp_path, tiny_model_dir, "filter", over)))
    rows = _trained(tmp_path / "filter")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["buffer/staleness_max"] == 0 for r in rows)
    assert _loaded().drop_first_group.calls >= 2


def _drop_first_group():
    """The operator factory the config names (an operator spec's ``name`` is called with its arguments)."""
    return drop_first_group


class FirstTaskNeverRewarded(_SingleTurn):
    """The first task's rows come back pending (reward None) and no reward ever arrives."""

    started = 0

    async def run(self, task, model):
        """The single-turn rows; the first task's with their rewards taken away."""
        FirstTaskNeverRewarded.started += 1
        first = FirstTaskNeverRewarded.started == 1
        rows = await self.inner.run(task, model)
        for e in rows if first else []:
            e.reward = None
        return rows


@pytest.mark.timeout(120)
def test_expired_pending_rows_leave_a_partial_batch_the_explorer_fills(tmp_path, tiny_model_dir):
    """4 rows wait for a reward that never comes; once ``buffer.pending_timeout`` drops them, 12 of 16 rows
    are left, and with ``max_staleness: 0`` the explorer still fills the batch."""
    _loaded().FirstTaskNeverRewarded.started = 0
    over = {
        "tasks": {"total_steps": 4, "train": {"workflow": f"{HERE}:FirstTaskNeverRewarded"}},
        "buffer": {"max_staleness": 0, "pending_timeout": 1.0},
    }
    run(load_config(_config(tmp_path, tiny_model_dir, "pending", over)))
    rows = _trained(tmp_path / "pending")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["buffer/pending_expired"] == 4
    assert all(r["buffer/staleness_max"] == 0 for r in rows)


class HangsForever(_SingleTurn):
    """Every task hangs (longer than the trainer's ``sync.wait_timeout``, shorter than ``explorer.timeout``)."""

    async def before(self) -> None:
        """Sleep for an hour."""
        await asyncio.sleep(3600)


@pytest.mark.timeout(120)
def test_a_trainer_that_waits_too_long_stops_saying_what_it_waits_for(tmp_path, tiny_model_dir):
    """No batch within ``sync.wait_timeout``: a TimeoutError naming the rows ready and needed, the tasks in
    flight and what the explorer is doing, within seconds."""
    over = {
        "tasks": {"total_steps": 2, "train": {"workflow": f"{HERE}:HangsForever"}},
        "sync": {"wait_timeout": 2},
        "explorer": {"timeout": 600},
    }
    start = time.monotonic()
    with pytest.raises(TimeoutError) as caught:
        run(load_config(_config(tmp_path, tiny_model_dir, "hang", over)))
    message = str(caught.value)
    assert time.monotonic() - start < 30
    assert "0 of 16 rows ready" in message
    assert "4 tasks in flight" in message
    assert "exploring" in message
    assert "sync.wait_timeout" in message
