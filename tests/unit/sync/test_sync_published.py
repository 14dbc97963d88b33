"""PublishedWeights: weights published through a directory, read by other processes, kill-safe."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.helpers import WeightsChecker, filled_model
from trine.models import load_model, load_tokenizer
from trine.models.engine import HFEngine
from trine.sync import SYNC_METHODS, PublishedWeights, WeightSync
from trine.sync.published import version_name

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _bump(model: nn.Module, amount: float) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(amount)
    return {k: v.clone() for k, v in model.state_dict().items()}


def _dirs(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_is_a_registered_weight_sync(tmp_path):
    assert SYNC_METHODS["published"] is PublishedWeights
    sync = PublishedWeights(tmp_path / "weights")
    assert isinstance(sync, WeightSync)
    assert sync.latest() is None and sync.state_dict() == {
        "directory": str(tmp_path / "weights"),
        "latest": None,
    }
    with pytest.raises(ValueError, match="keep >= 1"):
        PublishedWeights(tmp_path, keep=0)


def test_push_then_pull_round_trips_tied_weights_exactly_and_rotates(tiny_model_dir, tmp_path):
    trainer_model = load_model(tiny_model_dir)
    engine = HFEngine(load_model(tiny_model_dir), load_tokenizer(tiny_model_dir))
    assert trainer_model.lm_head.weight is trainer_model.model.embed_tokens.weight  # tied
    sync = PublishedWeights(tmp_path / "weights", keep=2)
    try:
        expected = {}
        for version in range(1, 5):
            expected[version] = _bump(trainer_model, 0.01 * version)
            sync.push(trainer_model, version)
        assert _dirs(tmp_path / "weights") == [version_name(3), version_name(4)]  # rotated to keep=2
        meta = json.loads((tmp_path / "weights" / version_name(4) / "meta.json").read_text())
        assert meta["version"] == 4 and meta["aliases"] == {"lm_head.weight": "model.embed_tokens.weight"}
        assert meta["keys"] == list(trainer_model.state_dict())

        sync.pull(engine, 3, timeout=1.0)
        assert engine.policy_version == 3
        state = engine.model.state_dict()
        assert list(state) == list(expected[3])
        for key, value in expected[3].items():
            torch.testing.assert_close(state[key], value, rtol=0, atol=0, msg=key)
        assert engine.model.lm_head.weight is engine.model.model.embed_tokens.weight  # still tied
        assert not torch.equal(engine.model.lm_head.weight, trainer_model.lm_head.weight)

        sync.pull(engine, 1, timeout=1.0)  # retired by rotation: the newest published instead
        assert engine.policy_version == 4
        torch.testing.assert_close(engine.model.lm_head.weight, expected[4]["lm_head.weight"], rtol=0, atol=0)
        assert sync.latest() == 4 and sync.state_dict()["latest"] == 4 and sync.seconds > 0
    finally:
        engine.close()


def test_weights_of_another_model_are_refused_before_anything_is_loaded(tiny_model_dir, tmp_path):
    from trine.models import init_model

    other = init_model("tiny-1m", tmp_path / "other", seed=0)  # another architecture size
    engine = HFEngine(load_model(tiny_model_dir), load_tokenizer(tiny_model_dir))
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    sync = PublishedWeights(tmp_path / "weights")
    try:
        sync.push(load_model(other), 1)
        with pytest.raises(RuntimeError, match=r"shapes differ, sent vs own \(\d+\): .*; unexpected"):
            sync.pull(engine, 1, timeout=1.0)
        assert engine.policy_version == 0
        assert all(torch.equal(v, before[k]) for k, v in engine.model.state_dict().items())  # untouched
    finally:
        engine.close()


def test_republishing_replaces_a_version_and_retires_newer_ones(tmp_path):
    sync = PublishedWeights(tmp_path, keep=3)
    for version in (1, 2, 3, 4):
        sync.push(filled_model(version), version)
    assert sync.published() == [2, 3, 4]
    # A trainer restarted from its step-2 checkpoint publishes 2 again: 3 and 4 belong to the dead run.
    sync.push(filled_model(2), 2)
    assert _dirs(tmp_path) == [version_name(2)]
    checker = WeightsChecker(list(filled_model(0).state_dict()))
    sync.pull(checker, 2, timeout=1.0)
    assert checker.loaded == [2]


def test_pull_waits_for_a_later_push_times_out_clearly_and_is_released_by_close(tmp_path):
    sync = PublishedWeights(tmp_path / "weights", poll_interval=0.02)
    checker = WeightsChecker(list(filled_model(0).state_dict()))
    with pytest.raises(TimeoutError, match=r"version 1 was not published in .*weights within 0.2s.*trainer"):
        sync.pull(checker, 1, timeout=0.2)

    pusher = threading.Timer(0.3, lambda: sync.push(filled_model(1), 1))
    pusher.start()
    start = time.monotonic()
    sync.pull(checker, 1, timeout=10.0)
    pusher.join()
    assert checker.loaded == [1] and 0.25 < time.monotonic() - start < 5

    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            sync.pull(checker, 5, timeout=None)
        except TimeoutError as err:
            errors.append(err)

    thread = threading.Thread(target=waiter)
    thread.start()
    time.sleep(0.1)
    sync.close()
    thread.join(5)
    assert not thread.is_alive() and "closed" in str(errors[0])


def test_wait_for_first_logs_while_waiting_and_times_out(tmp_path, caplog):
    sync = PublishedWeights(tmp_path / "weights", poll_interval=0.02, log_every=0.1)
    with caplog.at_level(logging.INFO, logger="trine"):
        with pytest.raises(TimeoutError, match="first weights version was not published .*within 0.35s"):
            sync.wait_for_first(timeout=0.35)
    waits = [r.getMessage() for r in caplog.records if "waiting for the trainer" in r.getMessage()]
    assert len(waits) >= 2 and str(tmp_path / "weights") in waits[0]
    threading.Timer(0.2, lambda: sync.push(filled_model(3), 3)).start()
    assert sync.wait_for_first(timeout=10.0) == 3


# -- other processes -------------------------------------------------------------------------------

VERSIONS = 20


def _reader(directory: str, ready, done, results) -> None:
    """Until ``done``: load the oldest kept version (the next one retired) and the newest, in a tight
    loop; report (requested, loaded) pairs and errors."""
    torch.set_num_threads(1)
    sync = PublishedWeights(directory, poll_interval=0.005)
    checker = WeightsChecker(list(filled_model(0, size=20_000).state_dict()))
    pulls, scans, errors = [], 0, []
    ready.set()
    while not (done.is_set() and checker.policy_version == VERSIONS):
        try:
            latest = sync.latest()
            scans += 1
            for wanted in () if latest is None else (latest - 1, latest):
                if wanted >= 1 and wanted != checker.policy_version:
                    sync.pull(checker, wanted, timeout=30.0)
                    pulls.append((wanted, checker.policy_version))
        except Exception as err:  # reported to the test, which fails on any
            errors.append(repr(err))
            break
    results.put({"pulls": pulls, "scans": scans, "errors": errors})


def test_a_reader_process_never_sees_a_partial_version(tmp_path):
    ctx = mp.get_context("spawn")
    ready, done, results = ctx.Event(), ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=_reader, args=(str(tmp_path), ready, done, results))
    reader.start()
    try:
        assert ready.wait(60), "the reader process did not start"
        sync = PublishedWeights(tmp_path, keep=2)
        for version in range(1, VERSIONS + 1):
            sync.push(filled_model(version, size=20_000), version)
            if version % 4 == 0:  # re-published (a restarted trainer): replaced under the reader
                sync.push(filled_model(version, size=20_000), version)
            time.sleep(0.03)
        done.set()
        report = results.get(timeout=60)
    finally:
        reader.join(10)
        if reader.is_alive():
            reader.kill()
    assert report["errors"] == []  # and every load was one whole version (WeightsChecker)
    pulls = report["pulls"]
    # the reader ran alongside the writer (a loaded machine slows it: no exact counts)
    assert pulls[-1] == (VERSIONS, VERSIONS) and len(pulls) >= 2 and report["scans"] >= 4
    assert all(loaded >= wanted for wanted, loaded in pulls)  # retired meanwhile: a newer one


def _slow_writer(directory: str) -> None:
    """Publish version 1, then start publishing a big version 2 (killed by the test meanwhile)."""
    sync = PublishedWeights(directory)
    sync.push(filled_model(1), 1)
    sync.push(filled_model(2, size=4_000_000), 2)  # 80 MB: long enough to be killed while writing


def test_a_writer_killed_mid_publish_leaves_no_visible_partial_version(tmp_path):
    ctx = mp.get_context("spawn")
    writer = ctx.Process(target=_slow_writer, args=(str(tmp_path),))
    writer.start()
    tmp = tmp_path / f"{version_name(2)}.tmp"
    deadline = time.monotonic() + 60
    while not (tmp / "model.safetensors").exists() and writer.is_alive() and time.monotonic() < deadline:
        time.sleep(0.001)
    os.kill(writer.pid, signal.SIGKILL)
    writer.join(10)
    assert writer.exitcode == -signal.SIGKILL
    assert tmp.is_dir(), f"the kill missed the write of version 2: {_dirs(tmp_path)}"
    assert _dirs(tmp_path) == [version_name(1), tmp.name]

    sync = PublishedWeights(tmp_path)
    assert sync.latest() == 1
    checker = WeightsChecker(list(filled_model(0).state_dict()))
    sync.pull(checker, 1, timeout=1.0)
    assert checker.loaded == [1]
    sync.push(filled_model(2), 2)  # the restarted trainer: the stale tmp is cleaned up
    assert _dirs(tmp_path) == [version_name(1), version_name(2)]
    sync.pull(checker, 2, timeout=1.0)
    assert checker.loaded == [1, 2]


def test_a_reader_with_a_remote_engine_waits_for_the_version_but_loads_nothing(tmp_path):
    """``load=False`` (``model.engine: openai``: the server loads its own weights)."""
    keys = list(filled_model(0.0).state_dict())
    reader, engine = PublishedWeights(tmp_path, load=False), WeightsChecker(keys)
    with pytest.raises(TimeoutError):
        reader.pull(engine, 1, timeout=0.3)  # not published yet: it still waits
    PublishedWeights(tmp_path).push(filled_model(1.0), 1)
    reader.pull(engine, 1, timeout=5)
    assert engine.loaded == [] and engine.policy_version == 0
