"""Alerts (trine.monitor.alerts) against real local receivers: an HTTP server in a thread that records what
it gets, a closed port, one that accepts and never answers, and commands; the config's checks."""

from __future__ import annotations

import json
import sys
import time

import pytest

from tests.helpers import Receiver, closed_port, silent_server
from trine.config import load_yaml
from trine.config.learn import MonitorConfig
from trine.config.watch import AlertsConfig
from trine.monitor.alerts import QUEUE_SIZE, Alerts


def alerts(tmp_path, **settings) -> Alerts:
    return Alerts(AlertsConfig(**settings), "demo", tmp_path)


def test_each_event_is_posted_as_json_with_the_run_step_and_reason(tmp_path, receiver):
    a = alerts(tmp_path, url=receiver.url)
    assert a.send("stuck", "step 3 has not advanced for 640s", step=3, stage="grpo", stuck={"seconds": 640})
    assert a.send("finished", "finished", step=6, stage="grpo")
    assert not a.send("stopped", "Ctrl-C", step=6), "not in monitor.alerts.on by default"
    a.close()
    assert receiver.types == ["application/json"] * 2
    first, second = receiver.got
    assert {k: first[k] for k in ("event", "run", "run_dir", "stage", "step", "reason", "stuck")} == {
        "event": "stuck",
        "run": "demo",
        "run_dir": str(tmp_path.resolve()),
        "stage": "grpo",
        "step": 3,
        "reason": "step 3 has not advanced for 640s",
        "stuck": {"seconds": 640},
    }
    assert {"time", "host", "pid"} <= set(first) and second["event"] == "finished"
    assert (a.sent, a.failures, a.dropped) == (2, 0, 0)


def test_nothing_is_sent_without_a_destination_or_after_close(tmp_path, receiver):
    assert not alerts(tmp_path).send("failed", "boom", step=1)
    a = alerts(tmp_path, url=receiver.url)
    a.close()
    assert not a.send("failed", "boom", step=1) and receiver.got == []


def test_a_receiver_that_is_down_or_hangs_costs_the_run_nothing_and_at_most_the_timeout_at_close(
    tmp_path, caplog
):
    down = alerts(tmp_path, url=closed_port(), timeout_seconds=1.0)
    start = time.monotonic()
    for step in range(5):
        down.send("alarm", "truncation", step=step)
    down.close()
    assert time.monotonic() - start < 1.5
    assert down.failures == 5 and down.sent == 0
    failed = [r for r in caplog.records if "failed" in r.getMessage()]
    assert len(failed) == 1, "logged once, then counted"
    assert "ConnectionRefusedError" in failed[0].getMessage() or "Errno" in failed[0].getMessage()

    with silent_server() as url:
        slow = alerts(tmp_path, url=url, timeout_seconds=1.0)
        start = time.monotonic()
        for step in range(10):  # each delivery would take the whole timeout
            assert slow.send("alarm", "length", step=step)
        assert time.monotonic() - start < 0.2, "send never waits for the receiver"
        slow.close()
        assert time.monotonic() - start < 2.0, "close waits at most timeout_seconds, however many are queued"


def test_a_full_queue_drops_and_counts(tmp_path):
    with silent_server() as url:
        a = alerts(tmp_path, url=url, timeout_seconds=5.0)
        results = [a.send("alarm", "x", step=i) for i in range(QUEUE_SIZE + 10)]
        assert results.count(False) >= 9 and a.dropped == results.count(False)
        a.close(timeout=0.1)


def test_an_http_error_status_is_a_failure(tmp_path):
    r = Receiver(status=500)
    try:
        a = alerts(tmp_path, url=r.url)
        a.send("failed", "boom", step=1)
        a.close()
        assert a.failures == 1 and len(r.got) == 1
    finally:
        r.close()


def test_a_command_gets_the_json_on_stdin_and_the_fields_in_its_environment(tmp_path):
    out = tmp_path / "got.json"
    script = (
        "import json, os, sys; alert = json.load(sys.stdin); "
        "alert['env'] = {k: v for k, v in os.environ.items() if k.startswith('TRINE_ALERT_')}; "
        f"open({str(out)!r}, 'w').write(json.dumps(alert))"
    )
    a = alerts(tmp_path, command=[sys.executable, "-c", script])
    a.send("failed", "RuntimeError: boom", step=4, stage="sft")
    a.close()
    got = json.loads(out.read_text())
    assert got["event"] == "failed" and got["reason"] == "RuntimeError: boom"
    assert got["env"] == {
        "TRINE_ALERT_EVENT": "failed",
        "TRINE_ALERT_RUN": "demo",
        "TRINE_ALERT_RUN_DIR": str(tmp_path.resolve()),
        "TRINE_ALERT_STAGE": "sft",
        "TRINE_ALERT_STEP": "4",
        "TRINE_ALERT_REASON": "RuntimeError: boom",
    }
    shell = alerts(tmp_path, command=f"cat > {tmp_path / 'shell.json'}")
    shell.send("finished", "finished", step=6)
    shell.close()
    assert json.loads((tmp_path / "shell.json").read_text())["event"] == "finished"


def test_a_command_that_fails_or_hangs_is_counted_and_killed(tmp_path):
    a = alerts(tmp_path, command="echo nope >&2; exit 3", timeout_seconds=1.0)
    a.send("failed", "boom", step=1)
    a.close()
    assert a.failures == 1
    start = time.monotonic()
    b = alerts(tmp_path, command="sleep 30", timeout_seconds=0.5)
    b.send("failed", "boom", step=1)
    b.close(timeout=3.0)
    assert b.failures == 1 and time.monotonic() - start < 2.5, "killed with its process group at the timeout"


# ------------------------------------------------------------------ the config


def monitor(text: str) -> MonitorConfig:
    return MonitorConfig.model_validate(load_yaml(text))


def test_the_config_reads_a_bare_yaml_on_and_checks_url_command_and_events():
    got = monitor("alerts: {url: 'https://hooks.example.com/x', on: [failed, stopped]}").alerts
    assert got.on == ["failed", "stopped"] and got.timeout_seconds == 5.0
    assert monitor("alerts: {command: notify-send}").alerts.on == ["failed", "stuck", "finished", "alarm"]
    bad = {
        "alerts: {url: 'ftp://host/x'}": "'ftp://host/x' is not an http:// or https:// URL with a host",
        "alerts: {url: 'http:///nohost'}": "is not an http:// or https:// URL with a host",
        "alerts: {url: 'http://h', on: []}": "no event listed: no alert would ever be sent",
        "alerts: {on: [failed, finish, hacked]}": "unknown event(s) 'finish', 'hacked'; the events are failed, "
        "stuck, finished, stopped, alarm",
        "alerts: {command: ''}": "the command is empty",
        "alerts: {timeout_seconds: 0}": "greater than 0",
        "stuck_after: 1": "greater than 1",
    }
    for text, message in bad.items():
        with pytest.raises(ValueError, match=None) as err:
            monitor(text)
        assert message in str(err.value), text
