"""Comparing runs in the studio: the pure functions of :mod:`trine.studio.compare` (config flattening and
diff, stage alignment on the step and time axes, the eval summary) and ``GET /api/compare`` over real
HTTP, on resolved configs written as ``trine run`` writes them."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi", reason="the studio needs fastapi (pip install -e '.[dev]')")
pytest.importorskip("uvicorn", reason="the studio needs uvicorn (pip install -e '.[dev]')")

from tests.helpers import write_arithmetic_config  # noqa: E402
from trine.studio.compare import add_rows, align, config_diff, eval_summary, flatten  # noqa: E402
from trine.studio.server import background  # noqa: E402
from trine.studio.settings import StudioSettings  # noqa: E402

T0 = 1_700_000_000.0


def rows(stage: str | None, steps, start: float | None, every: float = 1.0, **values) -> list[dict]:
    """Metrics lines as the jsonl sink writes them: a step, the stage, a time (None: no time/unix)."""
    out = []
    for i, step in enumerate(steps):
        row = {"step": step, **values}
        if stage is not None:
            row["stage"] = stage
        if start is not None:
            row["time/unix"] = round(start + i * every, 3)
        out.append(row)
    return out


# -- configs ---------------------------------------------------------------------------------------


def test_flatten_writes_dotted_keys_and_keeps_plain_lists_whole():
    config = {
        "trainer": {"lr": 1e-3, "betas": [0.9, 0.99]},
        "tasks": {"eval": [{"name": "addition", "sampling": {"stop": ["\n"]}}], "train": {"reward_args": {}}},
        "stages": [],
    }
    assert flatten(config) == {
        "trainer.lr": 1e-3,
        "trainer.betas": [0.9, 0.99],
        "tasks.eval.0.name": "addition",
        "tasks.eval.0.sampling.stop": ["\n"],
        "tasks.train.reward_args": {},
        "stages": [],
    }


def test_config_diff_marks_differing_and_absent_keys_in_first_appearance_order():
    a = {"seed": 0, "trainer": {"lr": 1e-3, "clip": 1}, "name": "a"}
    b = {"seed": 0, "trainer": {"lr": 3e-3, "clip": 1.0}, "name": "b", "extra": True}
    c = {"seed": 0, "trainer": {"lr": 1e-3, "clip": True}, "name": "c"}
    diff = config_diff({"a": a, "b": b, "broken": None, "c": c})
    assert diff["runs"] == ["a", "b", "c"]  # a run without a readable config takes no part
    assert [r["key"] for r in diff["keys"]] == ["seed", "trainer.lr", "trainer.clip", "name", "extra"]
    by = {r["key"]: r for r in diff["keys"]}
    assert not by["seed"]["differs"] and by["seed"]["values"] == {"a": 0, "b": 0, "c": 0}
    assert by["trainer.lr"]["differs"]
    assert by["trainer.clip"]["differs"]  # 1, 1.0 and True are three different settings
    assert by["extra"]["differs"] and by["extra"]["values"] == {"b": True}  # absent in a and c
    assert (diff["differing"], diff["total"]) == (4, 5)
    assert not config_diff({"a": a, "a2": dict(a)})["differing"]


def test_a_one_stage_run_lines_up_with_the_first_stage_of_a_staged_run():
    one = {"seed": 0, "trainer": {"lr": 1e-3}}
    two = {"stages": [{"seed": 0, "trainer": {"lr": 1e-3}}, {"seed": 0, "trainer": {"lr": 5e-4}}]}
    keys = {r["key"]: r for r in config_diff({"one": one, "two": two})["keys"]}
    assert not keys["stages.0.trainer.lr"]["differs"]
    assert keys["stages.1.trainer.lr"]["values"] == {"two": 5e-4} and keys["stages.1.trainer.lr"]["differs"]
    assert "trainer.lr" in {r["key"] for r in config_diff({"one": one, "also": one})["keys"]}


# -- alignment -------------------------------------------------------------------------------------


def test_stages_start_at_the_same_step_and_second_in_every_run():
    a = rows("sft", [0, 1, 2, 3], T0, 10) + rows("grpo", [4, 5, 6], T0 + 40, 10)  # sft ends at 3 (t0+30)
    b = rows("sft", [1, 2, 3, 4, 5], T0 + 500, 20) + rows("grpo", [6, 7], T0 + 600, 5)  # sft: 5 steps, 80 s
    spans = {"a": add_rows([], a), "b": add_rows([], b)}
    assert [(s.name, s.first_step, s.last_step, s.lines) for s in spans["b"]] == [
        ("sft", 1, 5, 5),
        ("grpo", 6, 7, 2),
    ]
    out = align(spans)
    assert [(s["x_step"], s["x_time"]) for s in out["stages"]] == [(0, 0), (5, 80)]  # the longest sft
    ra, rb = out["runs"]["a"], out["runs"]["b"]
    assert (ra[0]["start_step"], ra[0]["start_time"], ra[0]["steps"], ra[0]["seconds"]) == (0, T0, 3, 30)
    assert (ra[1]["start_step"], ra[1]["start_time"], ra[1]["steps"], ra[1]["seconds"]) == (3, T0 + 30, 3, 30)
    assert (rb[1]["start_step"], rb[1]["start_time"]) == (5, T0 + 580)

    def at(entry, step, when):  # where the page draws a point
        return entry["x_step"] + step - entry["start_step"], entry["x_time"] + when - entry["start_time"]

    assert at(ra[1], 4, T0 + 40) == (6, 90)  # a's first grpo point: one step and 10 s into grpo
    assert at(rb[1], 6, T0 + 600) == (6, 100)  # b's: one step and 20 s into grpo, on the same axis
    assert at(ra[0], 2, T0 + 20) == (2, 20) and at(rb[0], 1, T0 + 500) == (1, 0)  # stage 0: its own
    assert out["notes"] == []


def test_growing_runs_unnamed_stages_and_lines_without_time():
    spans = add_rows([], rows(None, [1, 2], None) + [{"stage": "x"}, {"step": "3"}])  # no step: skipped
    assert [(s.name, s.last_step, s.first_time) for s in spans] == [("", 2, None)]
    add_rows(spans, rows(None, [3], None))  # the run logged another step
    staged = add_rows([], rows("sft", [1, 2], T0) + rows("grpo", [3, 4, 5, 6], T0 + 2))
    out = align({"old": spans, "staged": staged})
    assert out["runs"]["old"][0]["steps"] == 3 and out["runs"]["old"][0]["x_time"] is None
    assert out["stages"][1] == {"index": 1, "names": {"staged": "grpo"}, "x_step": 3, "x_time": 1.0}
    assert out["notes"] == [
        "stage 1 is '' in old, 'sft' in staged: stages are aligned by position, not by name"
    ]
    assert align({}) == {"stages": [], "runs": {}, "notes": []}


# -- evaluations -----------------------------------------------------------------------------------


def test_eval_summary_gives_the_last_and_best_value_per_run():
    def table(*entries):
        return {"columns": ["accuracy", "avg@4"], "rows": [dict(e) for e in entries]}

    a = table(
        {"step": 0, "taskset": "addition", "source": "run", "accuracy": 0.1, "avg@4": 0.2},
        {"step": 5, "taskset": "addition", "source": "run", "accuracy": 0.6},
        {"step": 9, "taskset": "addition", "source": "run", "accuracy": 0.4, "avg@4": None},
        {"step": 9, "taskset": "addition", "source": "bench", "accuracy": 0.45},
    )
    b = table({"step": 3, "taskset": "gsm/easy", "source": "run", "accuracy": 0.5})
    out = eval_summary({"a": a, "b": b})
    assert [(r["source"], r["taskset"], r["metric"]) for r in out] == [
        ("run", "addition", "accuracy"),
        ("run", "addition", "avg@4"),
        ("run", "gsm/easy", "accuracy"),
        ("bench", "addition", "accuracy"),
    ]
    assert out[0]["runs"] == {"a": {"last": 0.4, "last_step": 9, "best": 0.6, "best_step": 5, "points": 3}}
    assert out[1]["runs"]["a"] == {"last": 0.2, "last_step": 0, "best": 0.2, "best_step": 0, "points": 1}
    assert out[2]["runs"] == {"b": {"last": 0.5, "last_step": 3, "best": 0.5, "best_step": 3, "points": 1}}


# -- GET /api/compare ------------------------------------------------------------------------------


def resolved(root: Path, model: Path, name: str, *overrides: dict) -> Path:
    """A run directory holding the resolved config.yaml ``trine run`` writes for this config."""
    import yaml

    from trine.config import load_config
    from trine.rundir import _resolved_config

    stages = load_config(write_arithmetic_config(root, model, name, *overrides))
    (root / name).mkdir()
    (root / name / "config.yaml").write_text(
        yaml.safe_dump(_resolved_config(stages, root / name), sort_keys=False)
    )
    return root / name


def write_lines(run: Path, records: list, name: str = "metrics.jsonl", mode: str = "w") -> None:
    with (run / name).open(mode) as f:
        f.writelines((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


@pytest.fixture(scope="module")
def compared(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("compare")

    def staged(grpo_lr: float) -> dict:
        sft = {"stage": "sft", "mode": "train", "algorithm": {"name": "sft"}, "tasks": {"total_steps": 3}}
        return {"stages": [sft, {"stage": "grpo", "tasks": {"total_steps": 3}, "trainer": {"lr": grpo_lr}}]}

    a = resolved(root, tiny_model_dir, "a", staged(1e-3))
    b = resolved(root, tiny_model_dir, "b", staged(3e-3))
    one = resolved(root, tiny_model_dir, "one")
    ev, loss = {"eval/addition/accuracy": 0.25}, {"trainer/loss": 2.0}
    write_lines(a, rows("sft", [0], T0, **ev) + rows("sft", [1, 2, 3], T0 + 1, **loss)
                + rows("grpo", [4, 5, 6], T0 + 4, **{"explorer/reward_mean": 0.5, **ev}))  # fmt: skip
    write_lines(b, rows("sft", [1, 2, 3, 4, 5], T0, **loss) + ["{not json"] + rows("grpo", [6], T0 + 9))
    write_lines(
        b, [{"step": 6, "stage": "grpo", "checkpoint": "c6", "eval/addition/accuracy": 0.75}], "bench.jsonl"
    )
    write_lines(one, rows("main", [1, 2], T0))
    (root / "status-only").mkdir()
    (root / "status-only" / "status.json").write_text(json.dumps({"state": "waiting", "reason": "for a GPU"}))
    with background(StudioSettings(runs_dir=root)) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client, root


def test_compare_aligns_stages_diffs_configs_and_sets_evals_side_by_side(compared):
    api, root = compared
    r = api.get("/api/compare", params={"runs": "a,b"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [(run["name"], run["stages"]) for run in body["runs"]] == [
        ("a", ["sft", "grpo"]),
        ("b", ["sft", "grpo"]),
    ]
    aligned = body["alignment"]
    assert aligned["stages"][1]["x_step"] == 5  # b's sft ran to step 5
    assert (aligned["runs"]["a"][1]["start_step"], aligned["runs"]["b"][1]["start_step"]) == (3, 5)
    assert any("line 6: not valid JSON" in note for note in body["runs"][1]["notes"])
    keys = {k["key"]: k for k in body["config"]["keys"]}
    assert keys["stages.1.trainer.lr"]["differs"] and keys["stages.1.trainer.lr"]["values"]["b"] == 3e-3
    assert keys["stages.0.run_dir"]["values"] == {"a": str(root / "a"), "b": str(root / "b")}
    assert not keys["stages.0.seed"]["differs"]
    evals = {(e["source"], e["metric"]): e["runs"] for e in body["evals"]}
    assert evals[("run", "accuracy")]["a"]["last_step"] == 6 and "b" not in evals[("run", "accuracy")]
    assert evals[("bench", "accuracy")] == {
        "b": {"last": 0.75, "last_step": 6, "best": 0.75, "best_step": 6, "points": 1}
    }

    mixed = api.get("/api/compare", params={"runs": "one,a,status-only"}).json()  # no config, no metrics
    assert mixed["config"]["runs"] == ["one", "a"]
    assert {k["key"] for k in mixed["config"]["keys"]} >= {"stages.0.trainer.lr", "stages.1.trainer.lr"}
    only = mixed["runs"][2]
    assert only["state"] == "waiting" and only["why"] == "for a GPU"  # any state describe names, as it is
    notes = " ".join(only["notes"])
    assert "no config.yaml" in notes and "no metrics.jsonl" in notes
    assert [s["names"] for s in mixed["alignment"]["stages"]][0] == {"one": "main", "a": "sft"}
    assert "aligned by position" in mixed["notes"][0]


def test_compare_follows_a_growing_and_a_rewound_metrics_file(compared):
    api, root = compared

    def steps() -> int:
        return api.get("/api/compare", params={"runs": "a,one"}).json()["alignment"]["runs"]["one"][0][
            "steps"
        ]

    assert steps() == 2
    write_lines(root / "one", rows("main", [3, 4], T0 + 5), mode="a")
    assert steps() == 4
    write_lines(root / "one", rows("main", [1], T0))  # cut back, as a resumed run rewinds it
    assert steps() == 1


@pytest.mark.parametrize(
    ("runs", "status", "words"),
    [
        ("a,nosuch", 404, "no run 'nosuch'"),
        ("a", 400, "needs 2 to 8"),
        ("a,a", 400, "needs 2 to 8"),
        (",".join(f"r{i}" for i in range(9)), 400, "at most 8"),
        ("a,..", 400, "not allowed"),
        ("a,../a", 400, "not allowed"),
    ],
)
def test_compare_refuses_what_it_cannot_compare_and_says_why(compared, runs, status, words):
    api, _root = compared
    r = api.get("/api/compare", params={"runs": runs})
    assert r.status_code == status and words in r.json()["detail"], r.text


def test_compare_without_runs_or_with_an_endless_list_is_refused(compared):
    api, _root = compared
    assert api.get("/api/compare").status_code == 422
    assert api.get("/api/compare", params={"runs": "a," * 5000}).status_code == 422
