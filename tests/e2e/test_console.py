"""The console tells the story of a run in every mode (issue 23, item 5): what the run is doing before its
first step line, no third-party deprecation warning, a reward on every trainer's step line (also where the
explorer is another process), a line per explored batch from explorer processes, and a summary table that
is never empty, as real ``trine`` commands print them."""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.helpers import EXAMPLE, trine_process, write_arithmetic_config

pytestmark = pytest.mark.slow

CONSOLE = {"num_threads": 1, "monitor": {"sinks": ["console", "jsonl"], "plot": False}}


def trine_lines(*args: str, timeout: float = 240) -> list[tuple[float, str]]:
    """Run ``trine ARGS`` and return each line of its output (stdout and stderr) with the seconds since
    the start at which it arrived; asserts exit code 0."""
    start = time.monotonic()
    proc = trine_process(*args, unbuffered=True)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append((time.monotonic() - start, line.rstrip("\n")))
        assert time.monotonic() - start < timeout, "\n".join(text for _, text in lines)
    proc.wait(timeout=60)
    assert proc.returncode == 0, "\n".join(text for _, text in lines)
    return lines


def first(lines: list[tuple[float, str]], pattern: str) -> int:
    """Index of the first line containing ``pattern``."""
    found = [i for i, (_, text) in enumerate(lines) if pattern in text]
    assert found, f"no line with {pattern!r} in:\n" + "\n".join(text for _, text in lines)
    return found[0]


def test_a_run_says_what_it_does_before_its_first_step_and_sums_up_stages_without_eval(
    tmp_path, tiny_model_dir
):
    """Stage ``a`` evaluates at its start (the console says so first), stage ``b`` has no eval taskset: its
    summary rows are its reward, loss and steps."""
    rows = (EXAMPLE / "data" / "eval.jsonl").read_text().splitlines()[:4]
    (tmp_path / "small.jsonl").write_text("\n".join(rows) + "\n")
    small = {"name": "small", "path": str(tmp_path / "small.jsonl"), "sampling": {"max_tokens": 4}}
    config = write_arithmetic_config(
        tmp_path,
        tiny_model_dir,
        "story",
        CONSOLE,
        {
            "tasks": {"total_steps": 3, "eval": [small]},
            "eval": {"at_start": True, "every": 0, "k": 2},
            "stages": [{"stage": "a"}, {"stage": "b", "tasks": {"eval": []}, "eval": {"at_start": False}}],
        },
    )
    lines = trine_lines("run", str(config))
    text = "\n".join(line for _, line in lines)
    assert "FutureWarning" not in text and "deprecated" not in text, text
    order = [
        first(lines, f"run story: a (sync, 3 steps) → b (sync, 3 steps) in {tmp_path / 'story'}"),
        first(lines, f"loading model {tiny_model_dir} on cpu ..."),
        first(lines, "[a] stage 1/2: mode sync, building ..."),
        first(lines, "[a] evaluating step 0 on small (4 tasks × 2 samples + greedy) ..."),
        first(lines, "[a] step 0/6 | small/acc"),
        first(lines, "[a] step 1/6 | reward "),
        first(lines, "[b] stage 2/2: mode sync, building ..."),
        first(lines, "[b] step 6/6 | reward "),
        first(lines, "Trine run summary"),
    ]
    assert order == sorted(order), text
    assert not [t for _, t in lines[: order[0]] if "Warning" in t], text  # nothing third-party comes first
    table = text[text.index("Trine run summary") :]
    assert "eval/small/accuracy" in table and "reward (mean of 1 step)" in table and "steps" in table, table
    assert not re.search(r"│\s+-\s+│", table.split("│ b")[1]), table  # stage b's rows are all filled
    assert lines[-1][1] == f"run directory: {tmp_path / 'story'}", text


def test_processes_trainer_lines_show_the_trained_reward_and_explorers_a_line_per_batch(
    tmp_path, tiny_model_dir
):
    """``launch: processes``: the trainer has no explorer metrics, so its step lines show the reward of the
    batch it trained on (``trainer/reward_mean``); the explorer process prints one line per batch; the
    trainer ends with the summary table."""
    config = write_arithmetic_config(
        tmp_path,
        tiny_model_dir,
        "procs",
        CONSOLE,
        {
            "mode": "async",
            "launch": "processes",
            "tasks": {"batch_size": 2, "total_steps": 3, "train": {"repeat": 2}},
            "buffer": {"storage": "sql", "max_staleness": 1},
            "sync": {"wait_timeout": 120},
        },
    )
    lines = trine_lines("run", str(config))
    text = "\n".join(line for _, line in lines)
    steps = [line for _, line in lines if line.startswith("[main] step ")]
    assert len(steps) == 3 and all(" | reward " in line for line in steps), text
    trained = [
        json.loads(row)["trainer/reward_mean"]
        for row in (tmp_path / "procs" / "metrics.jsonl").read_text().splitlines()
        if "trainer/loss" in row
    ]
    assert len(trained) == 3 and all(0.0 <= r <= 1.0 for r in trained)
    batches = [line for _, line in lines if line.startswith("explorer-0 batch ")]
    assert batches and batches[0].startswith("explorer-0 batch 1 | weights v0 | reward "), text
    assert all(" | time " in line for line in batches), text
    assert "reward (mean of 1 step)" in text and f"run directory: {tmp_path / 'procs'}" in text, text
