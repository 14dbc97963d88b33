"""The run's alarms end to end (trine.monitor.alarms): a reward that pays for length (a deliberately
hackable one) on a model whose answers run to max_tokens raises the ``truncation`` and ``length`` alarms,
once each, printed with their numbers, kept in status.json and shown by `trine status`; the same run with
the alarms turned off raises none."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.helpers import run_dir_of, trine_run
from trine.cli import app

HACKABLE = '''
from trine import register


@register("reward", "length_fraction")
def length_fraction(response, task):
    """Pays for length: the longer the answer, the more (what a partial-credit reward can turn into)."""
    return min(1.0, len(response) / 40)
'''


def test_a_length_paying_reward_raises_the_truncation_and_length_alarms(tmp_path, arithmetic_config):
    plugin = tmp_path / "hackable.py"
    plugin.write_text(HACKABLE)
    train = {"reward": "length_fraction", "sampling": {"temperature": 1.0, "max_tokens": 6}}
    alarms = {"window": 2, "truncation": 0.9, "length": 0.95}
    config = arithmetic_config(
        {"tasks": {"total_steps": 4, "train": train}, "monitor": {"alarms": alarms}}, name="hacked"
    )
    proc, _ = trine_run(config, plugin)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    printed = [line for line in proc.stdout.splitlines() if line.startswith("ALARM ")]
    assert len(printed) == 2, proc.stdout  # each alarm once, though every later step still qualifies
    assert any("of responses were cut at max_tokens over the last 2 steps" in line for line in printed)

    status = json.loads((run_dir_of(config) / "status.json").read_text())
    assert status["state"] == "finished"
    by_kind = {a["kind"]: a for a in status["alarms"]}
    assert set(by_kind) == {"truncation", "length"}
    assert by_kind["truncation"]["step"] == 2 and by_kind["truncation"]["numbers"]["threshold"] == 0.9
    assert by_kind["length"]["numbers"]["max_tokens"] == 6.0
    assert by_kind["length"]["numbers"]["explorer/response_length_mean"] >= 0.95 * 6

    shown = CliRunner().invoke(app, ["status", str(run_dir_of(config))])
    assert shown.exit_code == 0, shown.output
    assert "ALARM truncation at step 2: truncation: " in shown.output
    assert "ALARM length at step 2: length: responses averaged " in shown.output

    quiet = arithmetic_config(
        {"tasks": {"total_steps": 2, "train": train}, "monitor": {"alarms": {"enabled": False}}}, name="quiet"
    )
    proc, _ = trine_run(quiet, plugin)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ALARM" not in proc.stdout
    assert "alarms" not in json.loads((run_dir_of(quiet) / "status.json").read_text())
