"""The one mask view (trine.inspect.mask_view) that `trine check` and `trine buffer head --tokens` print:
spans of trained and masked tokens, plain-text marking off a terminal, colour on one."""

from __future__ import annotations

import io

from rich.console import Console
from typer.testing import CliRunner

from tests.helpers import write_config
from trine.buffer.sql import SQLBuffer
from trine.cli import app
from trine.inspect.mask_view import MASK_CLOSE, MASK_OPEN, experience_spans, plain_text, print_spans
from trine.types import Experience


def _experience(tokenizer, reward=1.0, **fields) -> Experience:
    """A two-turn conversation: prompt, a move (trained), an observation (masked), a move (trained)."""
    prompt = tokenizer("Q: play", add_special_tokens=False)["input_ids"]
    move, obs, last = (
        tokenizer(t, add_special_tokens=False)["input_ids"] for t in (" left", " WALL!", " up")
    )
    mask = [1] * len(move) + [0] * len(obs) + [1] * len(last)
    return Experience(
        tokens=prompt + move + obs + last,
        prompt_length=len(prompt),
        action_mask=mask,
        logprobs=[-0.5 if m else 0.0 for m in mask],
        reward=reward,
        task_id="t0",
        **fields,
    )


def test_spans_cut_an_experience_at_its_mask(tokenizer):
    exp = _experience(tokenizer)
    spans = experience_spans(tokenizer, exp)
    assert [(s.text, s.trained) for s in spans] == [
        ("Q: play", False),
        (" left", True),
        (" WALL!", False),
        (" up", True),
    ]
    assert spans[0].start == 0 and spans[-1].end == len(exp.tokens)
    assert plain_text(spans) == f"{MASK_OPEN}Q: play{MASK_CLOSE} left{MASK_OPEN} WALL!{MASK_CLOSE} up"
    first = spans[1]  # without a tokenizer: the ids
    assert experience_spans(None, exp)[1].text == str(exp.tokens[first.start : first.end])


def test_print_marks_masked_text_off_a_terminal_and_colours_it_on_one(tokenizer):
    spans = experience_spans(tokenizer, _experience(tokenizer))
    plain = Console(file=io.StringIO(), width=200)
    print_spans(plain, spans, "episode 1")
    assert f"{MASK_OPEN} WALL!{MASK_CLOSE} up" in plain.file.getvalue()
    tty = Console(file=io.StringIO(), width=200, force_terminal=True)
    print_spans(tty, spans, "episode 1")
    out = tty.file.getvalue()
    assert "\x1b[" in out and MASK_OPEN not in out and "WALL!" in out


def test_buffer_head_tokens_shows_the_mask_view(tmp_path, tiny_model_dir, tokenizer):
    write_config(tmp_path / "config.yaml", buffer={"storage": "sql"}, model={"path": str(tiny_model_dir)})
    buffer = SQLBuffer(f"sqlite:///{tmp_path / 'buffer.db'}")
    buffer.put([_experience(tokenizer, info={"reward_parts": {"win": 1.0, "format": 0.0}})])
    buffer.close()
    result = CliRunner().invoke(app, ["buffer", "head", str(tmp_path), "--tokens"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "task t0, reward 1.000 (win 1, format 0), ready, version 0" in result.output
    assert f"{MASK_OPEN}Q: play{MASK_CLOSE} left{MASK_OPEN} WALL!{MASK_CLOSE} up" in result.output
