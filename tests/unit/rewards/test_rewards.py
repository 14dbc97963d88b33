"""Reward functions: hand-picked cases, garbage inputs, threads, timeouts and evaluate_reward."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import pytest

from trine.registry import resolve
from trine.rewards import REWARDS, evaluate_reward, exact_match, format_reward, math_reward, numeric_match
from trine.rewards.basic import extract_answer_tag, extract_last_number, strip_special_tokens
from trine.rewards.math import math_with_format
from trine.types import Task


def task(answer, **raw) -> Task:
    return Task(task_id="t0", question="q", answer=answer, raw=dict(raw))


# ---- helpers -------------------------------------------------------------------------------------


def test_strip_special_tokens_removes_trailing_tokens_only():
    assert strip_special_tokens("42<|im_end|>") == "42"
    assert strip_special_tokens("42 <|im_end|>\n<|endoftext|><|pad|>") == "42"
    assert strip_special_tokens("a</s>") == "a"
    assert strip_special_tokens("<|im_start|>x") == "<|im_start|>x"
    assert strip_special_tokens("<b>bold</b>") == "<b>bold</b>"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 42.", 42.0),
        ("first 3 then 7", 7.0),
        ("x = -5", -5.0),
        ("\u22127 degrees", -7.0),
        ("total: 1,234,567 apples", 1234567.0),
        ("about 3.25", 3.25),
        ("only .5 left", 0.5),
        ("it is 3/4", 0.75),
        ("it is -3/4", -0.75),
        (r"\frac{3}{4}", 0.75),
        ("1e-3", 0.001),
        ("#### 72", 72.0),
        ("no digits here", None),
        ("1/0", None),
        ("", None),
    ],
)
def test_extract_last_number(text, expected):
    assert extract_last_number(text) == expected


def test_extract_answer_tag():
    assert extract_answer_tag("<think>5</think><answer> 4 </answer>") == " 4 "
    assert extract_answer_tag("<answer>1</answer><answer>2</answer>") == "2"
    assert extract_answer_tag("cut off <answer>17") == "17"
    assert extract_answer_tag("no tags") == "no tags"


# ---- exact_match / numeric_match -----------------------------------------------------------------


def test_exact_match_cases():
    assert exact_match("Paris", task("Paris")) == 1.0
    assert exact_match("  paris \n<|im_end|>", task("Paris")) == 1.0
    assert exact_match("paris", task("Paris"), case_sensitive=True) == 0.0
    assert exact_match("Paris.", task("Paris")) == 0.0
    assert exact_match("Paris.", task("Paris"), strip_chars=".") == 1.0
    assert exact_match("Lyon", task("Paris")) == 0.0
    assert exact_match("42", task(42)) == 1.0
    assert exact_match("0.5", task(0.5)) == 1.0
    assert exact_match("b", task(["a", "B"])) == 1.0
    assert exact_match("", task("")) == 0.0  # an empty reference never matches


def test_numeric_match_cases():
    assert numeric_match("so the total is 1,000", task("1000")) == 1.0
    assert numeric_match("I get 3/4", task(0.75)) == 1.0
    assert numeric_match("x = -2.5<|endoftext|>", task("-5/2")) == 1.0
    assert numeric_match("The answer is 72.", task("Natalia sold 48/2 = 24 ... #### 72")) == 1.0
    assert numeric_match("it is 0.333", task(Fraction(1, 3))) == 0.0
    assert numeric_match("it is 0.333", task(Fraction(1, 3)), tol=1e-3) == 1.0
    assert numeric_match("7 then 8", task(7)) == 0.0  # the *last* number counts
    assert numeric_match("no number", task(7)) == 0.0
    with pytest.raises(ValueError, match="tol=-1"):
        numeric_match("1", task(1), tol=-1)


# ---- format -------------------------------------------------------------------------------------


def test_format_default_pattern():
    good = "<think>2+2 is 4</think>\n<answer>4</answer>"
    assert format_reward(good, task(4)) == 1.0
    assert format_reward(good + "<|im_end|>", task(4)) == 1.0
    assert format_reward(good, task(4), weight=0.25) == 0.25
    assert format_reward("<answer>4</answer>", task(4)) == 0.0
    assert format_reward("<think>x</think>", task(4)) == 0.0
    assert format_reward(good + " trailing text", task(4)) == 0.0
    assert format_reward("preamble " + good, task(4)) == 0.0


def test_format_custom_pattern_and_bad_pattern():
    assert format_reward("ANSWER: 5", task(5), pattern=r"ANSWER: \d+$") == 1.0
    assert format_reward("answer 5", task(5), pattern=r"ANSWER: \d+$") == 0.0
    with pytest.raises(ValueError, match="not a valid regular expression"):
        format_reward("x", task(1), pattern="(unclosed")


def test_format_is_fast_on_adversarial_100kb():
    text = "<think>" + "</answer><answer>" * 6000 + "</think>" * 100
    start = time.perf_counter()
    assert format_reward(text, task(1)) == 0.0
    assert time.perf_counter() - start < 1.0


# ---- math ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "answer", "expected"),
    [
        (r"So the result is \boxed{\frac{1}{2}}.", "0.5", 1.0),
        ("x=2", "2", 1.0),
        (r"The solutions satisfy $x = 2$", "2", 1.0),
        (r"\boxed{\sqrt 2}", r"\sqrt{2}", 1.0),
        (r"\boxed{(1, 2)}", "(1,2)", 1.0),
        ("<think>is it 5?</think><answer>4</answer>", "4", 1.0),
        ("<think>is it 4?</think><answer>5</answer>", "4", 0.0),
        (r"\boxed{2}", "3", 0.0),
        ("I give up", "3", 0.0),
        ("1/4", 0.25, 1.0),
        (r"\boxed{42}<|im_end|>", 42, 1.0),
    ],
)
def test_math_cases(response, answer, expected):
    parts = math_reward(response, task(answer))
    assert parts == {"accuracy": expected, "_timeout": 0.0}


def test_math_from_worker_threads():
    cases = [(rf"\boxed{{{i}/2}}", i / 2) for i in range(8)] + [(r"\boxed{7}", 8)]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda c: math_reward(c[0], task(c[1]))["accuracy"], cases))
    assert results == [1.0] * 8 + [0.0]

    seen = []
    thread = threading.Thread(target=lambda: seen.append(math_reward("0.5", task(r"\frac{1}{2}"))))
    thread.start()
    thread.join()
    assert seen == [{"accuracy": 1.0, "_timeout": 0.0}]


def test_math_pathological_input_returns_within_timeout():
    math_reward("1", task(1))  # make sure a worker is started, so startup is not timed
    start = time.perf_counter()
    # sympy evaluates 9**387420489 inside one C call that holds the GIL for minutes.
    parts = math_reward(r"\boxed{9^{9^{9}}}", task(1), timeout=1.0)
    elapsed = time.perf_counter() - start
    assert parts == {"accuracy": 0.0, "_timeout": 1.0}
    assert elapsed < 3.0
    assert evaluate_reward(math_reward, r"\boxed{9^{9^{9}}}", task(1), {"timeout": 0.5})[0] == 0.0
    # the stuck workers were killed and replaced: checks keep working
    assert math_reward(r"\boxed{3}", task(3))["accuracy"] == 1.0


def test_math_with_format_parts():
    good = "<think>1+1</think><answer>2</answer>"
    assert math_with_format(good, task(2)) == {"accuracy": 1.0, "format": 0.5, "_timeout": 0.0}
    assert evaluate_reward(math_with_format, good, task(2), {"format_weight": 0.2}) == (
        1.2,
        {"accuracy": 1.0, "format": 0.2, "_timeout": 0.0},
    )
    assert evaluate_reward(math_with_format, "2", task(2)) == (
        1.0,
        {"accuracy": 1.0, "format": 0.0, "_timeout": 0.0},
    )


def test_math_bad_args_raise():
    with pytest.raises(ValueError, match="timeout=0"):
        math_reward("1", task(1), timeout=0)


# ---- garbage never crashes ----------------------------------------------------------------------

GARBAGE_RESPONSES = [
    "",
    "   \n\t ",
    b"\xff\xfe".decode("utf-8", "replace"),
    "<|im_end|><|endoftext|>",
    "x" * 100_000,
    None,
]
GARBAGE_ANSWERS = [None, "", 17, 2.5, b"\xff\xfe".decode("utf-8", "replace"), 10**5000]
# llm_judge asks a model (tests/unit/rewards/test_judge.py); reasoning_gym scores reasoning-gym entries with
# the optional package (tests/unit/rewards/test_reasoning_gym.py feeds it garbage on real entries)
RULE_BASED = sorted(set(REWARDS) - {"llm_judge", "reasoning_gym"})


@pytest.mark.parametrize("name", RULE_BASED)
def test_garbage_response_gives_zero(name):
    for response in GARBAGE_RESPONSES:
        for answer in (None, 17, 2.5, "4"):
            total, parts = evaluate_reward(REWARDS[name], response, task(answer))
            assert total == 0.0, (name, response, answer, parts)


@pytest.mark.parametrize("name", RULE_BASED)
def test_garbage_answer_gives_zero(name):
    for answer in GARBAGE_ANSWERS:
        total, _ = evaluate_reward(REWARDS[name], "The answer is 3", task(answer))
        assert total == 0.0, (name, answer)


def test_huge_numeric_response_is_fast():
    start = time.perf_counter()
    assert numeric_match("9" * 100_000, task(9)) == 0.0  # overflows a float: no number
    assert numeric_match("1 " * 50_000, task(1)) == 1.0
    assert exact_match("1 " * 50_000, task(1)) == 0.0
    assert time.perf_counter() - start < 2.0


# ---- evaluate_reward / table --------------------------------------------------------------------


def nan_reward(response, task):
    return float("nan")


def parts_reward(response, task, bonus=0.0):
    return {"accuracy": 1.0, "format": 0.5 + bonus, "_timeout": 1.0}


def test_evaluate_reward_float_and_dict():
    assert evaluate_reward(exact_match, "a", task("a")) == (1.0, {})
    assert evaluate_reward(lambda r, t: Fraction(1, 4), "a", task("a")) == (0.25, {})
    total, parts = evaluate_reward(parts_reward, "r", task(1), {"bonus": 0.25})
    assert total == 1.75  # "_timeout" is a diagnostic, not summed
    assert parts == {"accuracy": 1.0, "format": 0.75, "_timeout": 1.0}


def test_evaluate_reward_rejects_bad_values():
    with pytest.raises(ValueError, match=r"nan_reward.*nan"):
        evaluate_reward(nan_reward, "r", task(1))
    with pytest.raises(ValueError, match=r"part 'a' = inf"):
        evaluate_reward(lambda r, t: {"a": float("inf")}, "r", task(1))
    with pytest.raises(ValueError, match=r"'1.0' of type str"):
        evaluate_reward(lambda r, t: "1.0", "r", task(1))
    with pytest.raises(ValueError, match="None"):
        evaluate_reward(lambda r, t: None, "r", task(1))
    with pytest.raises(ValueError, match="key 3"):
        evaluate_reward(lambda r, t: {3: 1.0}, "r", task(1))


def test_table_and_registry():
    assert set(REWARDS) == {
        "exact_match",
        "numeric_match",
        "math",
        "format",
        "math_with_format",
        "llm_judge",
        "reasoning_gym",
    }
    assert resolve("reward", "math") is math_reward
    assert resolve("reward", "trine.rewards.basic:exact_match") is exact_match


def test_import_is_cheap():
    code = "import sys, trine.rewards; print('math_verify' in sys.modules, 'sympy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_math_worker_survives_malformed_request_lines():
    """Issue 9 item 6: a line that is not a JSON request used to kill the worker process."""
    from trine.rewards.math import STARTUP_TIMEOUT, _Worker

    worker = _Worker()
    try:
        for bad in (b"this is not json\n", b"[1, 2]\n", b'{"gold": "1"}\n', b"\xff\xfe\n"):
            worker.proc.stdin.write(bad)
            reply = worker.replies.get(timeout=STARTUP_TIMEOUT)
            assert reply is not None, f"the worker died on {bad!r}"
            assert json.loads(reply)["ok"] is False and "error" in json.loads(reply)
        assert worker.ask({"gold": "1/2", "response": "0.5"}, timeout=30.0) == {"ok": True}
        assert worker.proc.poll() is None
    finally:
        worker.kill()
