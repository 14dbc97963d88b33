"""A run with a SQL buffer that crashes between checkpoints resumes exactly as if it never had.

The checkpoint at step 2 holds the buffer's high-water mark; the crash comes after step 3, when
batches 3 and 4 are in the database and batch 3 is consumed. Resuming rewinds the table to the
checkpoint (those rows become ``rolled_back``), explores batches 3 and 4 again with the restored
task cursor and RNG, and trains on the same experiences as an uninterrupted run.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.helpers import read_metrics, run_crashing_after_step
from trine.buffer.inspect import read_rows
from trine.config import load_config
from trine.loop import run

pytestmark = pytest.mark.slow

VOLATILE = ("time/", "trainer/tokens_per_second", "sync/seconds")
OVERRIDES = {"buffer": {"storage": "sql"}, "sync": {"sync_interval": 2}, "trainer": {"save_every": 2}}


def _stable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def _consumed(run_dir) -> Counter:
    """What the trainer took, as (batch, task, tokens): one entry per consumed experience."""
    return Counter(
        (e.info["batch"], e.task_id, tuple(e.tokens))
        for e, status in read_rows(run_dir)
        if status == "trained"
    )


def test_crash_between_checkpoints_resumes_bit_identical(arithmetic_config, tmp_path, monkeypatch):
    run(load_config(arithmetic_config(OVERRIDES, name="full")))
    reference = _stable(read_metrics(tmp_path / "full"))
    assert [r["step"] for r in reference] == [1, 2, 3, 4, 5, 6]

    crashed = arithmetic_config(OVERRIDES, name="crashed")
    run_crashing_after_step(crashed, 3, monkeypatch)  # no checkpoint at 3; batch 4 explored, not trained
    assert json.loads((tmp_path / "crashed" / "status.json").read_text())["state"] == "failed"
    assert sorted(p.name for p in (tmp_path / "crashed" / "checkpoints").iterdir()) == ["step_2"]
    before = read_rows(tmp_path / "crashed")
    assert {s for _, s in before} == {"trained", "ready"}  # batch 3 trained, batch 4 ready in the table
    assert {e.info["batch"] for e, s in before if s == "ready"} == {3}

    run(load_config(crashed))  # the same run directory: resumes from step_2
    rows = _stable(read_metrics(tmp_path / "crashed"))
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]  # the crashed timeline's step 3 was cut on resume
    assert rows == reference  # same samples, same buffer counts, same updates
    rewound = (tmp_path / "crashed" / "metrics.jsonl.rewound").read_text().splitlines()
    assert [json.loads(line)["step"] for line in rewound] == [3]  # kept for forensics
    assert json.loads((tmp_path / "crashed" / "status.json").read_text())["state"] == "finished"

    statuses = Counter(s for _, s in read_rows(tmp_path / "crashed"))
    explored_twice = Counter(
        e.info["batch"] for e, s in read_rows(tmp_path / "crashed") if s == "rolled_back"
    )
    assert set(explored_twice) == {2, 3}  # the crashed timeline's batches 3 and 4 (indices 2, 3)
    assert statuses == {
        "trained": sum(_consumed(tmp_path / "full").values()),
        "rolled_back": sum(explored_twice.values()),
    }
    # nothing consumed twice: the resumed timeline took exactly what the uninterrupted run took
    assert _consumed(tmp_path / "crashed") == _consumed(tmp_path / "full")
