"""Tests for trine.tasks: TaskSet sources and mapping, TaskScheduler order/resume, arithmetic generator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trine.tasks import TaskScheduler, TaskSet, generate_arithmetic, write_jsonl
from trine.tasks.arithmetic import write_example_data
from trine.types import SamplingParams, Task

ROOT = Path(__file__).resolve().parents[3]
ROWS = [{"question": f"{i}+1=", "answer": str(i + 1), "uid": f"q{i}"} for i in range(6)]


@pytest.fixture(scope="module")
def datasets():
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    return datasets


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def questions(taskset) -> list:
    return [task.question for task in taskset]


# -- sources ------------------------------------------------------------------------------------------


def test_jsonl_round_trip_maps_every_field(tmp_path):
    path = write_jsonl(ROWS, tmp_path / "train.jsonl")
    ts = TaskSet(path, name="arith", workflow="w", reward="r", repeat=4, sampling={"temperature": 0.5})
    assert len(ts) == 6 and ts.skipped_rows == 0
    task = ts[2]
    assert isinstance(task, Task)
    assert (task.task_id, task.question, task.answer, task.taskset) == ("arith/2", "2+1=", "3", "arith")
    assert task.raw == ROWS[2]
    assert (task.workflow, task.reward, task.repeat) == ("w", "r", 4)
    assert task.sampling == SamplingParams(temperature=0.5)
    assert task.sampling is not ts[3].sampling  # per-task copies: a workflow may change its own
    assert [t.task_id for t in ts.tasks] == [f"arith/{i}" for i in range(6)]


def test_json_list_file(tmp_path):
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(ROWS), encoding="utf-8")
    assert questions(TaskSet(path)) == [r["question"] for r in ROWS]


def test_parquet_file(tmp_path, datasets):
    path = tmp_path / "rows.parquet"
    datasets.Dataset.from_list(ROWS).to_parquet(str(path))
    ts = TaskSet(str(path), id_key="uid")
    assert questions(ts) == [r["question"] for r in ROWS]
    assert [t.task_id for t in ts] == [r["uid"] for r in ROWS]
    assert ts[0].raw == ROWS[0]


def test_save_to_disk_dataset_and_dataset_dict(tmp_path, datasets):
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "single"))
    assert questions(TaskSet(tmp_path / "single")) == [r["question"] for r in ROWS]

    dd = datasets.DatasetDict(
        {"train": datasets.Dataset.from_list(ROWS[:4]), "test": datasets.Dataset.from_list(ROWS[4:])}
    )
    dd.save_to_disk(str(tmp_path / "dict"))
    assert questions(TaskSet(tmp_path / "dict", split="test")) == ["4+1=", "5+1="]
    assert len(TaskSet(tmp_path / "dict", split="train")) == 4
    with pytest.raises(ValueError, match=r"splits \['train', 'test'\].*split=None"):
        TaskSet(tmp_path / "dict")
    with pytest.raises(ValueError, match="split='validation'"):
        TaskSet(tmp_path / "dict", split="validation")

    datasets.DatasetDict({"only": datasets.Dataset.from_list(ROWS[:2])}).save_to_disk(str(tmp_path / "one"))
    assert len(TaskSet(tmp_path / "one")) == 2  # a lone split needs no name


def test_directory_of_files_with_split_prefix(tmp_path, datasets):
    write_jsonl(ROWS[:2], tmp_path / "train-00000.jsonl")
    datasets.Dataset.from_list(ROWS[2:4]).to_parquet(str(tmp_path / "train-00001.parquet"))
    write_jsonl(ROWS[4:], tmp_path / "test.jsonl")
    everything = TaskSet(tmp_path)
    assert questions(everything) == ["4+1=", "5+1=", "0+1=", "1+1=", "2+1=", "3+1="]  # sorted file names
    train = TaskSet(tmp_path, split="train")
    assert questions(train) == ["0+1=", "1+1=", "2+1=", "3+1="]
    assert [t.task_id for t in train] == [f"train/{i}" for i in range(4)]
    with pytest.raises(ValueError, match="split='dev'"):
        TaskSet(tmp_path, split="dev")


def test_missing_path_names_it(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        TaskSet(missing)


# -- mapping ------------------------------------------------------------------------------------------


def test_system_prompt_and_template(tmp_path):
    path = write_jsonl(ROWS, tmp_path / "t.jsonl")
    ts = TaskSet(path, system_prompt="Be brief.", prompt_template="Q{uid}: what is {question}?")
    assert ts[1].question == "Qq1: what is 1+1=?"
    assert ts[1].system_prompt == "Be brief."
    with pytest.raises(ValueError, match=r"t.jsonl line 1.*needs field 'topic'"):
        TaskSet(path, prompt_template="{topic}: {question}")
    with pytest.raises(ValueError, match="positional field"):
        TaskSet(path, prompt_template="{} {question}")


def test_messages_key_folds_system_prompt(tmp_path):
    rows = [
        {"chat": [{"role": "user", "content": "hi"}], "answer": "a"},
        {"chat": [{"role": "system", "content": "own"}, {"role": "user", "content": "yo"}], "answer": "b"},
    ]
    ts = TaskSet(write_jsonl(rows, tmp_path / "c.jsonl"), messages_key="chat", system_prompt="sys")
    assert ts[0].question == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    assert ts[1].question == rows[1]["chat"]  # the row's own system message wins
    assert ts[0].system_prompt is None and ts[0].answer == "a"
    assert rows[0]["chat"] == [{"role": "user", "content": "hi"}]  # the raw row is untouched
    with pytest.raises(ValueError, match="both set"):
        TaskSet(tmp_path / "c.jsonl", messages_key="chat", prompt_template="{chat}")


def test_answer_key_none_and_limit(tmp_path):
    path = write_jsonl([{"question": r["question"]} for r in ROWS], tmp_path / "q.jsonl")
    ts = TaskSet(path, answer_key=None, limit=3)
    assert len(ts) == 3 and all(t.answer is None for t in ts)


def test_bad_sampling_and_settings_are_named(tmp_path):
    path = write_jsonl(ROWS, tmp_path / "s.jsonl")
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['temp'\]"):
        TaskSet(path, sampling={"temp": 1.0})
    with pytest.raises(ValueError, match="on_bad_row='ignore'"):
        TaskSet(path, on_bad_row="ignore")
    with pytest.raises(ValueError, match="repeat=0"):
        TaskSet(path, repeat=0)


# -- bad rows -----------------------------------------------------------------------------------------


def test_bad_row_error_names_file_line_and_key(tmp_path):
    path = write_lines(
        tmp_path / "bad.jsonl",
        [json.dumps(ROWS[0]), "", json.dumps({"prompt": "x", "answer": "1"}), json.dumps(ROWS[1])],
    )
    with pytest.raises(ValueError) as info:
        TaskSet(path)
    message = str(info.value)
    assert str(path) in message and "line 3" in message  # 1-based line, blank lines counted
    assert "'question'" in message and "['answer', 'prompt']" in message
    assert "on_bad_row='skip'" in message


def test_bad_row_in_parquet_names_row(tmp_path, datasets):
    path = tmp_path / "bad.parquet"
    datasets.Dataset.from_list([ROWS[0], {"question": "2+2=", "answer": None, "uid": "x"}]).to_parquet(
        str(path)
    )
    with pytest.raises(ValueError, match=r"bad.parquet row 2: key 'answer' \(answer_key\) is null"):
        TaskSet(path)


def test_skip_mode_counts_bad_rows(tmp_path):
    path = write_lines(
        tmp_path / "mixed.jsonl",
        [json.dumps(ROWS[0]), "{not json", json.dumps({"answer": "1"}), "[1, 2]", json.dumps(ROWS[1])],
    )
    ts = TaskSet(path, on_bad_row="skip")
    assert ts.skipped_rows == 3
    assert questions(ts) == ["0+1=", "1+1="]
    assert [t.task_id for t in ts] == ["train/0", "train/4"]  # ids keep the row index


def test_empty_tasksets_are_errors(tmp_path):
    with pytest.raises(ValueError, match="is empty: no rows"):
        TaskSet(write_lines(tmp_path / "empty.jsonl", [""]))
    with pytest.raises(ValueError, match="all 2 rows were bad"):
        TaskSet(write_jsonl([{"x": 1}, {"x": 2}], tmp_path / "x.jsonl"), on_bad_row="skip")


def test_duplicate_ids_are_bad_rows(tmp_path):
    rows = [dict(ROWS[0]), dict(ROWS[1], uid="q0")]
    with pytest.raises(ValueError, match="task id 'q0'.*line 1"):
        TaskSet(write_jsonl(rows, tmp_path / "d.jsonl"), id_key="uid")


# -- scheduler ----------------------------------------------------------------------------------------


def make_tasks(n: int) -> list[Task]:
    return [Task(task_id=f"t/{i}", question=str(i)) for i in range(n)]


def ids(batch: list[Task]) -> list[str]:
    return [t.task_id for t in batch]


def test_seeded_shuffle_differs_per_epoch_and_is_reproducible():
    tasks = make_tasks(10)
    a = TaskScheduler(tasks, seed=7, epochs=3)
    epochs = [ids(a.next_batch(10)) for _ in range(3)]
    assert all(sorted(e) == sorted(ids(tasks)) for e in epochs)  # each epoch is a permutation
    assert epochs[0] != epochs[1] != epochs[2] and epochs[0] != ids(tasks)
    b = TaskScheduler(tasks, seed=7, epochs=3)
    assert [ids(b.next_batch(4)) for _ in range(8)][:7] == [
        sum(epochs, [])[i : i + 4] for i in range(0, 28, 4)
    ]
    assert ids(TaskScheduler(tasks, seed=8).next_batch(10)) != epochs[0]
    assert ids(TaskScheduler(tasks, shuffle=False).next_batch(10)) == ids(tasks)


def test_batches_cross_epochs_and_exhaust():
    s = TaskScheduler(make_tasks(5), shuffle=False, epochs=2)
    assert s.total_batches(3) == 4 and s.steps_per_epoch(3) == 2
    assert ids(s.next_batch(3)) == ["t/0", "t/1", "t/2"]
    assert ids(s.next_batch(3)) == ["t/3", "t/4", "t/0"]  # crosses into epoch 1
    assert s.epoch == 1 and not s.exhausted
    assert ids(s.next_batch(3)) == ["t/1", "t/2", "t/3"]
    assert ids(s.next_batch(3)) == ["t/4"]  # the short tail
    assert s.exhausted and s.next_batch(3) == []


def test_drop_last_and_endless():
    s = TaskScheduler(make_tasks(5), shuffle=False, epochs=1, drop_last=True)
    assert s.total_batches(2) == 2
    assert len(s.next_batch(2)) == 2 and len(s.next_batch(2)) == 2
    assert s.next_batch(2) == [] and s.exhausted
    endless = TaskScheduler(make_tasks(3), epochs=None)
    assert all(len(endless.next_batch(2)) == 2 for _ in range(20)) and endless.total_batches(2) is None
    with pytest.raises(ValueError, match="n=0"):
        endless.next_batch(0)


def test_state_dict_resume_yields_identical_batches():
    tasks = make_tasks(7)
    original = TaskScheduler(tasks, seed=3, epochs=4)
    for _ in range(5):
        original.next_batch(3)
    original.feedback(["t/1", "t/2"], {"pass_rate": [1.0, 0.25]})
    state = json.loads(json.dumps(original.state_dict()))  # plain JSON round trip
    resumed = TaskScheduler(tasks, seed=3, epochs=4)
    resumed.load_state_dict(state)
    assert resumed.task_stats("t/2") == original.task_stats("t/2")
    rest_original = [ids(original.next_batch(3)) for _ in range(6)]
    rest_resumed = [ids(resumed.next_batch(3)) for _ in range(6)]
    assert rest_resumed == rest_original and rest_original[-1] == []
    with pytest.raises(ValueError, match="seed=3.*seed=4"):
        TaskScheduler(tasks, seed=4).load_state_dict(state)
    with pytest.raises(ValueError, match="num_tasks=7"):
        TaskScheduler(make_tasks(8), seed=3).load_state_dict(state)


def test_feedback_records_per_task_stats():
    s = TaskScheduler(make_tasks(3))
    s.feedback(["t/0", "t/1"], {"pass_rate": [0.5, 1.0], "reward": [[1.0, 0.0], None]})
    s.feedback(["t/0"], [{"pass_rate": 1.0}])
    assert s.task_stats("t/0") == {
        "pass_rate": 1.0,
        "pass_rate_mean": 0.75,
        "pass_rate_n": 2,
        "reward": 0.5,
        "reward_mean": 0.5,
        "reward_n": 1,
    }
    assert s.task_stats("t/1") == {"pass_rate": 1.0, "pass_rate_mean": 1.0, "pass_rate_n": 1}
    assert s.task_stats("t/2") == {}
    with pytest.raises(ValueError, match="one value per task id"):
        s.feedback(["t/0", "t/1"], {"pass_rate": [1.0]})
    with pytest.raises(ValueError, match="'t/9'"):
        s.feedback(["t/9"], {"pass_rate": [1.0]})


def test_scheduler_over_a_taskset(tmp_path):
    ts = TaskSet(write_jsonl(generate_arithmetic(None), tmp_path / "a.jsonl"))
    s = TaskScheduler(ts, seed=1)
    seen = [t.task_id for _ in range(10) for t in s.next_batch(10)]
    assert sorted(seen) == sorted(t.task_id for t in ts) and s.exhausted


# -- arithmetic ---------------------------------------------------------------------------------------


def test_generate_all_single_digit_additions():
    rows = generate_arithmetic(None, seed=0)
    assert len(rows) == 100
    assert {(r["a"], r["b"]) for r in rows} == {(a, b) for a in range(10) for b in range(10)}
    for r in rows:
        assert (
            r["question"] == f"{r['a']}+{r['b']}=" and r["answer"] == str(r["a"] + r["b"]) and r["op"] == "+"
        )
    assert rows == generate_arithmetic(None, seed=0) and rows != generate_arithmetic(None, seed=1)


def test_generate_ops_sampling_and_errors():
    rows = generate_arithmetic(None, ops=("-", "*"), min_value=2, max_value=4)
    assert len(rows) == 18
    for r in rows:
        expected = r["a"] - r["b"] if r["op"] == "-" else r["a"] * r["b"]
        assert r["answer"] == str(expected) and r["question"] == f"{r['a']}{r['op']}{r['b']}="
    sample = generate_arithmetic(30, seed=5)
    assert len({r["question"] for r in sample}) == 30 and sample == generate_arithmetic(30, seed=5)
    assert len(generate_arithmetic(300, unique=False)) == 300
    with pytest.raises(ValueError, match="only 100 exist"):
        generate_arithmetic(101)
    with pytest.raises(ValueError, match="'/'"):
        generate_arithmetic(5, ops=("/",))


def test_shipped_example_data_matches_generator(tmp_path):
    written = write_example_data(tmp_path)
    for path in written:
        shipped = ROOT / "examples" / "arithmetic" / "data" / path.name
        assert shipped.read_text() == path.read_text()
        ts = TaskSet(shipped)
        assert len(ts) == 100 and len({t.question for t in ts}) == 100
