"""The alarm rules (trine.monitor.alarms) on synthetic metric histories: a hacked run's pattern raises,
a healthy run's does not; the sink raises each alarm once; the heartbeat keeps them in status.json and
``trine status`` prints them."""

from __future__ import annotations

import json

from trine.config.learn import AlarmsConfig
from trine.inspect.report import run_status
from trine.monitor.alarms import (
    AlarmSink,
    check_alarms,
    length_alarm,
    main_eval_key,
    reward_vs_eval_alarm,
    truncation_alarm,
)
from trine.status import Heartbeat

EVAL = "eval/arith/accuracy"


def steps(rewards, start=1, **extra):
    """One history line per reward: ``(step, {"explorer/reward_mean": r, **extra})``."""
    return [(start + i, {"explorer/reward_mean": r, **extra}) for i, r in enumerate(rewards)]


def with_evals(before: float, after: float, rewards: list[float]):
    """An eval at step 0, the training steps, the last one logged with an eval too."""
    history = [(0, {EVAL: before, "eval/arith/pass@8": 0.5})] + steps(rewards)
    history[-1][1][EVAL] = after
    return history


def test_reward_up_while_eval_down_raises_reward_hacking():
    history = with_evals(0.30, 0.05, [0.2, 0.25, 0.3, 0.5, 0.6, 0.7])
    alarm = reward_vs_eval_alarm(history, margin=0.05)
    assert alarm is not None and alarm.kind == "reward_vs_eval" and alarm.step == 6
    assert "reward hacking?" in alarm.message and EVAL in alarm.message and "0.300 to 0.050" in alarm.message
    assert alarm.numbers["eval_before"] == 0.30 and alarm.numbers["eval_after"] == 0.05
    assert abs(alarm.numbers["reward_rise"] - (0.6 - 0.25)) < 1e-9  # last 3 vs first 3


def test_healthy_runs_raise_no_reward_hacking_alarm():
    both_up = with_evals(0.30, 0.50, [0.2, 0.3, 0.4, 0.5])
    reward_flat = with_evals(0.30, 0.10, [0.4, 0.41, 0.4, 0.41])
    small_drop = with_evals(0.30, 0.28, [0.2, 0.3, 0.4, 0.5])
    one_eval = steps([0.1, 0.5, 0.9])
    for history in (both_up, reward_flat, small_drop, one_eval):
        assert reward_vs_eval_alarm(history, margin=0.05) is None


def test_main_eval_metric_is_accuracy_else_avg_else_pass():
    assert main_eval_key({EVAL: 0.1, "eval/arith/avg@8": 0.2}) == EVAL
    assert main_eval_key({"eval/arith/pass@8": 0.2, "eval/arith/avg@8": 0.1}) == "eval/arith/avg@8"
    assert main_eval_key({"explorer/reward_mean": 1.0, "eval/x/accuracy": float("nan")}) is None


def test_truncation_near_one_raises_and_a_few_cut_responses_do_not():
    hacked = steps([0.5] * 6, **{"explorer/truncated_fraction": 0.95})
    alarm = truncation_alarm(hacked, threshold=0.9, window=5)
    assert alarm is not None and alarm.kind == "truncation" and alarm.step == 6
    assert "95%" in alarm.message and alarm.numbers["explorer/truncated_fraction"] == 0.95
    healthy = steps([0.5] * 6, **{"explorer/truncated_fraction": 0.2})
    assert truncation_alarm(healthy, threshold=0.9, window=5) is None
    assert truncation_alarm(hacked[:4], threshold=0.9, window=5) is None  # fewer steps than the window


def test_length_at_max_tokens_raises_only_for_single_turn():
    long = steps([0.5] * 5, **{"explorer/response_length_mean": 15.5})
    alarm = length_alarm(long, max_tokens=16, fraction=0.95, window=5)
    assert alarm is not None and alarm.kind == "length" and "max_tokens=16" in alarm.message
    assert alarm.numbers["explorer/response_length_mean"] == 15.5
    short = steps([0.5] * 5, **{"explorer/response_length_mean": 6.0})
    assert length_alarm(short, max_tokens=16, fraction=0.95, window=5) is None
    multi = steps([0.5] * 5, **{"explorer/response_length_mean": 40.0, "explorer/turns_mean": 3.0})
    assert length_alarm(multi, max_tokens=16, fraction=0.95, window=5) is None


def test_settings_turn_rules_off():
    hacked = steps([0.5] * 5, **{"explorer/truncated_fraction": 1.0, "explorer/response_length_mean": 16.0})
    kinds = [a.kind for a in check_alarms(hacked, AlarmsConfig(), 16)]
    assert kinds == ["truncation", "length"]
    assert check_alarms(hacked, AlarmsConfig(enabled=False), 16) == []
    quiet = AlarmsConfig(truncation=None, length=None)
    assert check_alarms(hacked, quiet, 16) == []


def test_sink_raises_each_alarm_once_per_stage_into_status_json(tmp_path):
    heartbeat = Heartbeat(tmp_path, 0, interval=60)
    seen = []

    def raised(alarm):
        seen.append(alarm)
        heartbeat.alarm(alarm.as_dict())

    sink = AlarmSink({"grpo": (AlarmsConfig(window=2), 16)}, raised)
    for step in range(1, 6):
        sink.log({"stage": "grpo", "explorer/truncated_fraction": 1.0, "explorer/reward_mean": 0.1}, step)
        sink.log({"stage": "other", "explorer/truncated_fraction": 1.0}, step)  # not a watched stage
    assert [(a.kind, a.step) for a in seen] == [("truncation", 2)]
    heartbeat.beat(5)
    record = json.loads((tmp_path / "status.json").read_text())
    assert record["state"] == "running" and record["alarms"][0]["kind"] == "truncation"
    heartbeat.end("finished")
    report = run_status(tmp_path)
    assert report.alarms[0]["step"] == 2
    lines = report.lines()
    assert lines[0].endswith("finished at step 5") and lines[1].startswith("  ALARM truncation at step 2: ")
    assert "100% of responses were cut" in lines[1]
