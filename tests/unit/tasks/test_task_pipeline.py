"""Task pipeline: formatters, filters, difficulty scores, ordering, export."""

from __future__ import annotations

import importlib.util
import json

import pytest

from trine.tasks.pipeline import (
    TASK_STEPS,
    boxed_answer,
    dedup,
    extract_boxed,
    length_filter,
    nll_difficulty,
    normalize,
    pass_rate,
    process_taskset,
    read_rows,
    regex_filter,
    run_task_pipeline,
    sort_rows,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so the answer is \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),
        (r"\boxed{1} first, then \boxed{x^{2}+1}", "x^{2}+1"),
        (r"$\boxed 5$", "5"),
        (r"\boxed{ \{1, 2\} }", r"\{1, 2\}"),
        (r"\fbox{7}", "7"),
        (r"\boxed{a} and \boxed{b", "a"),  # the last one never closes: the one before it
        (r"\boxed{unclosed", None),
        ("no box here", None),
        (None, None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_boxed_answer_keep_drop_error():
    rows = [{"solution": r"it is \boxed{42}"}, {"solution": "no idea"}]
    assert boxed_answer(rows) == [{"solution": r"it is \boxed{42}", "answer": "42"}, {"solution": "no idea"}]
    assert boxed_answer(rows, on_missing="drop", to="gold") == [
        {"solution": r"it is \boxed{42}", "gold": "42"}
    ]
    with pytest.raises(ValueError, match=r"row #1 field 'solution' has no \\boxed"):
        boxed_answer(rows, on_missing="error")
    assert rows[0] == {"solution": r"it is \boxed{42}"}  # inputs are not modified


def test_normalize_fields():
    rows = [{"q": "  Ｈello\t\n world  ", "n": 3}]
    assert normalize(rows, fields=["q", "n"]) == [{"q": "Hello world", "n": 3}]
    assert normalize(rows, fields="q", lowercase=True, unicode_form=None) == [{"q": "ｈello world", "n": 3}]
    assert normalize(rows, fields="q", collapse_whitespace=False)[0]["q"] == "Hello\t\n world"


def test_filters_length_regex_dedup():
    rows = [{"q": "a"}, {"q": "one two three"}, {"q": "x" * 30}, {}, {"q": "One  two THREE"}]
    assert length_filter(rows, field="q", min_length=2, max_length=20) == [rows[1], rows[4]]
    assert length_filter(rows, field="q", max_length=1, unit="words") == [rows[0], rows[2], rows[3]]
    assert regex_filter(rows, field="q", include=r"two", exclude=r"THREE") == [rows[1]]
    assert regex_filter(rows, field="q", include=r"two", exclude=r"THREE", ignore_case=True) == []
    assert dedup(rows, field="q") == rows[:4]
    assert dedup(rows, field="q", normalize_text=False) == rows
    with pytest.raises(ValueError, match="pattern is invalid"):
        regex_filter(rows, field="q", include="(")


def test_sort_by_score_with_missing_last():
    rows = [{"id": 0, "d": 0.5}, {"id": 1}, {"id": 2, "d": 0.1}, {"id": 3, "d": 0.9}, {"id": 4, "d": 0.1}]
    assert [r["id"] for r in sort_rows(rows, by="d")] == [2, 4, 0, 3, 1]
    assert [r["id"] for r in sort_rows(rows, by="d", descending=True)] == [3, 0, 2, 4, 1]


def test_run_task_pipeline_report_and_step_resolution():
    rows = [{"q": " a ", "s": r"\boxed{1}"}, {"q": "a", "s": r"\boxed{2}"}, {"q": "bb", "s": "none"}]
    report: dict[str, float] = {}
    out = run_task_pipeline(
        rows,
        [
            {"name": "normalize", "fields": ["q"]},
            {"name": "dedup", "field": "q"},
            {"name": "extract_boxed", "field": "s", "on_missing": "drop"},
            {"name": "trine.tasks.pipeline:length_filter", "field": "q", "max_length": 5},
            lambda rows: rows + [{"q": "added"}],
        ],
        report,
    )
    assert out == [{"q": "a", "s": r"\boxed{1}", "answer": "1"}, {"q": "added"}]
    counts = {k: v for k, v in report.items() if not k.endswith("seconds")}
    assert counts == {
        "task_pipeline/normalize/in": 3,
        "task_pipeline/normalize/out": 3,
        "task_pipeline/dedup/in": 3,
        "task_pipeline/dedup/out": 2,
        "task_pipeline/extract_boxed/in": 2,
        "task_pipeline/extract_boxed/out": 1,
        "task_pipeline/trine.tasks.pipeline:length_filter/in": 1,
        "task_pipeline/trine.tasks.pipeline:length_filter/out": 1,
        "task_pipeline/<lambda>/in": 1,
        "task_pipeline/<lambda>/out": 2,
    }
    with pytest.raises(ValueError, match=r"unknown task step 'dedupe'.*Did you mean 'dedup'"):
        run_task_pipeline(rows, [{"name": "dedupe", "field": "q"}])
    with pytest.raises(ValueError, match="step #0"):
        run_task_pipeline(rows, ["dedup"])
    assert {
        "extract_boxed",
        "length",
        "regex",
        "dedup",
        "difficulty_nll",
        "pass_rate",
        "sort",
        "export",
    } <= set(TASK_STEPS)


def test_process_taskset_round_trips_jsonl_and_parquet(tmp_path):
    src = tmp_path / "raw.jsonl"
    src.write_text(
        "".join(
            json.dumps({"question": q, "solution": s}) + "\n"
            for q, s in [
                ("1+1?", r"\boxed{2}"),
                ("2+2?", r"\boxed{4}"),
                ("2+2?", r"\boxed{4}"),
                ("??", "no answer"),
            ]
        )
    )
    steps = [
        {"name": "dedup", "field": "question"},
        {"name": "extract_boxed", "on_missing": "drop"},
        {"name": "export", "path": str(tmp_path / "copy.jsonl")},
    ]
    report = process_taskset(src, tmp_path / "out.parquet", steps)
    assert report["task_pipeline/rows_in"] == 4 and report["task_pipeline/rows_out"] == 2
    expected = [
        {"question": "1+1?", "solution": r"\boxed{2}", "answer": "2"},
        {"question": "2+2?", "solution": r"\boxed{4}", "answer": "4"},
    ]
    assert read_rows(tmp_path / "out.parquet") == expected
    assert read_rows(tmp_path / "copy.jsonl") == expected
    from trine.tasks import TaskSet

    assert [t.answer for t in TaskSet(tmp_path / "out.parquet")] == ["2", "4"]
    with pytest.raises(ValueError, match="expected .jsonl or .parquet"):
        process_taskset(src, tmp_path / "out.csv", [])


# -- scores with the tiny model ----------------------------------------------------------------------


def test_nll_difficulty_matches_a_direct_forward(model, tokenizer, one_torch_thread):
    import torch

    from trine.models.chat import encode_prompt

    tok = tokenizer
    rows = [
        {"question": "2+3?", "answer": "5"},
        {"question": "hi", "answer": "hello there friend"},
        {"question": "x"},
    ]
    out = nll_difficulty(rows, model=model, tokenizer=tok, batch_size=2)
    assert out[2]["difficulty"] is None
    for row, scored in zip(rows[:2], out):
        prompt = encode_prompt(tok, [{"role": "user", "content": row["question"]}])
        answer = tok(row["answer"], add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + answer])).logits[0].float()
        logp = torch.log_softmax(logits[len(prompt) - 1 : -1], -1).gather(-1, torch.tensor(answer)[:, None])
        assert scored["difficulty"] == pytest.approx(-float(logp.mean()), rel=1e-4)
    ordered = sort_rows(out, by="difficulty")
    assert ordered[0]["difficulty"] <= ordered[1]["difficulty"] and ordered[2] is out[2]


