"""Mode serve's wiring (:mod:`trine.launch.serve`): new published weights reach the server, one server of a
run reloads at a time, and bad serve settings are refused before anything starts."""

from __future__ import annotations

import threading
import time

import pytest

from tests.helpers import WeightsChecker, filled_model, write_arithmetic_config
from trine.config import ConfigError, load_config
from trine.launch.processes import ProcessSetupError
from trine.launch.serve import WeightsWatcher, settings_of
from trine.sync import PublishedWeights

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _watcher(run_dir, reports=None) -> tuple[WeightsWatcher, WeightsChecker]:
    keys = list(filled_model(0.0).state_dict())
    engine = WeightsChecker(keys)
    report = None if reports is None else (lambda: reports.append(engine.policy_version))
    return WeightsWatcher(PublishedWeights(run_dir / "weights"), engine, run_dir, 0.05, report, 0.1), engine


def test_the_newest_published_version_is_loaded_and_only_once(tmp_path):
    trainer = PublishedWeights(tmp_path / "weights")
    watcher, engine = _watcher(tmp_path)
    assert watcher.check() is False  # nothing published: keep serving the loaded model
    trainer.push(filled_model(1.0), 1)
    trainer.push(filled_model(2.0), 2)
    assert watcher.check() is True and engine.policy_version == 2 and engine.loaded == [2]  # straight to 2
    assert watcher.check() is False and watcher.loads == 1
    watcher.close()


def test_the_watcher_thread_picks_up_weights_while_serving_and_reports(tmp_path):
    trainer, reports = PublishedWeights(tmp_path / "weights"), []
    watcher, engine = _watcher(tmp_path, reports)
    watcher.start()
    trainer.push(filled_model(3.0), 3)
    deadline = time.monotonic() + 10
    while engine.policy_version != 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)
    watcher.close()
    assert engine.loaded == [3] and watcher.error is None
    assert reports and reports[-1] == 3  # the counters were logged while it ran, and once at the end


def test_servers_of_one_run_reload_one_at_a_time(tmp_path):
    """While one server loads (holds the run's reload lock), another's load waits: some server answers."""
    PublishedWeights(tmp_path / "weights").push(filled_model(1.0), 1)
    first, _ = _watcher(tmp_path)
    second, engine = _watcher(tmp_path)
    done = threading.Event()
    with first._turn():  # the first server is loading
        worker = threading.Thread(target=lambda: (second.check(), done.set()))
        worker.start()
        assert not done.wait(0.5) and engine.policy_version == 0  # the second waits its turn
    assert done.wait(10) and engine.policy_version == 1
    worker.join()


def test_serve_settings_come_from_the_config_and_name_a_missing_token(tmp_path, tiny_model_dir, monkeypatch):
    path = write_arithmetic_config(
        tmp_path,
        tiny_model_dir,
        "serve",
        {"serve": {"api_key_env": "TRINE_TEST_SERVE_KEY", "max_tokens": 64, "default_max_tokens": 32}},
    )
    (cfg,) = load_config(path)
    monkeypatch.delenv("TRINE_TEST_SERVE_KEY", raising=False)
    with pytest.raises(ProcessSetupError, match="TRINE_TEST_SERVE_KEY.*not set"):
        settings_of(cfg, 512)
    monkeypatch.setenv("TRINE_TEST_SERVE_KEY", "s3cret")
    settings = settings_of(cfg, 512)
    assert settings.api_key == "s3cret" and settings.model_name == cfg.name
    assert settings.max_prompt_tokens == 512 - 64 and settings.default_max_tokens == 32


@pytest.mark.parametrize(
    ("serve", "words"),
    [
        ({"port": 70000}, "serve.port: 70000 is out of range; expected an integer >= 0 and <= 65535"),
        (
            {"max_tokens": 16, "default_max_tokens": 32},
            "serve.default_max_tokens=32 is above serve.max_tokens=16",
        ),
    ],
)
def test_bad_serve_settings_are_config_errors(serve, words, tmp_path, tiny_model_dir):
    path = write_arithmetic_config(tmp_path, tiny_model_dir, "bad", {"serve": serve})
    with pytest.raises(ConfigError, match=words.replace(".", r"\.")):
        load_config(path)
