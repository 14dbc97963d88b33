"""The human_feedback workflow (items posted to a real annotation queue, answers landed in a real SQL
buffer), its config checks, and ``mode: train`` on the rows of a buffer (``tasks.source: buffer``):
the source, its end when the buffer runs dry, and a resume that trains every row once."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.helpers import EXAMPLE, write_arithmetic_config, write_config
from trine.buffer import SQLBuffer
from trine.build import _run_dir_args
from trine.config import TasksetConfig, load_config, validate_dict
from trine.feedback.landing import land
from trine.feedback.queue import AnnotationQueue, queue_url
from trine.loop import run
from trine.status import read_status
from trine.tasks.supervised import preference_experiences
from trine.trainer.sources import BufferSource
from trine.types import SamplingParams, Task
from trine.workflows import WORKFLOWS, HumanFeedbackWorkflow

pytestmark = pytest.mark.usefixtures("one_torch_thread")


async def _no_reward(text: str, task: Task) -> tuple[float, dict[str, float]]:
    raise AssertionError("human_feedback never calls the reward: people give it")


def _task(repeat: int, index: int = 0) -> Task:
    return Task(
        task_id=f"add/{index}",
        question=f"{index}+3=",
        answer=str(index + 3),
        repeat=repeat,
        sampling=SamplingParams(temperature=1.0, max_tokens=4),
        workflow="human_feedback",
    )


def test_rate_posts_one_item_per_response_in_one_batch_and_leaves_rewards_pending(engine, tmp_path):
    assert WORKFLOWS["human_feedback"] is HumanFeedbackWorkflow
    workflow = HumanFeedbackWorkflow(_no_reward, scale=[1, 5], timeout=120, run_dir=str(tmp_path))
    experiences = asyncio.run(workflow.run(_task(3), engine))
    workflow.close()
    queue = AnnotationQueue(queue_url(tmp_path))
    items = {i.id: i for i in queue.items()}
    assert len(experiences) == 3 and len(items) == 3
    assert len({i.batch for i in items.values()}) == 1  # one task, one batch
    for e in experiences:
        assert e.reward is None and e.response_length > 0
        item = items[e.info["annotation_item"]]
        assert item.kind == "rate" and item.status == "open" and item.scale == (1.0, 5.0)
        assert item.prompt == "0+3=" and item.meta["task_id"] == "add/0" and item.meta["answer"] == "3"
        assert item.responses[0]["experience_id"] == e.id
        assert item.responses[0]["text"] == e.info["response"]
        assert item.expires_at == pytest.approx(item.created_at + 120)
    queue.close()


def test_pair_items_carry_the_tokens_that_become_preference_rows(engine, tmp_path):
    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    workflow = HumanFeedbackWorkflow(_no_reward, ask="pair", queue=str(tmp_path / "elsewhere.db"))
    assert workflow.url == url  # a path means a SQLite file there
    experiences = asyncio.run(workflow.run(_task(4), engine))
    with pytest.raises(ValueError, match="repeat=3: set tasks.train.repeat to an even number"):
        asyncio.run(workflow.run(_task(3), engine))
    workflow.close()
    queue = AnnotationQueue(url)
    items = {i.id: i for i in queue.items()}
    assert len(items) == 2  # responses 0-1 and 2-3; the odd task posted nothing
    for a, b in (experiences[0:2], experiences[2:4]):
        item = items[a.info["annotation_item"]]
        assert b.info["annotation_item"] == item.id and item.kind == "pair"
        assert item.meta["prompt_tokens"] == a.tokens[: a.prompt_length]
        assert [r["experience_id"] for r in item.responses] == [a.id, b.id]
        assert [r["tokens"] for r in item.responses] == [a.response_tokens, b.response_tokens]
    queue.close()


def test_answers_land_as_rewards_of_the_pending_experiences_and_as_preference_rows(engine, tmp_path):
    db = f"sqlite:///{tmp_path / 'buffer.db'}"
    buffer, preferences = SQLBuffer(db), SQLBuffer(db, table="preferences")
    rate = HumanFeedbackWorkflow(_no_reward, scale=[0, 10], run_dir=str(tmp_path))
    pair = HumanFeedbackWorkflow(_no_reward, ask="pair", run_dir=str(tmp_path))
    rated = asyncio.run(rate.run(_task(2, 1), engine))
    paired = asyncio.run(pair.run(_task(2, 2), engine))
    buffer.put(rated + paired)
    queue = AnnotationQueue(queue_url(tmp_path))
    claimed = queue.claim("ann", 10)
    answers = {i.id: {"rating": 7} if i.kind == "rate" else {"choice": "b"} for i in claimed}
    queue.answer("ann", answers)
    counts = land(queue, buffer, preferences)
    assert counts["rated"] == 2 and counts["pairs"] == 1 and counts["preferences"] == 2
    got = {e.id: e.reward for e in buffer.get(4, timeout=1)}
    assert got == {rated[0].id: 7.0, rated[1].id: 7.0, paired[0].id: 0.0, paired[1].id: 1.0}
    rows = preferences.get(2, timeout=1)
    chosen = next(r for r in rows if r.info["chosen"])
    assert chosen.tokens == paired[1].tokens and chosen.kind == "preference"
    for thing in (rate, pair, queue, buffer, preferences):
        thing.close()


def _config(tmp_path, tiny_model_dir, **over):
    data = {
        "tasks": {"batch_size": 2, "total_steps": 2, "train": {"workflow": "human_feedback", "repeat": 2}},
        "buffer": {"storage": "sql"},
    }
    path = write_arithmetic_config(tmp_path, tiny_model_dir, "cfg", data, over)
    return load_config(path)


def test_validate_names_every_human_feedback_problem_at_once(tmp_path, tiny_model_dir):
    [cfg] = _config(tmp_path, tiny_model_dir)  # a SQL buffer, an even repeat: fine
    assert cfg.tasks.train.workflow == "human_feedback"
    data = yaml_of(tmp_path / "cfg.yaml")
    data["buffer"] = {"storage": "memory", "pending_timeout": 60}
    data["tasks"]["train"].update(repeat=3, workflow_args={"ask": "pair", "timeout": 120})
    data["tasks"]["eval"] = [{**data["tasks"]["train"], "name": "people"}]
    _, errors = validate_dict(data)
    text = " ".join(errors)
    assert "buffer.storage 'memory' lives in this process only: set buffer.storage: sql" in text
    assert "tasks.train.repeat=3 with workflow_args.ask: pair" in text
    assert "buffer.pending_timeout=60.0 gives up on a pending experience" in text
    assert "tasks.eval.0.workflow 'human_feedback' leaves rewards to people" in text
    data["tasks"]["train"]["workflow_args"] = {"ask": "both", "scale": [5, 1]}
    _, errors = validate_dict(data)
    assert "ask='both'; expected one of ['rate', 'pair']" in errors[0] and "scale=[5, 1]" in errors[0]
    data["tasks"]["train"]["workflow_args"] = {"run_dir": "x"}
    _, errors = validate_dict(data)
    assert "workflow_args['run_dir'] is passed to workflow 'human_feedback' by trine itself" in errors[0]


def test_the_wiring_gives_the_run_directory_only_to_workflows_that_take_it(tmp_path):
    data = str(EXAMPLE / "data" / "train.jsonl")
    people = TasksetConfig(path=data, workflow="human_feedback")
    assert _run_dir_args(people, tmp_path / "run") == {"run_dir": str((tmp_path / "run").absolute())}
    assert _run_dir_args(TasksetConfig(path=data), tmp_path) == {}
    assert _run_dir_args(people, None) == {}


def yaml_of(path):
    import yaml

    return yaml.safe_load(path.read_text())


# ------------------------------------------------------------------ mode train on a buffer


def _pairs(tokenizer, n: int) -> list:
    tasks = [
        Task(task_id=f"p{i}", question=f"{i}+1=", raw={"good": str(i + 1), "bad": "x"}) for i in range(n)
    ]
    return preference_experiences(tasks, tokenizer, "good", "bad")


def test_buffer_source_takes_whole_pairs_and_ends_when_the_buffer_runs_dry(tokenizer, tmp_path):
    from trine.buffer.sampling import SamplingRules

    db = f"sqlite:///{tmp_path / 'buffer.db'}"
    rows = _pairs(tokenizer, 3)
    store = SQLBuffer(db, table="preferences")
    for i in range(0, 6, 2):
        store.put(rows[i : i + 2])
    pairs = SQLBuffer(db, table="preferences", rules=SamplingRules(whole_groups=True), rewind="reads")
    source = BufferSource(pairs, rows=2, timeout=0.3, pairwise=True)
    batch, metrics = source.next_batch(0, 0)
    assert [e.id for e in batch] == [rows[0].id, rows[1].id] and metrics["buffer/size"] == 4
    assert source.more() and source.ahead is not None  # pair 2 fetched ahead
    state = json.loads(json.dumps(source.state_dict()))  # a checkpoint (and JSON-able)
    again = BufferSource(
        SQLBuffer(db, table="preferences", rules=SamplingRules(whole_groups=True), rewind="reads"),
        2,
        0.3,
        True,
    )
    again.load_state_dict(state)
    assert [e.id for e in again.next_batch(1, 1)[0]] == [rows[2].id, rows[3].id]  # the batch fetched ahead
    assert again.more() and [e.id for e in again.next_batch(2, 2)[0]] == [rows[4].id, rows[5].id]
    assert not again.more() and "no batch of 2 rows within buffer.get_timeout=0.3s" in again.ended
    assert again.next_batch(3, 3) is None


def test_buffer_source_refuses_rollouts_for_pairs_and_names_an_empty_table(tokenizer, tmp_path):
    db = f"sqlite:///{tmp_path / 'buffer.db'}"
    rollouts = _pairs(tokenizer, 1)
    for e in rollouts:
        e.kind = "rollout"
    SQLBuffer(db).put(rollouts)
    with pytest.raises(ValueError, match="rows of kind \\['rollout'\\]; point buffer.storage_args.table"):
        BufferSource(SQLBuffer(db), 2, 0.2, pairwise=True).next_batch(0, 0)
    with pytest.raises(TimeoutError, match="table 'preferences'"):
        BufferSource(SQLBuffer(db, table="preferences"), 2, 0.2, pairwise=True).next_batch(0, 0)


@pytest.mark.slow
def test_dpo_on_the_preferences_table_ends_with_the_rows_and_resumes_without_training_one_twice(
    tiny_model_dir, tokenizer, tmp_path
):
    db = tmp_path / "source.db"
    rows = _pairs(tokenizer, 3)
    store = SQLBuffer(f"sqlite:///{db}", table="preferences")
    for i in range(0, 6, 2):
        store.put(rows[i : i + 2])
    over = {
        "mode": "train",
        "algorithm": {"name": "dpo"},
        "tasks": {"source": "buffer", "train": None, "batch_size": 1, "total_steps": 10},
        "buffer": {
            "storage": "sql",
            "url": f"sqlite:///{db}",
            "storage_args": {"table": "preferences"},
            "get_timeout": 0.5,
        },
    }
    path = write_arithmetic_config(tmp_path, tiny_model_dir, "dpo", over)
    run(load_config(path, ["stop_after_steps=1"]))
    assert read_status(tmp_path / "dpo")["state"] == "stopped"
    summary = run(load_config(path))
    assert "no batch of 2 rows within buffer.get_timeout=0.5s" in summary["stages"]["main"]["ended"]
    assert read_status(tmp_path / "dpo")["state"] == "finished"
    lines = [json.loads(x) for x in (tmp_path / "dpo" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in lines if "trainer/loss" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]  # three pairs, three steps, then the end
    assert all(r["trainer/batch_size"] == 2.0 for r in steps)
    assert (tmp_path / "dpo" / "checkpoints" / "step_3").is_dir()  # the last step is checkpointed
    import sqlalchemy as sa

    with sa.create_engine(f"sqlite:///{db}").connect() as conn:
        uses = conn.execute(sa.text("SELECT use_count FROM preferences")).scalars().all()
    assert sorted(uses) == [1] * 6  # every row trained once, across the stop and the resume


def test_the_human_feedback_examples_validate():
    for name in ("rate", "pairs", "dpo"):
        [cfg] = load_config(EXAMPLE.parent / "human_feedback" / f"{name}.yaml")
        assert cfg.buffer.storage == "sql"


def test_docs_show_the_example_configs_as_they_are():
    doc = (EXAMPLE.parents[1] / "docs" / "annotation.md").read_text()
    for name in ("rate", "pairs", "dpo"):
        text = (EXAMPLE.parent / "human_feedback" / f"{name}.yaml").read_text().rstrip("\n")
        assert f"```yaml\n{text}\n```" in doc, f"docs/annotation.md shows an old {name}.yaml"


def test_answers_land_in_the_stage_that_explores_not_a_later_dpo_stage(tmp_path):
    """A run that explores with human_feedback and then trains DPO on the preferences table: answers
    land in the exploring stage's buffer (the DPO stage's buffer is the preferences table itself)."""
    from trine.cli.annotate import exploring_stage

    sql = {"storage": "sql", "url": f"sqlite:///{tmp_path}/buffer.db"}
    stages = [
        {"stage": "warmup", "tasks": {"train": {"workflow": "single_turn"}}, "buffer": {"storage": "memory"}},
        {"stage": "ask", "tasks": {"train": {"workflow": "human_feedback"}}, "buffer": sql},
        {"stage": "dpo", "mode": "train", "tasks": {"source": "buffer", "train": None},
         "buffer": {**sql, "storage_args": {"table": "preferences"}}},
    ]  # fmt: skip
    write_config(tmp_path / "config.yaml", stages=stages)
    assert exploring_stage(tmp_path) == "ask"
    write_config(tmp_path / "config.yaml", name="one", buffer=sql)
    assert exploring_stage(tmp_path) is None  # a single-stage run: its only stage
