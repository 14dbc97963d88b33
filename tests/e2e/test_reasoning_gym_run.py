"""A run on a reasoning-gym generator, offline: ``generator: reasoning_gym`` makes the tasks (train and eval,
no data file), ``reward: reasoning_gym`` scores every response with the generator's own ``score_answer``."""

from __future__ import annotations

import json

import pytest

from tests.helpers import step_metrics, write_config
from trine.config import load_config
from trine.loop import run

rg = pytest.importorskip("reasoning_gym", reason='reasoning-gym is not installed (pip install -e ".[envs]")')

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_run_on_a_reasoning_gym_generator_is_rewarded_by_its_score_answer(tmp_path, tiny_model_dir):
    from trine.rewards.reasoning_gym import final_answer

    taskset = {
        "generator": "reasoning_gym",
        "generator_args": {"dataset": "leg_counting", "size": 16, "min_animals": 1, "max_animals": 2},
        "reward": "reasoning_gym",
        "reward_args": {"extract": "last_line"},  # a tiny untrained model writes no <answer> tags
        "repeat": 2,
        "sampling": {"max_tokens": 6},
    }
    cfg = {
        "name": "rg",
        "run_dir": str(tmp_path / "rg"),
        "seed": 0,
        "num_threads": 1,
        "model": {"path": str(tiny_model_dir)},
        "tasks": {
            "batch_size": 2,
            "total_steps": 3,
            "train": taskset,
            "eval": [
                {**taskset, "name": "held_out", "generator_args": {"dataset": "leg_counting", "size": 4}}
            ],
        },
        "trainer": {"lr": 1e-3},
        "eval": {"at_start": True, "every": 3},
        "explorer": {"dump_rollouts": True},
        "monitor": {"sinks": ["jsonl"], "plot": False},
    }
    run(load_config(write_config(tmp_path / "rg.yaml", cfg)))

    metrics = step_metrics(tmp_path / "rg")
    assert len(metrics) == 3 and all("explorer/reward/_exact" in m for m in metrics), metrics[-1]
    rows = [json.loads(line) for line in (tmp_path / "rg" / "rollouts.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["task_id"].startswith("train/")]
    assert len(train) == 6 and not any(r["skipped"] for r in train)
    scorer = rg.get_score_answer_fn("leg_counting")
    entries = {
        f"train/{i}": e for i, e in enumerate(rg.create_dataset("leg_counting", **_args(taskset, "train")))
    }
    for row in train:
        entry = json.loads(json.dumps(entries[row["task_id"]], default=list))
        assert row["question"] == entry["question"] and row["answer"] == entry["answer"]
        for response in row["responses"]:  # the reward is reasoning-gym's score of the last line
            answer = final_answer(response["text"], "last_line")
            assert response["reward"] == pytest.approx(scorer(answer, entry)), response
            assert set(response["parts"]) == {"score", "_exact"}
    evals = [json.loads(line) for line in (tmp_path / "rg" / "metrics.jsonl").read_text().splitlines()]
    assert any("eval/held_out/accuracy" in m for m in evals)


def _args(taskset: dict, name: str) -> dict:
    """The reasoning-gym arguments the taskset called ``name`` built its rows with (its seed hashed from the
    name, as :func:`trine.tasks.generators.default_seed` does)."""
    from trine.tasks.generators import default_seed

    args = {k: v for k, v in taskset["generator_args"].items() if k != "dataset"}
    return {**args, "seed": default_seed(name)}