def test_pass_rate_samples_k_responses_and_scores_them_with_the_reward(model, tokenizer, one_torch_thread):
    from trine.models.engine import HFEngine

    tok = tokenizer
    engine = HFEngine(model, tok, seed=0)
    requests: list = []

    class Recording:  # the real engine, recording what it is asked
        encode_chat = engine.encode_chat

        def generate_batch(self, batch):
            requests.extend(batch)
            return engine.generate_batch(batch)

    calls: list[tuple[str, str]] = []

    def reward(response, task):
        calls.append((task.task_id, response))
        return {"accuracy": 1.0 if task.answer == "easy" else 0.0, "_diagnostic": 5.0}

    rows = [
        {"question": "a?", "answer": "easy"},
        {"question": "b?", "answer": "hard"},
        {"question": "c?", "answer": "easy"},
    ]
    out = pass_rate(rows, engine=Recording(), reward=reward, k=3, max_tokens=4, batch_size=2)
    assert [r["pass_rate"] for r in out] == [1.0, 0.0, 1.0]
    assert [r["difficulty"] for r in out] == [0.0, 1.0, 0.0]
    assert sorted(task_id for task_id, _ in calls) == ["0"] * 3 + ["1"] * 3 + ["2"] * 3
    assert [(p.n, p.max_tokens, p.temperature) for _, p in requests] == [(3, 4, 1.0)] * 3
    assert requests[1][0] == engine.encode_chat([{"role": "user", "content": "b?"}])

    # greedy samples are all the same response, so its pass rate is 0 or 1
    texts: list[str] = []

    def first_text_passes(response, task):
        texts.append(response)
        return float(response == texts[0])

    greedy = pass_rate(rows[:1], engine=engine, reward=first_text_passes, k=4, temperature=0.0, max_tokens=6)
    assert greedy[0]["pass_rate"] == 1.0 and len(set(texts)) == 1
    # a reward by name, from the registry: the random tiny model never says "hard"
    named = pass_rate(
        rows[1:2], engine=engine, reward="exact_match", k=2, max_tokens=3, column="p", difficulty_column=None
    )
    assert named == [{"question": "b?", "answer": "hard", "p": 0.0}]
    engine.close()


