"""``trine.tasks.overlap``: normalization, n-grams, exact and n-gram matches, thresholds, boilerplate."""

from __future__ import annotations

import random

import pytest

from trine.tasks.overlap import (
    HISTOGRAM_BINS,
    OverlapReport,
    as_text,
    compare,
    highlight,
    ngrams,
    normalize,
    task_texts,
)
from trine.types import Task

rng = random.Random(0)
VOCAB = [f"w{i}" for i in range(3000)]


def words(k: int) -> str:
    """``k`` random words (two such texts share no 13-gram in practice)."""
    return " ".join(rng.choice(VOCAB) for _ in range(k))


def test_normalize_folds_case_width_punctuation_and_whitespace():
    assert normalize("  Hello,\tWORLD!\n  How's it going?  ") == "hello world how s it going"
    assert normalize("Ｆｕｌｌ－ｗｉｄｔｈ ＡＢＣ") == normalize("Full-width abc")  # NFKC
    assert normalize("“Quoted” — text…") == "quoted text"
    assert normalize("ﬁle") == "file"  # ligature, NFKC
    assert normalize("Café") == normalize("Cafe\u0301")  # composed and decomposed accents agree
    assert normalize("...!?") == ""


def test_normalize_keeps_math_operators_apart():
    assert normalize("3+4=") == "3 + 4 ="
    assert normalize("3*4=") != normalize("3+4=") != normalize("3-4=")
    assert normalize("x^2 >= 10%") == "x ^ 2 > = 10 %"
    assert normalize("12+7=") != normalize("1+27=")


def test_ngrams_slide_over_words_and_short_rows_are_one_ngram():
    text = "a b c d e".split()
    assert len(ngrams(text, 3)) == 3
    assert ngrams(text, 3)[0] == ngrams("a b c".split(), 3)[0]
    assert ngrams("a b".split(), 3) == [hash(("a", "b"))]  # shorter than n: the whole row
    assert ngrams([], 3) == []
    assert len(ngrams(text, 1)) == 5


def test_exact_match_after_normalizing_and_answers_reported_separately():
    train = ["What is 3+4?", "Name the capital of France.", "What is 5+5?"]
    answers = ["7", "Paris", "10"]
    report = compare(
        train,
        ["what is 3 + 4", "NAME the capital of france", "What is 6+6?", ""],
        train_answers=answers,
        eval_answers=["7", "Lyon", "10", ""],
    )
    assert [r.exact for r in report.rows] == [0, 1, None, None]
    assert [r.contaminated for r in report.rows] == [True, True, False, False]
    assert report.exact == 2 and report.contaminated == 2 and report.share == pytest.approx(0.5)
    assert [r.same_answer for r in report.rows] == [True, False, None, None]
    assert [r.answer_match for r in report.rows] == [0, None, 2, None]  # 6+6's "10" is 5+5's, by chance
    assert report.answer_matches == 2 and report.exact_same_answer == 1
    assert report.short_rows == 3  # the empty row has no words: not counted as short
    assert report.train_rows == 3 and report.eval_rows == 4


def test_ngram_share_of_a_paraphrased_row_and_the_matching_training_row():
    shared = words(40)
    train = [words(50), f"{words(5)} {shared} {words(5)}", words(50)]
    # half the eval row is the shared passage: 28 of its 55 13-grams lie inside it
    eval_row = f"{shared} {words(27)}"
    report = compare(train, [eval_row, words(60)], n=13, threshold=0.5)
    row, clean = report.rows
    assert row.exact is None and row.train_row == 1
    assert row.ngrams == 67 - 12 and row.fraction == pytest.approx(28 / 55)
    assert row.spans == [(0, 40)] and row.contaminated
    assert clean.fraction == 0 and clean.train_row is None and not clean.contaminated and clean.spans == []
    assert highlight(normalize(eval_row), row.spans).startswith("«" + shared + "» ")


