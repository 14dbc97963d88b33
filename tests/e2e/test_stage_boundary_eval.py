"""One evaluation of the same weights at a stage boundary (issue 26 item 3): the last step of stage ``a`` is
evaluated, and stage ``b`` starts from those weights on the same eval tasks, so it reuses that evaluation
instead of giving the summary a second, different number; a stage with other eval settings evaluates."""

from __future__ import annotations

import pytest

from tests.helpers import EXAMPLE, read_metrics, write_arithmetic_config
from trine.config import load_config
from trine.loop import run

pytestmark = pytest.mark.slow


def test_the_next_stage_starts_from_the_previous_stages_last_evaluation(tmp_path, tiny_model_dir, capsys):
    rows = (EXAMPLE / "data" / "eval.jsonl").read_text().splitlines()[:4]
    (tmp_path / "small.jsonl").write_text("\n".join(rows) + "\n")
    small = {"name": "small", "path": str(tmp_path / "small.jsonl"), "sampling": {"max_tokens": 4}}
    config = write_arithmetic_config(
        tmp_path,
        tiny_model_dir,
        "boundary",
        {
            "tasks": {"total_steps": 2, "eval": [small]},
            "eval": {"at_start": True, "every": 0, "k": 2},
            "stages": [{"stage": "a"}, {"stage": "b"}, {"stage": "c", "eval": {"k": 3}}],
        },
    )
    summary = run(load_config(config))
    stages = summary["stages"]
    assert stages["b"]["eval_start"] == stages["a"]["eval_end"]  # the same weights: the same numbers
    assert "eval/small/avg@3" in stages["c"]["eval_start"]  # other settings: evaluated anew
    printed = capsys.readouterr().out
    assert "[b] reusing the evaluation of step 2 on small" in printed
    assert "[c] evaluating step 4 on small" in printed
    evals = [r["step"] for r in read_metrics(tmp_path / "boundary") if "eval/small/accuracy" in r]
    assert evals == [0, 2, 4, 4, 6]  # step 2 once; step 4 by stage b's end and by stage c's other settings
