"""The watching settings (trine.config.watch): eval.plateau, monitor.alerts and the stuck rule's keys, as
``trine validate`` reports them: every problem at once, under its key path, naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from trine.config import load_yaml, merge, validate_dict


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "data.jsonl").write_text('{"question": "1+1", "answer": "2"}\n')
    (tmp_path / "model").mkdir()
    return tmp_path


def validated(project: Path, yaml_text: str = "{}") -> tuple[list, list[str]]:
    base = {"model": {"path": "model"}, "tasks": {"train": {"path": "data.jsonl"}, "total_steps": 3}}
    return validate_dict(merge(base, load_yaml(yaml_text)), base_dir=project)


def errors_of(project: Path, yaml_text: str) -> list[str]:
    return validated(project, yaml_text)[1]


def test_the_defaults_watch_for_stuck_and_send_nothing(project):
    (cfg,), errors = validated(project)
    assert not errors
    assert (cfg.monitor.stuck_after, cfg.monitor.stuck_min_seconds) == (10.0, 300.0)
    assert cfg.monitor.alerts.url is None and cfg.monitor.alerts.command is None
    assert cfg.eval.plateau is None


def test_alert_mistakes_are_reported_at_once_under_their_keys(project):
    errors = errors_of(project, "monitor: {alerts: {url: 'ftp://x', on: [failed, finsihed], command: []}}")
    assert sorted(e.split(":")[0] for e in errors) == [
        "monitor.alerts.command",
        "monitor.alerts.on",
        "monitor.alerts.url",
    ]
    on = next(e for e in errors if e.startswith("monitor.alerts.on:"))
    assert on == (
        "monitor.alerts.on: unknown event(s) 'finsihed'; the events are failed, stuck, finished, stopped, alarm"
    )


def test_a_bare_yaml_on_key_is_read_as_on(project):
    (cfg,), errors = validated(project, "monitor:\n  alerts:\n    command: [notify]\n    on: [stuck]\n")
    assert not errors and cfg.monitor.alerts.on == ["stuck"]


def test_plateau_needs_evaluations_during_the_stage_and_an_eval_taskset(project):
    (error,) = errors_of(project, "eval: {plateau: {evals: 2}}")
    assert (
        error
        == "eval: eval.plateau needs evaluations during the stage: set eval.every (e.g. 10), or remove eval.plateau"
    )
    (error,) = errors_of(project, "eval: {every: 5, plateau: {}}")
    assert "tasks.eval lists no eval taskset; add one, or remove eval.plateau" in error
    (error,) = errors_of(project, "eval: {every: 5, plateau: {metric: accuracy}}")
    assert error.startswith("eval.plateau.metric: 'accuracy' is not an eval metric key; expected one such as")
    evals = "tasks: {eval: [{name: sums, path: data.jsonl}]}, "
    assert not errors_of(project, "{" + evals + "eval: {every: 5, plateau: {evals: 2, min_delta: 0.01}}}")
