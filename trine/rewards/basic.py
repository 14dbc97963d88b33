"""Simple string rewards: exact match, numeric match and format, plus the text helpers they share.

Every reward here follows the contract of :mod:`trine.rewards`: ``fn(response, task, **reward_args)``
returns a float, and garbage in (empty text, replacement characters, trailing special tokens, huge
strings, a missing or non-string answer) gives 0.0 rather than an exception. Bad *arguments*
(a negative tolerance, an invalid regex) are configuration errors and raise ``ValueError``.
"""

from __future__ import annotations

import functools
import math
import numbers
import re
from decimal import Decimal
from typing import Any

from trine.types import Task

# Special tokens a sampled response may end with: <|im_end|>, <|endoftext|>, <|eot_id|>, </s>, ...
_SPECIAL_TOKEN_AT_END = re.compile(r"(?:<\|[^<>|\s]{1,64}\|>|</s>|<eos>|<end_of_turn>|<pad>)\Z")

_NUMBER = re.compile(
    r"(?<![\d.])(?P<sign>[-+\u2212]?)(?:"
    r"\\[dt]?frac\{\s*(?P<fnum>\d+)\s*\}\{\s*(?P<fden>\d+)\s*\}"  # \frac{3}{4}
    r"|(?P<num>\d+)/(?P<den>\d+)"  # 3/4
    r"|(?P<dec>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)"
    r")"
)

DEFAULT_FORMAT_PATTERN = r"\A\s*<think>(?:(?!</think>).)*</think>\s*<answer>(?:(?!</answer>).)*</answer>\s*\Z"
"""One ``<think>...</think>`` block followed by one ``<answer>...</answer>`` block and nothing else.

Written with tempered tokens instead of ``.*?`` so matching stays linear on huge responses."""


def as_text(value: Any) -> str:
    """Any value as text: None -> "", bytes decoded with replacement chars, numbers without exponent."""
    try:
        if value is None:
            return ""
        if isinstance(value, str):
            return value
        if isinstance(value, (bytes, bytearray)):
            return bytes(value).decode("utf-8", "replace")
        if isinstance(value, float):
            return format(Decimal(repr(value)), "f") if math.isfinite(value) else ""
        return str(value)
    except Exception:  # e.g. ints longer than sys.get_int_max_str_digits(), broken __str__
        return ""


def strip_special_tokens(text: str) -> str:
    """Remove trailing special tokens (``<|im_end|>``, ``<|endoftext|>``, ``</s>``...) and whitespace."""
    text = text.rstrip()
    while text.endswith(">"):
        found = _SPECIAL_TOKEN_AT_END.search(text, max(0, len(text) - 80))
        if found is None:
            break
        text = text[: found.start()].rstrip()
    return text


def clean_response(response: Any) -> str:
    """The response as stripped text without trailing special tokens (never raises)."""
    return strip_special_tokens(as_text(response)).strip()


def extract_answer_tag(text: str, tag: str = "answer") -> str:
    """Content of the last ``<tag>...</tag>`` in ``text`` (or what follows an unclosed last
    ``<tag>``); ``text`` itself when the tag does not occur. Linear time on any input."""
    opening, closing = f"<{tag}>", f"</{tag}>"
    end = text.rfind(closing)
    start = text.rfind(opening, 0, end if end >= 0 else len(text))
    if start < 0:
        return text
    if end < 0:
        return text[start + len(opening) :]
    return text[start + len(opening) : end]


def _normalise(text: str, case_sensitive: bool, strip_chars: str | None) -> str:
    text = text.strip()
    if strip_chars:
        text = text.strip(strip_chars + " \t\r\n")
    return text if case_sensitive else text.casefold()