def test_threshold_decides_and_an_exact_match_always_counts():
    shared = words(30)
    train = [shared]
    eval_texts = [f"{shared} {words(30)}", shared]  # 18 of 48 n-grams shared; an exact copy
    low = compare(train, eval_texts, threshold=0.3)
    high = compare(train, eval_texts, threshold=0.5)
    assert low.rows[0].fraction == pytest.approx(18 / 48)
    assert low.rows[0].contaminated and not high.rows[0].contaminated
    assert high.over_threshold == 1 and high.contaminated == 1 and high.rows[1].exact == 0
    assert compare(train, eval_texts, threshold=1.0).over_threshold == 1


def test_disjoint_sets_have_no_false_positive():
    train = [words(rng.randint(5, 80)) for _ in range(2000)]
    eval_texts = [words(rng.randint(5, 80)) for _ in range(300)]
    report = compare(train, eval_texts)
    assert report.contaminated == 0 and report.exact == 0
    assert dict(report.histogram())["0"] == 300
    assert report.examples(5) == []


def test_boilerplate_ngrams_in_many_training_rows_are_ignored():
    template = "Solve the following problem carefully and put the final answer in a box at the end: "
    train = [template + words(20) for _ in range(50)]
    eval_texts = [template + words(20), template + train[7].removeprefix(template)]
    report = compare(train, eval_texts, common=10)
    fresh, copied = report.rows
    assert fresh.fraction == 0 and not fresh.contaminated  # only the template is shared
    assert copied.exact == 7 and copied.fraction == 1.0
    assert report.boilerplate > 0
    counted_all = compare(train, eval_texts, common=0)
    # the 16-word template alone is 4 of the fresh row's 24 13-grams once nothing is ignored
    assert counted_all.rows[0].fraction == pytest.approx(4 / 24) and counted_all.boilerplate == 0


def test_histogram_bins_and_examples_order():
    report = OverlapReport(13, 0.5, 10, 10, 0, [])
    from trine.tasks.overlap import RowOverlap

    for i, f in enumerate([0, 0.1, 0.2, 0.5, 0.79, 0.8, 0.99, 1.0]):
        report.rows.append(RowOverlap(i, 20, None, f, 8, None, contaminated=f >= 0.5))
    report.rows.append(RowOverlap(8, 20, 3, 0.9, 8, 3, contaminated=True))
    report.eval_rows = len(report.rows)
    hist = dict(report.histogram())
    assert list(hist) == ["0", "(0, 0.2)", "[0.2, 0.4)", "[0.4, 0.6)", "[0.6, 0.8)", "[0.8, 1)", "1"]
    assert list(hist.values()) == [1, 1, 1, 1, 1, 3, 1]
    assert len(HISTOGRAM_BINS) == 5
    assert [r.index for r in report.examples(3)] == [8, 7, 6]  # exact first, then the highest share
    summary = report.summary()
    assert summary["contaminated"] == 6 and summary["histogram"]["1"] == 1 and "rows" not in summary


def test_bad_arguments_name_the_value_and_the_fix():
    with pytest.raises(ValueError, match=r"n=0; expected a whole number of words >= 1"):
        compare(["a"], ["a"], n=0)
    with pytest.raises(ValueError, match=r"threshold=1.5; expected a share of n-grams in \(0, 1\]"):
        compare(["a"], ["a"], threshold=1.5)
    with pytest.raises(ValueError, match=r"common=-1"):
        compare(["a"], ["a"], common=-1)


def test_task_texts_render_prompts_as_the_run_sees_them():
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    tasks = [
        Task("t/0", "What is 2+2?", answer=4, raw={"q": "2+2", "n": 1}, system_prompt="shared system"),
        Task("t/1", chat, answer=None, raw={"q": "hi"}),
    ]
    assert task_texts(tasks) == ["What is 2+2?", "Hi there"]  # system prompts left out
    assert task_texts(tasks, "answer") == ["4", ""]
    assert task_texts(tasks, "n") == ["1", ""]
    with pytest.raises(ValueError, match=r"field 'nope' is in no row of t.jsonl.*\['n', 'q'\]"):
        task_texts(tasks, "nope", where="t.jsonl")
    assert as_text({"b": 1, "a": [1]}) == '{"a": [1], "b": 1}'
