"""File storage: jsonl/parquet export-import, and FileBuffer's append-only log surviving a reopen.

The Buffer semantics shared with the other storages are tested in test_buffer_sql.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helpers import exp, f32, ids
from trine.buffer import BufferTimeout, FileBuffer, SQLBuffer
from trine.buffer.files import export_experiences, import_experiences
from trine.types import Experience


def rich(i: int, **fields: Any) -> Experience:
    """Experience ``i`` with every field set, to values a lossy format would change (large token ids,
    float32 logprobs, non-ASCII and nested info); ``fields`` override them."""
    return exp(
        i,
        **{
            "tokens": [1, 50_000 + i, 2**31 - 1, i],
            "action_mask": [1, 0, 1],
            "logprobs": [f32(-0.3 - i / 7), 0.0, f32(-1e-6)],
            "token_rewards": [0.0, f32(0.1), 1.0] if i % 2 else None,
            "task_id": f"task{i}",
            "group_id": f"g{i // 2}",
            "run_id": f"run{i}",
            "step": i,
            "kind": "preference" if i == 3 else "rollout",
            "info": {"i": i, "text": "ünïcode ✓", "nested": {"a": [1, 2.5, None]}},
            **fields,
        },
    )


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_export_import_round_trip_is_exact(tmp_path, suffix):
    sent = [rich(i) for i in range(5)] + [rich(5, reward=None)]
    sent[2].logprobs = None
    path = tmp_path / "sub" / f"experiences{suffix}"
    assert export_experiences(sent, path) == 6
    assert import_experiences(path) == sent


def test_jsonl_keeps_float64_values_exactly(tmp_path):
    e = rich(0)
    e.logprobs = [-0.1, 0.0, -1 / 3]  # not float32-representable
    export_experiences([e], tmp_path / "x.jsonl")
    assert import_experiences(tmp_path / "x.jsonl")[0].logprobs == [-0.1, 0.0, -1 / 3]


def test_parquet_columns_have_the_documented_types(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    export_experiences([rich(0), rich(1)], tmp_path / "x.parquet")
    table = pq.read_table(tmp_path / "x.parquet")
    schema = table.schema
    assert schema.field("tokens").type == pa.list_(pa.int32())
    assert schema.field("action_mask").type == pa.list_(pa.int32())
    assert schema.field("logprobs").type == pa.list_(pa.float32())
    assert schema.field("token_rewards").type == pa.list_(pa.float32())
    assert schema.field("reward").type == pa.float64()
    assert schema.field("info").type == pa.string()
    assert table.column("token_rewards").to_pylist()[0] is None
    assert json.loads(table.column("info").to_pylist()[1])["nested"] == {"a": [1, 2.5, None]}


def test_bad_paths_are_named(tmp_path):
    with pytest.raises(ValueError, match=r"\.jsonl.*\.parquet"):
        export_experiences([rich(0)], tmp_path / "x.csv")
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        import_experiences(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="'.jsonl'"):
        FileBuffer(tmp_path / "x.parquet")


def test_sql_buffer_rows_export_to_parquet(tmp_path):
    buf = SQLBuffer(tmp_path / "b.db")
    sent = [rich(i) for i in range(4)]
    buf.put(sent)
    export_experiences(buf.get(4, timeout=1.0), tmp_path / "out.parquet")
    assert import_experiences(tmp_path / "out.parquet") == sent
    buf.close()


def test_file_buffer_reopens_where_it_left_off(tmp_path):
    path = tmp_path / "buffer.jsonl"
    buf = FileBuffer(path)
    buf.put([rich(i, version=i) for i in range(5)] + [rich(8, reward=None), rich(9, reward=None)])
    assert ids(buf.get(2, min_version=1, timeout=0)) == [1, 2]  # 0 is dropped as stale
    assert buf.set_rewards({("task8", "run8"): 0.5}) == 1
    state = buf.state_dict()
    buf.close()

    again = FileBuffer(path)
    again.load_state_dict(state)
    assert again.metrics() == {"buffer/size": 3.0, "buffer/pending": 1.0, "buffer/dropped_stale": 1.0}
    assert again.consumed == 2 and len(again) == 3
    got = again.get(3, timeout=0)
    assert ids(got) == [3, 4, 8] and got[2].reward == 0.5
    with pytest.raises(BufferTimeout, match="1 pending"):
        again.get(1, timeout=0.05)
    # The log imports as the experiences it holds, with the rewards filled in later.
    imported = import_experiences(path)
    assert ids(imported) == [0, 1, 2, 3, 4, 8, 9]
    assert [e.reward for e in imported][-2:] == [0.5, None]


def test_file_buffer_skips_a_torn_last_line(tmp_path):
    path = tmp_path / "buffer.jsonl"
    FileBuffer(path).put([rich(0), rich(1)])
    with path.open("a") as f:
        f.write('{"tokens": [1, 2')  # a crash in the middle of a write
    with pytest.warns(UserWarning, match="truncated last line"):
        again = FileBuffer(path)
    assert ids(again.get(2, timeout=0)) == [0, 1]


def test_file_buffer_log_lines_are_plain_experiences_and_events(tmp_path):
    path = tmp_path / "buffer.jsonl"
    buf = FileBuffer(path)
    pending = rich(0, reward=None)
    buf.put([pending])
    buf.set_rewards({pending.id: 2.0})
    buf.get(1, timeout=0)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0] == pending.to_dict() | {"reward": None}
    assert lines[1:] == [
        {"_event": "batch", "batch": 1, "size": 1},  # the put was one explored batch
        {"_event": "reward", "id": pending.id, "reward": 2.0},
        {"_event": "consumed", "ids": [pending.id]},
    ]