def exact_match(
    response: str,
    task: Task,
    case_sensitive: bool = False,
    strip_chars: str | None = None,
) -> float:
    """1.0 if the response equals the reference answer, else 0.0.

    Both sides are stripped of whitespace (and of ``strip_chars``, e.g. ``"."``), trailing special
    tokens are removed from the response, and the comparison ignores case unless
    ``case_sensitive``. ``task.answer`` may be a string, a number or a list of accepted answers;
    None or an empty answer never matches.
    """
    answers = task.answer if isinstance(task.answer, (list, tuple)) else [task.answer]
    pred = _normalise(clean_response(response), case_sensitive, strip_chars)
    for answer in answers:
        gold = _normalise(as_text(answer), case_sensitive, strip_chars)
        if gold and pred == gold:
            return 1.0
    return 0.0


def _number_from_match(found: re.Match[str]) -> float | None:
    sign = -1.0 if found["sign"] in ("-", "\u2212") else 1.0
    if found["fden"] is not None or found["den"] is not None:
        num = int(found["fnum"] or found["num"])
        den = int(found["fden"] or found["den"])
        return sign * num / den if den else None
    value = float(found["dec"].replace(",", ""))
    return sign * value if math.isfinite(value) else None


def extract_last_number(text: str) -> float | None:
    """The last number in ``text`` as a float, or None.

    Understands integers, decimals (``.5``, ``3.14``), signs (``-2``, ``−2``), thousands
    separators (``1,234,567``), exponents (``1e-3``) and simple fractions (``3/4``,
    ``\\frac{3}{4}``). Numbers that overflow a float and fractions over zero are skipped.
    """
    last = None
    for found in _NUMBER.finditer(text):
        try:
            value = _number_from_match(found)
        except (ValueError, OverflowError):  # a 5000-digit numerator, ...
            value = None
        if value is not None:
            last = value
    return last


def answer_number(answer: Any) -> float | None:
    """The reference answer as a finite float: numbers as they are, text by its last number."""
    if isinstance(answer, numbers.Real):
        try:
            value = float(answer)
        except (OverflowError, ValueError):
            return None
        return value if math.isfinite(value) else None
    return extract_last_number(as_text(answer))


def numeric_match(response: str, task: Task, tol: float = 1e-6) -> float:
    """1.0 if the last number in the response equals the numeric answer within ``tol``.

    ``tol`` is both a relative and an absolute tolerance (``math.isclose(pred, gold,
    rel_tol=tol, abs_tol=tol)``). The answer may be a number or a text whose last number is the
    answer (e.g. GSM8K's ``"... #### 72"``). 0.0 when either side has no number.
    """
    if not isinstance(tol, numbers.Real) or not tol >= 0:
        raise ValueError(f"numeric_match: tol={tol!r}; expected a number >= 0 (e.g. tol: 1.0e-6).")
    gold = answer_number(task.answer)
    if gold is None:
        return 0.0
    pred = extract_last_number(clean_response(response))
    if pred is None:
        return 0.0
    return 1.0 if math.isclose(pred, gold, rel_tol=float(tol), abs_tol=float(tol)) else 0.0


@functools.lru_cache(maxsize=64)
def compile_pattern(pattern: str) -> re.Pattern[str]:
    """Compile a format regex with DOTALL, naming the pattern when it is invalid."""
    try:
        return re.compile(pattern, re.DOTALL)
    except (re.error, TypeError) as err:
        raise ValueError(
            f"format pattern {pattern!r} is not a valid regular expression ({err}); "
            "fix the 'pattern' reward argument."
        ) from err


def format_reward(
    response: str,
    task: Task | None = None,
    pattern: str = DEFAULT_FORMAT_PATTERN,
    weight: float = 1.0,
) -> float:
    """``weight`` if the response (without trailing special tokens) matches ``pattern``, else 0.0.

    The pattern is searched with ``re.DOTALL`` (anchor it with ``\\A``/``\\Z`` for a full match).
    The default asks for ``<think>...</think>`` followed by ``<answer>...</answer>``. ``task`` is
    unused; it is there so the function follows the reward contract.
    """
    if not isinstance(pattern, str):
        raise ValueError(f"format: pattern={pattern!r}; expected a regular expression string.")
    matched = compile_pattern(pattern).search(clean_response(response)) is not None
    return float(weight) if matched else 0.0
