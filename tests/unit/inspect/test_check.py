"""``trine check CONFIG``: the real command on the session's tiny model, a broken chat template, and the
probes' FAIL paths on a real sampled conversation."""

from __future__ import annotations

import asyncio
import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from tests.helpers import write_arithmetic_config
from tests.unit.inspect.check_plugin import MARKER
from trine.cli import app
from trine.inspect.mask_view import MASK_CLOSE, MASK_OPEN
from trine.inspect.probes import (
    OBSERVATIONS,
    logprob_rows,
    mask_row,
    sample_conversations,
    truncation_gap,
)
from trine.models.sampling import kept_set
from trine.types import SamplingParams

WIDE = {
    "COLUMNS": "240",
    "LINES": "100",
}  # one table row per line (both: rich ignores COLUMNS alone under TERM=dumb)


def _check(args: list[str]) -> object:
    return CliRunner().invoke(app, ["check", *args], env=WIDE)


def _line(output: str, check: str) -> str:
    return next(line for line in output.splitlines() if line.startswith(f"│ {check}"))


def test_check_passes_on_the_tiny_model_and_prints_every_row(tmp_path, tiny_model_dir):
    config = write_arithmetic_config(tmp_path, tiny_model_dir, "check")
    result = _check([str(config), "--turns", "2"])
    assert result.exit_code == 0, result.output
    out = result.output
    for check in (
        "template round trip",
        "template incremental",
        "template end of turn",
        "action-mask alignment",
    ):
        assert "│ OK " in _line(out, check), _line(out, check)
    assert "│ WARN " in _line(out, "multi-turn token fidelity") or "│ OK " in _line(
        out, "multi-turn token fidelity"
    )
    for label in ("plain", "top_p=0.9", "top_k=20"):
        assert "│ OK " in _line(out, f"engine vs trainer logprobs ({label})")
    assert "│ INFO " in _line(out, "truncation gap (top_k=20)")
    assert "FAIL" not in out
    assert "│ OK " in _line(out, "episode 1 (single_turn, task ") and "│ OK " in _line(out, "episode 2 ")
    assert "│ OK " in _line(out, "reward probes")  # exact_match pays for none of the probes
    assert "--- episode 1 (single_turn, task " in out  # the real episodes are shown
    assert f"{MASK_OPEN}<|im_start|>user\n" in out  # their prompts masked (no colour off a terminal)