def test_pass_rate_builds_its_engine_from_a_model_directory(tiny_model_dir, one_torch_thread):
    out = pass_rate(
        [{"question": "q"}],
        model=str(tiny_model_dir),
        reward=lambda r, t: 1.0,
        k=2,
        max_tokens=2,
        answer_key=None,
    )
    assert out[0]["pass_rate"] == 1.0
    with pytest.raises(ValueError, match="needs engine="):
        pass_rate([{"question": "q"}], reward=lambda r, t: 1.0)


# -- Data-Juicer bridge ------------------------------------------------------------------------------


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("data_juicer", "ray", "aiohttp")),
    reason="Data-Juicer bridge needs the `data` extra: py-data-juicer (+ ray and aiohttp, which it imports)",
)
def test_data_juicer_recipe_over_task_rows():
    rows = [
        {"question": "What is\u00a0two plus two?", "answer": "4"},
        {"question": "Hi?", "answer": "x"},
        {"question": "What is\u00a0two plus two?", "answer": "4"},
        {"question": "Name the largest planet.", "answer": "Jupiter"},
    ]
    out = run_task_pipeline(
        rows,
        [
            {
                "name": "trine.buffer.data_juicer:process_task_rows",
                "process": [
                    {"whitespace_normalization_mapper": {}},
                    {"text_length_filter": {"min_len": 10}},
                    {"document_deduplicator": {}},
                ],
                "stats_field": "dj",
            }
        ],
    )
    assert out == [
        {"question": "What is two plus two?", "answer": "4", "dj": {"text_len": 21}},
        {"question": "Name the largest planet.", "answer": "Jupiter", "dj": {"text_len": 24}},
    ]
