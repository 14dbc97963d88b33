"""Monitor sinks (console, jsonl, tensorboard), read_metrics and plot_run."""

from __future__ import annotations

import io
import json
import math
import struct

import pytest

from trine.monitor import SINKS, ConsoleSink, JsonlSink, Monitor, TensorBoardSink, build_monitor, read_metrics
from trine.monitor.plot import (
    PANELS,
    _stagewise_ema,
    collect_series,
    draw_view,
    ema,
    panel_views,
    plot_run,
    stage_regions,
)

STEP = {
    "explorer/reward_mean": 0.53125,
    "eval/gsm8k/accuracy": 0.41,
    "trainer/loss": 0.0123,
    "trainer/kl": 0.00121,
    "explorer/response_length_mean": 123.4,
    "time/step_seconds": 3.214,
    "trainer/clipfrac": 0.2,
}


def test_jsonl_round_trip_with_nan_and_strings(tmp_path):
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    sink.log({"trainer/loss": 1.5, "trainer/kl": float("nan"), "x/inf": float("inf"), "stage": "sft"}, step=1)
    sink.log({"trainer/loss": 1.25, "eval/t/avg@8": 0.5}, step=2)
    sink.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[0]) == {
        "step": 1,
        "trainer/loss": 1.5,
        "trainer/kl": None,
        "x/inf": None,
        "stage": "sft",
    }
    assert "NaN" not in lines[0] and "Infinity" not in lines[0]
    assert read_metrics(tmp_path / "metrics.jsonl") == [
        {"step": 1, "trainer/loss": 1.5, "trainer/kl": None, "x/inf": None, "stage": "sft"},
        {"step": 2, "trainer/loss": 1.25, "eval/t/avg@8": 0.5},
    ]


def test_jsonl_lines_are_on_disk_before_close(tmp_path):
    sink = JsonlSink(tmp_path)  # a directory: writes metrics.jsonl inside it
    sink.log({"a/b": 1.0}, step=7)
    assert read_metrics(tmp_path) == [{"step": 7, "a/b": 1.0}]
    sink.close()


def test_truncated_last_line_is_ignored_and_cut_on_reopen(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1.0}\n{"step": 2, "a": 2.0}\n{"step": 3, "a"')
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    sink = JsonlSink(path)
    sink.log({"a": 3.5}, step=3)
    sink.close()
    assert read_metrics(path) == [{"step": 1, "a": 1.0}, {"step": 2, "a": 2.0}, {"step": 3, "a": 3.5}]


def test_bad_middle_line_names_file_and_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
        read_metrics(path)


def test_read_metrics_drop_rewound_keeps_each_step_once(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s, "a": float(s)} for s in (1, 2, 3, 4)] + [
        {"step": s, "a": 10.0 + s} for s in (3, 4, 5)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [r["a"] for r in read_metrics(path, drop_rewound=True)] == [1.0, 2.0, 13.0, 14.0, 15.0]
    assert len(read_metrics(path)) == 7


def test_read_metrics_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        read_metrics(tmp_path / "nope.jsonl")


def test_console_plain_lines_on_non_tty():
    out = io.StringIO()
    sink = ConsoleSink(total_steps=10, file=out)
    assert not sink.fancy
    sink.log({**STEP, "stage": "grpo"}, step=1)
    sink.log({**STEP, "explorer/reward_mean": 0.75}, step=2)
    sink.close()
    text = out.getvalue()
    lines = text.splitlines()
    assert len(lines) == 2
    assert "\x1b" not in text and "\r" not in text
    first = lines[0]
    assert first.startswith("[grpo] step 1/10 | reward 0.531 | gsm8k/acc 0.41 | loss 0.0123 | kl 0.00121")
    assert "| len 123 | time 3.21s | [0:00:00<0:00:28]" in first  # 9 steps left at 3.214 s
    assert "clipfrac" not in first  # not in the default keys
    assert lines[1].startswith("step 2/10 | reward 0.75 |")
    assert all(len(line) <= 120 for line in lines)


def test_console_reward_is_the_trained_batchs_where_the_explorer_has_none():
    """A trainer process (launch: processes, Ray, serve) has no explorer metrics: its line shows the reward
    of the batch it trained on; pending rewards (human feedback) show as such, never as ``reward nan``."""
    sink = ConsoleSink(total_steps=10, file=io.StringIO())
    trained = {"trainer/reward_mean": 0.25, "trainer/loss": 0.5}
    assert sink.format_line(trained, 3).startswith("step 3/10 | reward 0.25 | loss 0.5 |")
    nan = {"explorer/reward_mean": math.nan, "explorer/reward_pending": 16.0}
    assert sink.format_line({**nan, **trained}, 3).startswith("step 3/10 | reward 0.25 | loss 0.5 |")
    assert sink.format_line({**nan, "trainer/loss": 0.5}, 3).startswith(
        "step 3/10 | reward pending 16 | loss"
    )
    both = {"explorer/reward_mean": 0.75, **trained}  # one process: the explored batch's, as before
    assert sink.format_line(both, 3).startswith("step 3/10 | reward 0.75 | loss 0.5 |")
    assert "reward" not in sink.format_line({"trainer/loss": 0.5}, 3)  # SFT: no reward at all


def test_console_keys_globs_and_every():
    out = io.StringIO()
    sink = ConsoleSink(total_steps=None, keys=["trainer/*"], every=2, file=out)
    for step in range(1, 6):
        sink.log(STEP, step=step)
    lines = out.getvalue().splitlines()
    assert [line.split(" |")[0] for line in lines] == ["step 1", "step 2", "step 4"]
    assert "clipfrac 0.2 | kl 0.00121 | loss 0.0123" in lines[1]
    with pytest.raises(ValueError, match="every=0"):
        ConsoleSink(every=0)


def test_console_on_terminal_shows_bar_and_lines():
    from rich.console import Console

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100, color_system=None)
    sink = ConsoleSink(total_steps=4, console=console)
    assert sink.fancy
    for step in range(1, 5):
        sink.log(STEP, step=step)
    sink.close()
    text = out.getvalue()
    assert "step 4/4 | reward 0.531" in text
    assert "4/4" in text and "steps" in text


