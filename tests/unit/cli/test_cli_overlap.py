"""``trine tasks overlap``: train/eval contamination on real taskset files and run configs."""

from __future__ import annotations

import json
import random

import pytest
from typer.testing import CliRunner

from tests.helpers import write_config
from trine.cli import app
from trine.tasks import TaskSet
from trine.tasks.overlap import normalize

runner = CliRunner()
rng = random.Random(1)
VOCAB = [f"word{i}" for i in range(2000)]


def _text(k: int) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(k)) + "."


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def files(tmp_path):
    """train.jsonl (20 rows); eval.jsonl: row 0 copies train row 4 (other case and punctuation), row 1
    shares 30 of its 40 words with train row 9 (18 of 28 13-grams), rows 2-4 are new."""
    train = [{"question": _text(40), "answer": str(i)} for i in range(20)]
    copied = train[4]["question"].upper().replace(".", " !")
    paraphrase = " ".join(train[9]["question"].split()[:30]) + " " + _text(10)
    rows = [{"question": copied, "answer": "4"}, {"question": paraphrase, "answer": "x"}]
    rows += [{"question": _text(40), "answer": str(i)} for i in range(3)]
    return _write(tmp_path / "train.jsonl", train), _write(tmp_path / "eval.jsonl", rows)


def _overlap(*args: object) -> object:
    return runner.invoke(app, ["tasks", "overlap", *map(str, args)])


def test_prints_counts_histogram_and_highlighted_examples(files):
    train, evals = files
    result = _overlap(train, evals)
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"train: {train} (20 rows)" in out and f"eval:  {evals} (5 rows)" in out
    assert "exact matches:          1 of 5 (20.0%), 1 of them with the same answer" in out
    assert "n-gram share >= 0.5:    2 of 5 (40.0%)" in out
    assert "contaminated:           2 of 5 (40.0%)" in out
    assert "examples (2 of 2):" in out
    assert "eval row 0 (task eval/0): exact match of row 4 (task train/4), same answer" in out
    assert "eval row 1 (task eval/1): 64% of its n-grams in training, most from row 9 (task train/9)" in out
    shared = " ".join(normalize(json.loads(train.read_text().splitlines()[9])["question"]).split()[:30])
    assert f"«{shared}»" in out  # the overlapping words, marked
    hist = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.startswith("  0 ")}
    assert hist == {"0": "3"}


def test_json_threshold_and_examples_options(files):
    train, evals = files
    result = _overlap(train, evals, "--json", "--threshold", "0.7", "--examples", "1")
    assert result.exit_code == 0, result.output
    (report,) = json.loads(result.stdout)["reports"]
    assert (report["exact"], report["over_threshold"], report["contaminated"]) == (1, 1, 1)
    assert report["share"] == pytest.approx(0.2) and report["n"] == 13 and report["field"] == "prompt"
    (example,) = report["examples"]
    assert example["eval_task"] == "eval/0" and example["train_task"] == "train/4" and example["exact"]
    assert example["same_answer"] is True and example["eval_text"].startswith("«")


def test_field_answer_and_short_ngrams(files):
    train, evals = files
    result = _overlap(train, evals, "--field", "answer", "--json")
    (report,) = json.loads(result.stdout)["reports"]
    # answers "4", "x", "0", "1", "2": four are training answers too; all shorter than 13 words
    assert report["exact"] == 4 and report["short_rows"] == 5
    small_n = json.loads(_overlap(train, evals, "--n", "5", "--json").stdout)["reports"][0]
    assert small_n["over_threshold"] == 2 and small_n["n"] == 5


def test_fail_over_exits_1_for_ci(files):
    train, evals = files
    failed = _overlap(train, evals, "--fail-over", "0.3")
    assert failed.exit_code == 1
    assert "contaminated share over --fail-over 0.3" in failed.output and "40.0%" in failed.output
    assert _overlap(train, evals, "--fail-over", "0.5").exit_code == 0


def test_clear_errors(files, tmp_path):
    train, evals = files
    missing = _overlap(train, tmp_path / "nope.jsonl")
    assert missing.exit_code == 2 and "nope.jsonl' does not exist" in missing.output
    field = _overlap(train, evals, "--field", "solution")
    assert field.exit_code == 2
    assert "field 'solution' is in no row of" in field.output and "['answer', 'question']" in field.output
    bad_n = _overlap(train, evals, "--n", "0")
    assert bad_n.exit_code == 2 and "n=0; expected a whole number of words >= 1" in bad_n.output
    key = _overlap(train, evals, "--prompt-key", "prompt")
    assert key.exit_code == 2 and "key 'prompt' (prompt_key) is missing" in key.output
    assert "--prompt-key" in key.output
    nothing = _overlap()
    assert nothing.exit_code == 2 and "needs TRAIN and EVAL" in nothing.output
    share = _overlap(train, evals, "--fail-over", "5")
    assert share.exit_code == 2 and "--fail-over 5.0; expected a share between 0 and 1" in share.output


def test_config_uses_each_tasksets_own_prompt_template(files, tmp_path):
    train, evals = files
    config = write_config(
        tmp_path / "run.yaml",
        model={"path": "model", "init_preset": "tiny-0.5m"},
        tasks={
            "total_steps": 1,
            "train": {"path": str(train)},
            "eval": [{"name": "held_out", "path": str(evals), "prompt_template": "Question: {question}"}],
        },
    )
    result = _overlap("--config", config, "--json")
    assert result.exit_code == 0, result.output
    (report,) = json.loads(result.stdout)["reports"]
    assert report["train"] == "tasks.train 'train'" and report["eval"] == "tasks.eval.0 'held_out'"
    # the template makes every eval prompt differ from the training prompts: no exact match any more...
    assert report["exact"] == 0 and report["over_threshold"] == 2
    assert report["examples"][0]["eval_task"] == "held_out/0"
    # ...while the rows' own field still matches exactly
    raw = json.loads(_overlap("--config", config, "--json", "--field", "question").stdout)["reports"][0]
    assert raw["exact"] == 1
    both = _overlap("--config", config, train, evals)
    assert both.exit_code == 2 and "give one of the two" in both.output


def test_config_generators_are_compared_as_the_run_makes_them(tmp_path):
    """A train and an eval taskset drawn from the same small space of problems (100 sums) share rows;
    the counts are those of the rows TaskSet generates for each name (default seeds)."""
    args = {"size": 60}
    config = write_config(
        tmp_path / "gen.yaml",
        model={"path": "model", "init_preset": "tiny-0.5m"},
        tasks={
            "total_steps": 1,
            "train": {"generator": "arithmetic", "generator_args": args},
            "mix": [
                {
                    "name": "extra",
                    "path": str(_write(tmp_path / "x.jsonl", [{"question": "9+9=", "answer": "18"}])),
                }
            ],
            "eval": [{"name": "test", "generator": "arithmetic", "generator_args": {"size": 30}}],
        },
    )
    result = _overlap("--config", config)
    assert result.exit_code == 0, result.output
    train = {t.question for t in TaskSet(generator="arithmetic", generator_args=args, name="train")}
    train.add("9+9=")
    test = [t.question for t in TaskSet(generator="arithmetic", generator_args={"size": 30}, name="test")]
    expected = sum(q in train for q in test)
    assert 0 < expected < 30
    assert "train: tasks.train 'train', tasks.mix.0 'extra' (61 rows)" in result.output
    assert f"exact matches:          {expected} of 30" in result.output
    assert "short rows:             30 with < 13 words: compared whole (exact only)" in result.output
