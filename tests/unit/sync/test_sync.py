"""Weight sync: StateDictCopy delivers exactly the requested version; pulls wait for pushes."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from trine.models import load_model, load_tokenizer
from trine.models.engine import HFEngine
from trine.sync import SharedWeights, StateDictCopy

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def models(tiny_model_dir):
    """(trainer model, explorer engine over a separate copy of the same weights)."""
    trainer_model = load_model(tiny_model_dir)
    engine = HFEngine(load_model(tiny_model_dir), load_tokenizer(tiny_model_dir))
    yield trainer_model, engine
    engine.close()


def _bump(model, amount: float) -> dict[str, torch.Tensor]:
    """Change every weight in place; returns a snapshot of the new state."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(amount)
    return {k: v.clone() for k, v in model.state_dict().items()}


def _assert_weights(model, expected: dict[str, torch.Tensor]) -> None:
    state = model.state_dict()
    assert state.keys() == expected.keys()
    for key, value in expected.items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=0, msg=key)


def test_pull_loads_exactly_the_requested_version(models):
    trainer_model, engine = models
    v1 = _bump(trainer_model, 0.01)
    sync = StateDictCopy()
    sync.push(trainer_model, 1)
    v2 = _bump(trainer_model, 0.02)  # changing the trainer's weights must not change pushed copies
    sync.push(trainer_model, 2)
    _bump(trainer_model, 0.04)
    sync.push(trainer_model, 3)

    sync.pull(engine, 1, timeout=1.0)
    assert engine.policy_version == 1
    _assert_weights(engine.model, v1)
    assert engine.model is not trainer_model
    assert not torch.equal(engine.model.lm_head.weight, trainer_model.lm_head.weight)

    sync.pull(engine, 2, timeout=1.0)
    assert engine.policy_version == 2
    _assert_weights(engine.model, v2)
    assert sorted(sync.state_dict()["states"]) == [2, 3]  # older versions were dropped
    assert sync.seconds > 0


def test_a_waiting_pull_is_released_by_a_later_push(models):
    trainer_model, engine = models
    sync = StateDictCopy()
    result: dict[str, object] = {}

    def explorer():
        start = time.monotonic()
        try:
            sync.pull(engine, 1, timeout=10.0)
        except Exception as err:  # surfaced by the assertion below
            result["error"] = err
        result["waited"] = time.monotonic() - start

    thread = threading.Thread(target=explorer)
    thread.start()
    time.sleep(0.2)
    assert thread.is_alive() and engine.policy_version == 0
    expected = _bump(trainer_model, 0.5)
    sync.push(trainer_model, 1)
    thread.join(timeout=10.0)
    assert not thread.is_alive() and "error" not in result
    assert 0.15 < result["waited"] < 9.0
    assert engine.policy_version == 1
    _assert_weights(engine.model, expected)


def test_pull_of_a_version_never_pushed_times_out(models):
    _, engine = models
    sync = StateDictCopy()
    with pytest.raises(TimeoutError, match="version 4"):
        sync.pull(engine, 4, timeout=0.05)


def test_close_releases_a_waiting_pull(models):
    _, engine = models
    sync = StateDictCopy()
    threading.Timer(0.05, sync.close).start()
    with pytest.raises(TimeoutError):
        sync.pull(engine, 1, timeout=10.0)


def test_state_dict_copy_round_trip(models):
    trainer_model, engine = models
    sync = StateDictCopy()
    expected = _bump(trainer_model, 0.1)
    sync.push(trainer_model, 5)
    other = StateDictCopy()
    other.load_state_dict(sync.state_dict())
    other.pull(engine, 5, timeout=0)
    _assert_weights(engine.model, expected)


def test_shared_weights_only_record_versions(models):
    trainer_model, engine = models
    shared = SharedWeights()
    shared.push(trainer_model, 3)
    shared.pull(engine, 3)
    assert shared.version == 3 and engine.policy_version == 3


@pytest.mark.parametrize("offset", [0, 1])
def test_colocated_training_runs_on_the_engine_thread_but_not_beside_a_snapshot(
    tiny_model_dir, tmp_path, offset
):
    """Sync mode trains on the engine's worker (one torch thread); with sync_offset the explorer's
    engine samples a snapshot concurrently, so training must not queue behind it."""
    import threading
    from pathlib import Path

    from trine import build
    from trine.config import validate_dict
    from trine.models import load_model, load_tokenizer

    data = Path(__file__).resolve().parents[3] / "examples" / "arithmetic" / "data" / "train.jsonl"
    (cfg,), errors = validate_dict(
        {
            "model": {"path": str(tiny_model_dir)},
            "tasks": {"batch_size": 2, "total_steps": 1, "train": {"path": str(data)}},
            "sync": {"sync_offset": offset},
        }
    )
    assert not errors, errors
    stage = build.build_stage(cfg, load_model(tiny_model_dir), load_tokenizer(tiny_model_dir), tmp_path)
    stage.trainer.trainer.step = lambda experiences: {"thread": threading.current_thread().name}
    thread = stage.trainer.train([])["thread"]
    assert thread.startswith("trine-engine") if offset == 0 else thread == threading.current_thread().name