def test_check_json_output_parses_and_measures(tmp_path, tiny_model_dir):
    config = write_arithmetic_config(tmp_path, tiny_model_dir, "check_json")
    result = _check([str(config), "--json", "--turns", "2", "--seed", "3"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["ok"] is True and report["seed"] == 3 and report["dtype"] == "float32"
    assert result.stderr.startswith("trine check: loads ") and "expect about" in result.stderr  # said first
    rows = {row["check"]: row for row in report["rows"]}
    plain = rows["engine vs trainer logprobs (plain)"]["data"]
    assert len(plain["per_turn_max_abs"]) == 2 and max(plain["per_turn_max_abs"]) < 1e-4
    gap = rows["truncation gap (top_p=0.9)"]["data"]
    assert gap["tokens"] > 0 and 0 < gap["mean"] <= gap["max"]
    assert rows["action-mask alignment"]["data"]["problems"] == []
    trained = [s for s in report["conversation"] if s["trained"]]
    untrained = "".join(s["text"] for s in report["conversation"] if not s["trained"])
    assert len(trained) == 2 and OBSERVATIONS[0] in untrained and "<|im_start|>assistant" in untrained


def test_configured_truncation_is_replayed_by_the_trainer(tmp_path, tiny_model_dir):
    """The engine reports truncated logprobs and the trainer replays the truncation: they agree, and the
    gap to the untruncated policy is reported for information only (even --strict passes)."""
    config = write_arithmetic_config(tmp_path, tiny_model_dir, "check_top_p")
    result = _check([str(config), "tasks.train.sampling.top_p=0.8", "--json", "--strict", "--turns", "1"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    rows = {row["check"]: row for row in report["rows"]}
    gap = rows["truncation gap (top_p=0.8)"]
    assert gap["result"] == "INFO" and gap["data"]["mean"] > 0.1  # -log(0.8) = 0.22 on a flat model
    replayed = rows["engine vs trainer logprobs (top_p=0.8)"]
    assert replayed["result"] == "OK" and max(replayed["data"]["per_turn_max_abs"]) < 1e-4


def test_check_fails_on_a_template_that_drops_earlier_turns(tmp_path, tiny_model_dir):
    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_model_dir, broken)
    (broken / "chat_template.jinja").write_text(  # renders only the last message
        "{{- '<|im_start|>' + messages[-1]['role'] + '\\n' + messages[-1]['content'] + '<|im_end|>\\n' }}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    )
    config = write_arithmetic_config(tmp_path, broken, "check_broken")
    result = _check([str(config), "--turns", "2"])
    assert result.exit_code == 1, result.output
    row = _line(result.output, "template incremental")
    assert "│ FAIL " in row and "continuation" in row, row
    assert "│ SKIP " in _line(result.output, "action-mask alignment")
    assert "FAILED" in result.output


def test_kept_set_and_truncation_gap_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    logp = torch.log_softmax(logits, -1)
    assert kept_set(logp, 0, 0.6).tolist() == [[True, True, False]]  # 0 and 0.5 are <= 0.6 before them
    assert kept_set(logp, 2, 1.0).tolist() == [[True, True, False]]
    assert kept_set(logp, 2, 0.5).tolist() == [[True, False, False]]  # top-p over the top-2 renormalised
    gap, outside = truncation_gap(logits, torch.tensor([1]), 0, 0.6)
    assert outside == 0 and math.isclose(float(gap[0]), -math.log(0.8), rel_tol=1e-5)
    gap, outside = truncation_gap(logits, torch.tensor([2]), 1, 1.0)
    assert gap.numel() == 0 and outside == 1


@pytest.fixture(scope="module")
def sampled(tiny_model_dir):
    from trine.models import load_model, load_tokenizer
    from trine.models.engine import HFEngine

    model, tokenizer = load_model(tiny_model_dir), load_tokenizer(tiny_model_dir)
    engine = HFEngine(model, tokenizer, seed=0)
    params = SamplingParams(temperature=1.0, max_tokens=6)
    opening = [{"role": "user", "content": "2+3="}]
    try:
        (sample,) = asyncio.run(
            sample_conversations(engine, tokenizer, opening, [("plain", params, True)], 3, 0)
        )
    finally:
        engine.close()
    return model, tokenizer, sample


def test_logprobs_at_the_wrong_temperature_fail(sampled):
    model, tokenizer, sample = sampled
    (row,) = logprob_rows(model, tokenizer, sample, 1e-3)
    assert row.result == "OK" and len(row.data["per_turn_max_abs"]) == 3
    sample.params = sample.params.replace(temperature=0.5)  # the trainer recomputes at another temperature
    try:
        (row,) = logprob_rows(model, tokenizer, sample, 1e-3)
    finally:
        sample.params = sample.params.replace(temperature=1.0)
    assert row.result == "FAIL" and max(row.data["per_turn_max_abs"]) > 1e-3 and "temperature" in row.detail


def test_mask_check_catches_a_trained_observation_token(sampled):
    _, tokenizer, sample = sampled
    row, segments = mask_row(tokenizer, sample)
    assert row.result == "OK" and sum(s.trained for s in segments) == 3
    traj = sample.traj
    first_obs = traj.turns[0].end - traj.prompt_length  # the template token after turn 1
    traj.mask[first_obs] = 1
    try:
        row, _ = mask_row(tokenizer, sample)
    finally:
        traj.mask[first_obs] = 0
    assert row.result == "FAIL" and "not the sampled turns" in row.detail


PLUGIN = Path(__file__).with_name("check_plugin.py")


def test_check_plays_a_multi_turn_game_with_masked_observations(tmp_path, tiny_model_dir):
    """The configured game itself is played: its observation text shows as masked, the model's moves as
    trained, each turn's logprobs agree with the trainer's, and the reward is the game's."""
    game = {
        "answer_key": None,
        "workflow": "multi_turn",
        "workflow_args": {"env": "marker_game", "max_steps": 2},
        "sampling": {"max_tokens": 3},
    }
    config = write_arithmetic_config(tmp_path, tiny_model_dir, "check_game", {"tasks": {"train": game}})
    args = [str(config), "--plugin", str(PLUGIN), "--turns", "1", "--episodes", "1"]
    result = _check(args)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "--- episode 1 (multi_turn, task train/0): reward 1 " in out
    view = out.split("--- episode 1 ", 1)[1].split("\n", 1)[1].split("trine check")[0]
    masked = [part.split(MASK_CLOSE, 1)[0] for part in view.split(MASK_OPEN)[1:]]
    trained = "".join(part.split(MASK_CLOSE, 1)[1] for part in view.split(MASK_OPEN)[1:])
    assert any(MARKER in m for m in masked) and MARKER not in trained  # the observation is masked
    assert "Make a move." in masked[0]  # the reset observation is in the prompt
    assert trained.strip()  # the moves train
    assert "│ OK " in _line(out, "episode 1 (multi_turn")
    assert "│ INFO " in _line(out, "reward probes")  # no reference answers to probe

    report = json.loads(_check([*args, "--json"]).stdout)
    (episode,) = report["episodes"]
    (step,) = episode["steps"]
    assert episode["episode_return"] == 1.0 and len(step["turns"]) == 2
    assert all(t["max_abs"] < 1e-4 for t in step["turns"])
    spans = step["spans"]
    assert [s["trained"] for s in spans][:2] == [False, True] and spans[-1]["end"] > spans[-1]["start"]
    assert any(MARKER in s["text"] and not s["trained"] for s in spans)
    assert not any(MARKER in s["text"] for s in spans if s["trained"])


def test_reward_probes_warn_on_a_hackable_reward(tmp_path, tiny_model_dir):
    """A reward that pays for the answer anywhere in the response: padded, repeated and junk-appended
    answers score as much as the correct one: WARN (exit 0), --strict exit 1."""
    train = {"train": {"reward": "contains_answer"}}
    config = write_arithmetic_config(tmp_path, tiny_model_dir, "check_hack", {"tasks": train})
    args = [str(config), "--plugin", str(PLUGIN), "--turns", "1", "--episodes", "1"]
    result = _check(args)
    assert result.exit_code == 0, result.output
    row = _line(result.output, "reward probes")
    assert "│ WARN " in row and "'padded' on task train/0 scores 1 vs the correct answer's 1" in result.output
    assert "reward 0 (found 0, length_bonus 0)" in result.output  # the episode's reward parts
    strict = _check([*args, "--strict", "--json"])
    assert strict.exit_code == 1
    rows = {r["check"]: r for r in json.loads(strict.stdout)["rows"]}
    flagged = {(f["task_id"], f["probe"]) for f in rows["reward probes"]["data"]["flagged"]}
    assert {("train/0", "padded"), ("train/0", "repeated"), ("train/0", "junk appended")} <= flagged
    assert not any(probe == "empty" for _, probe in flagged)
