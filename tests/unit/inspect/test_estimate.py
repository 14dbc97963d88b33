"""`trine plan`'s arithmetic (trine/inspect/estimate.py): pure functions against hand-computed values."""

from __future__ import annotations

import json

import pytest

from trine.inspect.estimate import (
    Cost,
    Options,
    ProcessEstimate,
    RunEstimate,
    Spread,
    StageEstimate,
    enough,
    eval_count,
    fmt_range,
    fmt_seconds,
    per_step,
    report_lines,
    save_count,
    steady_step,
    total,
    warmup_steps,
)


def test_spread_is_the_median_and_the_range_seen():
    s = Spread.of([0.3, 0.1, 0.2, 0.9])
    assert (s.mid, s.low, s.high, s.samples) == (pytest.approx(0.25), 0.1, 0.9, 4)
    assert Spread.of([]) == Spread(0.0, 0.0, 0.0, 0)
    assert Spread.exact(2.0).times(3) == Spread(6.0, 6.0, 6.0, 1)
    assert total([Spread(1, 0.5, 2, 3), Spread(2, 1, 3, 1)]) == Spread(3, 1.5, 5, 1)


def test_per_step_averages_whole_periods_of_sync_interval():
    # sync_interval 3: one step explores 3 batches (2.2 s), the next two only train (0.4 s each)
    seconds = [2.2, 0.4, 0.4, 2.5, 0.4, 0.4, 2.2]  # the trailing partial period is left out
    s = per_step(seconds, period=3)
    assert s.samples == 2
    assert s.low == pytest.approx(3.0 / 3) and s.high == pytest.approx(3.3 / 3)
    assert s.mid == pytest.approx((1.0 + 1.1) / 2)
    assert per_step([0.1, 0.3, 0.2]) == Spread.of([0.1, 0.3, 0.2])
    assert per_step([2.0, 0.5], period=3) == Spread.of([2.0, 0.5])  # no whole period: plain


@pytest.mark.parametrize(
    ("steps", "every", "at_start", "reused", "expected"),
    [
        (500, 0, True, False, 2),  # the main job's sft: the start and the end
        (200, 50, True, True, 4),  # its grpo: 50, 100, 150, 200; the start reuses sft's end
        (200, 50, True, False, 5),
        (7, 3, False, False, 3),  # 3, 6 and the last (7)
        (6, 3, False, False, 2),  # the last falls on the cadence: once
        (0, 5, True, False, 1),
    ],
)
def test_eval_count_follows_the_loops_cadence(steps, every, at_start, reused, expected):
    assert eval_count(steps, every, at_start, reused) == expected


@pytest.mark.parametrize(("steps", "every", "expected"), [(500, 0, 1), (10, 5, 2), (11, 5, 3), (0, 5, 0)])
def test_save_count_is_the_cadence_plus_the_last_step(steps, every, expected):
    assert save_count(steps, every) == expected


def test_an_async_step_is_never_faster_than_its_busiest_side():
    coupled = Spread(0.5, 0.4, 0.7, 3)  # steps came fast: the buffer's head start
    trainer = Spread(0.6, 0.55, 0.65, 3)
    explorer = Spread(0.8, 0.7, 0.9, 2)
    assert steady_step(coupled, trainer, explorer) == Spread(0.8, 0.7, 0.9, 3)
    assert steady_step(Spread(1.0, 0.9, 1.1, 3), trainer) == Spread(1.0, 0.9, 1.1, 3)
    assert steady_step(coupled, Spread.of([])) == coupled  # a side with no sample bounds nothing


def _main_job() -> RunEstimate:
    """The main job's shape with round numbers: 500 SFT steps, 200 GRPO steps, evaluations and checkpoints."""
    sft = StageEstimate(
        "sft", "train", "inline", 500, 1, 20,
        [
            Cost("build", Spread.exact(0.1), 1),
            Cost("first 1 step (warm-up)", Spread.exact(0.2), 1),
            Cost("step", Spread(0.03, 0.02, 0.05, 20), 499),
            Cost("training step", Spread(0.028, 0.02, 0.04, 20), 500, counted=False),
            Cost("evaluation", Spread.exact(0.5), eval_count(500, 0, True)),
            Cost("checkpoint", Spread.exact(0.05), save_count(500, 0)),
        ],
        training_tokens_per_second=3000.0, peak_rss_mb=430.0,
    )  # fmt: skip
    grpo = StageEstimate(
        "grpo", "sync", "inline", 200, 1, 10,
        [
            Cost("build", Spread.exact(0.1), 1),
            Cost("first 1 step (warm-up)", Spread.exact(0.3), 1),
            Cost("step", Spread(0.125, 0.12, 0.15, 10), 199),
            Cost("evaluation", Spread.exact(0.25), eval_count(200, 50, True, True)),
            Cost("checkpoint", Spread.exact(0.05), save_count(200, 0)),
        ],
        sampling_tokens_per_second=6000.0, note="responses ran to max_tokens",
    )  # fmt: skip
    return RunEstimate(
        "config.yaml", Cost("start-up", Spread.exact(4.0), 1), [sft, grpo], Cost("end", Spread.exact(2.0), 1),
        "cpu, 1 torch thread (2 cores, load 0.9)", 12.0, ["a note"],
    )  # fmt: skip