def test_tensorboard_sink_round_trip(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sink = TensorBoardSink(tmp_path / "tb")
    sink.log({"trainer/loss": 0.5, "eval/t/avg@8": 0.25, "stage": "sft"}, step=1)
    sink.log({"trainer/loss": 0.25}, step=2)
    sink.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["eval/t/avg@8", "trainer/loss"]
    assert [(e.step, e.value) for e in acc.Scalars("trainer/loss")] == [(1, 0.5), (2, 0.25)]
    assert [(e.step, e.value) for e in acc.Scalars("eval/t/avg@8")] == [(1, 0.25)]


def test_sink_table_names_every_builtin():
    assert set(SINKS) == {"console", "jsonl", "tensorboard", "wandb", "mlflow"}


def test_tensorboard_resume_purges_the_rewound_steps(tmp_path):
    """A run killed after step 4 and resumed from its step-2 checkpoint: TensorBoard shows each step once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    crashed = TensorBoardSink(tmp_path / "tensorboard")
    for step in (1, 2, 3, 4):
        crashed.log({"trainer/loss": float(step)}, step=step)
    crashed.close()
    resumed = build_monitor(["tensorboard"], tmp_path, resume_step=2)
    for step in (3, 4, 5):
        resumed.log({"trainer/loss": 10.0 + step}, step=step)
    resumed.log_table("eval/t/samples", [{"prompt": "1+1=", "response": "2|3", "reward": 1.0}], step=5)
    resumed.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("trainer/loss")] == [
        (1, 1),
        (2, 2),
        (3, 13),
        (4, 14),
        (5, 15),
    ]
    (text,) = acc.Tensors("eval/t/samples/text_summary")
    markdown = text.tensor_proto.string_val[0].decode()
    assert (
        text.step == 5
        and "| prompt | response | reward |" in markdown
        and "| 1+1= | 2\\|3 | 1.0 |" in markdown
    )


class Recorder:
    def __init__(self):
        self.calls, self.closed = [], False

    def log(self, metrics, step):
        self.calls.append((step, dict(metrics)))

    def close(self):
        self.closed = True


def test_monitor_fans_out_and_closes_as_context_manager(tmp_path):
    rec = Recorder()
    with Monitor([rec, JsonlSink(tmp_path / "m.jsonl")]) as monitor:
        monitor.log({"a/b": 2.0}, step=3)
    assert rec.calls == [(3, {"a/b": 2.0})] and rec.closed
    assert read_metrics(tmp_path / "m.jsonl") == [{"step": 3, "a/b": 2.0}]


def test_build_monitor_uses_run_dir_layout(tmp_path):
    out = io.StringIO()
    with build_monitor(
        ["console", "jsonl"], tmp_path, total_steps=3, options={"console": {"file": out}}
    ) as mon:
        mon.log({"explorer/reward_mean": 1.0}, step=1)
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "explorer/reward_mean": 1.0}]
    assert out.getvalue().startswith("step 1/3 | reward 1 |")
    with pytest.raises(ValueError, match="unknown monitor 'jsnol'"):
        build_monitor(["jsnol"], tmp_path)


def write_run(run_dir, steps=60, switch=25):
    """Two stages (sft then grpo), eval every 10 steps, reward std, kl only in grpo."""
    rows = []
    for step in range(1, steps + 1):
        stage = "sft" if step <= switch else "grpo"
        row = {"step": step, "stage": stage, "trainer/loss": 2.0 / step + 0.05 * math.sin(step)}
        row["explorer/response_length_mean"] = 100 + step + 10 * math.cos(step)
        if stage == "grpo":
            row["explorer/reward_mean"] = 0.2 + 0.01 * (step - switch) + 0.05 * math.sin(3 * step)
            row["explorer/reward_std"] = 0.1
            row["trainer/kl"] = 0.001 * (step - switch)
        if step % 10 == 0:
            row["eval/gsm8k/accuracy"] = step / 100
            row["eval/gsm8k/avg@8"] = step / 120
            row["eval/math/accuracy"] = step / 200
        rows.append(row)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


def test_plot_run_writes_readable_pngs(tmp_path):
    run_dir = tmp_path / "run"
    write_run(run_dir)
    written = plot_run(run_dir)
    names = [p.name for p in written]
    assert names == ["reward.png", "eval_accuracy.png", "loss.png", "response_length.png", "overview.png"]
    for path in written:
        assert path.parent == run_dir / "plots" and path.stat().st_size > 10_000
        width, height = png_size(path)
        assert 800 <= width <= 2400 and 400 <= height <= 2400, (path.name, width, height)
    assert png_size(run_dir / "plots" / "loss.png")[1] > png_size(run_dir / "plots" / "reward.png")[1]  # + kl


def test_plot_run_skips_plots_without_metrics(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(
        '{"step": 1, "trainer/loss": 1.0}\n{"step": 2, "trainer/loss": 0.5}\n'
    )
    assert [p.name for p in plot_run(run_dir)] == ["loss.png", "overview.png"]


def test_plot_run_missing_inputs(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        plot_run(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        plot_run(tmp_path)


def test_stage_regions_and_ema():
    records = [{"step": s, "stage": "sft" if s <= 2 else "grpo"} for s in (1, 2, 3, 4)]
    assert stage_regions(records) == [("sft", 1, 2.5), ("grpo", 2.5, 4)]
    assert stage_regions([{"step": 1}]) == []
    assert ema([1.0, 1.0, 1.0], 0.9) == pytest.approx([1.0, 1.0, 1.0])  # debiased: no pull towards 0
    assert ema([0.0, 1.0], 0.5) == pytest.approx([0.0, 0.5 / 0.75])
    regions = stage_regions(records)  # the EMA restarts at the sft -> grpo boundary
    assert _stagewise_ema([1, 2, 3, 4], [0.0, 0.0, 5.0, 5.0], regions, 0.9) == pytest.approx([0, 0, 5, 5])


def test_plot_gives_each_stage_its_own_loss_axes_and_drops_all_zero_curves(tmp_path):
    run_dir = tmp_path / "run"
    write_run(run_dir)
    records = read_metrics(run_dir)
    for r in records:
        r["trainer/clipfrac"] = 0.0  # e.g. one update per batch: never clipped
    series, stages = collect_series(records), stage_regions(records)
    panels = {p.name: p for p in PANELS}
    loss = panel_views(panels["loss"], series, stages)
    assert [v.title for v in loss] == ["Loss: sft", "Loss: grpo"]  # ~2 and ~0.05: one scale each
    assert max(loss[0].series["trainer/loss"][0]) == 25 and min(loss[1].series["trainer/loss"][0]) == 26
    assert [v.title for v in panel_views(panels["kl"], series, stages)] == ["KL divergence: grpo"]
    assert panel_views(panels["clipfrac"], series, stages) == []
    assert [v.title for v in panel_views(panels["reward"], series, stages)] == ["Reward"]  # zero is a result


def test_plot_clips_the_std_band_of_a_0_1_reward(tmp_path):
    from matplotlib.figure import Figure

    rows = [
        {"step": s, "explorer/reward_mean": m, "explorer/reward_std": 0.5}
        for s, m in enumerate((0.1, 0.9, 0.5), 1)
    ]
    series = collect_series(rows)
    (view,) = panel_views(PANELS[0], series, [])
    assert view.band_limits == (0.0, 1.0)
    ax = Figure().add_subplot()
    draw_view(ax, view, smoothing=0)
    (band,) = ax.collections
    ys = [y for path in band.get_paths() for _, y in path.vertices]
    assert min(ys) == 0.0 and max(ys) == 1.0  # unclipped: -0.4 and 1.4
    rows[0]["explorer/reward_mean"] = -2.0  # not a 0-1 reward: no clipping
    assert panel_views(PANELS[0], collect_series(rows), [])[0].band_limits == (None, None)


def test_stage_regions_give_a_shared_step_to_the_earlier_stage():
    """The next stage's start-of-stage eval is logged at the previous stage's last step."""
    records = [{"step": s, "stage": "sft"} for s in (1, 2)] + [
        {"step": s, "stage": "grpo"} for s in (2, 3, 4)
    ]
    assert stage_regions(records) == [("sft", 1, 2.5), ("grpo", 2.5, 4)]


def test_the_summary_shows_what_a_stage_without_eval_trained():
    """No eval taskset: the table's rows are the stage's reward and loss (mean of the first window → mean of
    the last) and its steps, never an empty ``- - -`` row; a stage with an eval shows its eval as before."""
    from trine.monitor.summary import print_summary, summary_rows, track_step

    record: dict = {"seconds": 12.5}
    for step in range(20):  # windows of 10: steps 0-9 and 10-19
        reward = {"trainer/reward_mean": step / 20} if step % 2 else {"explorer/reward_mean": step / 20}
        track_step(record, {**reward, "explorer/reward_pending": 3.0, "trainer/loss": 1.0 - step / 40}, 20)
    track_step(record, {"explorer/reward_mean": math.nan, "trainer/loss": math.nan}, 20)  # pending: skipped
    assert summary_rows(record) == [
        ("reward (mean of 10 steps)", "0.225", "0.725"),
        ("loss (mean of 10 steps)", "0.887", "0.637"),
        ("steps", "0", "21"),
    ]
    short: dict = {}
    for step in range(3):  # 3 steps: windows of 1, the first and the last step
        track_step(short, {"trainer/loss": float(step)}, 3)
    assert summary_rows(short) == [("loss (mean of 1 step)", "0", "2"), ("steps", "0", "3")]
    evaluated = {"eval_start": {"eval/a/accuracy": 0.25}, "eval_end": {"eval/a/accuracy": 0.5}, **short}
    assert summary_rows(evaluated) == [("eval/a/accuracy", "25.0%", "50.0%")]
    assert summary_rows({"seconds": 0.0}) == [("-", "-", "-")]  # a stage that ran no step

    out = io.StringIO()
    print_summary({"run_dir": "runs/x", "stages": {"main": record, "sft": evaluated}}, file=out)
    text = out.getvalue()
    assert "Trine run summary" in text and "reward (mean of 10 steps)" in text and "25.0%" in text
    assert "12.5" in text and text.rstrip().endswith("run directory: runs/x")


def test_the_plots_import_can_run_ahead_in_a_thread():
    """A run with ``monitor.plot`` starts matplotlib's import when it opens (``figures.preload``), so the
    plots at its end do not wait for it; the import runs in a daemon thread that never holds the run."""
    import subprocess
    import sys

    code = (
        "import sys; from trine.monitor.figures import preload; t = preload(); "
        "assert t.daemon; t.join(60); print('matplotlib.backends.backend_agg' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