def test_the_run_adds_start_up_every_stage_and_the_end():
    est = _main_job()
    sft = 0.1 + 0.2 + 499 * 0.03 + 2 * 0.5 + 0.05  # the breakdown row is not added again
    grpo = 0.1 + 0.3 + 199 * 0.125 + 4 * 0.25 + 0.05
    assert est.stages[0].seconds.mid == pytest.approx(sft)
    assert est.stages[1].seconds.mid == pytest.approx(grpo)
    assert est.seconds.mid == pytest.approx(4.0 + sft + grpo + 2.0)
    assert est.seconds.low == pytest.approx(
        4.0 + 0.1 + 0.2 + 499 * 0.02 + 1.05 + 0.1 + 0.3 + 199 * 0.12 + 1.05 + 2.0
    )
    assert est.seconds.high == pytest.approx(
        4.0 + 0.1 + 0.2 + 499 * 0.05 + 1.05 + 0.1 + 0.3 + 199 * 0.15 + 1.05 + 2.0
    )


def test_the_report_shows_each_cost_the_total_and_the_processes():
    est = _main_job()
    trainer = ProcessEstimate("trainer", 6.0, "step", Spread(0.6, 0.5, 0.7, 3), Spread.exact(0.5), 150, 515.0)
    explorer = ProcessEstimate("explorer-0", 5.0, "batch", Spread(0.4, 0.3, 0.8, 3), Spread.exact(0.3), 150)
    est.stages[1].processes.extend([trainer, explorer])
    text = "\n".join(report_lines(est))
    assert "expected wall-clock: 49 s (measured range 43–64 s)" in text
    assert (
        "  training step" in text and "(14 s)" in text
    )  # a breakdown row: indented, its total in parentheses
    assert "0.03 s" in text and "0.02–0.05 s" in text and "499" in text
    assert "trainer     6.00 s           0.60 s / step" in text
    assert "150 batches" in text and "515 MiB" in text
    assert "grpo: sync (inline), 200 steps (1 warm-up + 10 measured) | sampling 6,000 tok/s" in text
    assert "  note: responses ran to max_tokens" in text and "note: a note" in text
    data = json.loads(json.dumps(est.as_dict()))
    assert data["seconds"]["mid"] == pytest.approx(est.seconds.mid)
    assert data["stages"][0]["costs"][2]["total"]["mid"] == pytest.approx(499 * 0.03)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.0312, "0.0312 s"), (3.214, "3.21 s"), (52.4, "52 s"), (250, "4 min 10 s"), (7500, "2 h 05 min")],
)
def test_fmt_seconds(seconds, text):
    assert fmt_seconds(seconds) == text


def test_fmt_range_is_empty_for_a_single_value():
    assert fmt_range(Spread.exact(2.0)) == ""
    assert fmt_range(Spread(1.0, 0.5, 1.5, 3)) == "0.50–1.50 s"
    assert fmt_range(Spread(200, 100, 300, 3)) == "100 s–5 min 00 s"


def test_warm_up_covers_an_async_explorers_head_start():
    assert warmup_steps("sync", 2) == 1 and warmup_steps("train", None) == 1
    assert warmup_steps("async", 2) == 3  # the explorer explores up to max_staleness batches ahead
    assert warmup_steps("async", None) == 3 and warmup_steps("async", 9) == 5
    assert warmup_steps("async", 2, given=0) == 0


def test_a_stage_is_measured_for_enough_steps_and_seconds():
    options = Options(steps=3, min_seconds=1.0, max_steps=10)
    assert not enough([0.5, 0.6], options)  # 1.1 s but only 2 steps
    assert not enough([0.1, 0.1, 0.1], options)  # 3 steps but 0.3 s
    assert enough([0.3, 0.3, 0.5], options)
    assert enough([0.01] * 10, options)  # the cap
