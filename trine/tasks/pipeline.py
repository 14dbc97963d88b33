"""Task pipeline: curate task rows (plain dicts) before training.

A pipeline is a list of steps, each ``rows -> rows``, given as ``{"name": <step>, **arguments}``
(``name`` one of :data:`TASK_STEPS` or an import path ``"package.module:attr"`` of a function
``fn(rows, **arguments) -> rows``) or as a callable ``rows -> rows``:

- formatters: ``extract_boxed`` (the answer inside the last ``\\boxed{...}``), ``normalize`` (strip,
  collapse whitespace, lowercase, Unicode-normalize fields);
- filters: ``length`` (bounds on a field's length), ``regex`` (include/exclude patterns),
  ``dedup`` (first row per value of a field);
- scores: ``difficulty_nll`` (an auxiliary model's mean NLL of the reference answer),
  ``pass_rate`` (the fraction of ``k`` samples of a model that a reward function accepts);
- ``sort`` (priority order by a score column, e.g. easy to hard) and ``export`` (jsonl/parquet).

Trinity-RFT report v2 §2.3.2 (task curation and prioritization), v1 Appendix B. The Data-Juicer
bridge plugs in as the step ``"trine.buffer.data_juicer:process_task_rows"``. Models are imported
lazily (``trine.models``); reward functions are passed in (a callable, or a reward name resolved
through the registry).
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import unicodedata
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from trine.types import SamplingParams, Task

Rows = list[dict[str, Any]]

# -- formatters ------------------------------------------------------------------------------------

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*")


def extract_boxed(text: Any) -> str | None:
    r"""The content of the last ``\boxed{...}`` (or ``\fbox{...}``, or ``\boxed x``) in ``text``,
    with nested braces kept; None when there is none or its braces do not close."""
    if not isinstance(text, str):
        return None
    for found in reversed(list(_BOXED.finditer(text))):
        start = found.end()
        if start < len(text) and text[start] == "{":
            content = _braced(text, start)
            if content is not None:
                return content.strip()
        elif found.group()[-1].isspace():  # "\boxed 5"
            word = re.match(r"[^\s$]+", text[start:])
            if word:
                return word.group()
    return None


def _braced(text: str, start: int) -> str | None:
    """The text inside the brace group opening at ``text[start]``; None if it never closes."""
    depth, i = 0, start
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2  # an escaped character (\{ \} \\) never opens or closes a group
            continue
        depth += ch == "{"
        depth -= ch == "}"
        if depth == 0:
            return text[start + 1 : i]
        i += 1
    return None


def boxed_answer(
    rows: Rows, *, field: str = "solution", to: str = "answer", on_missing: str = "keep"
) -> Rows:
    r"""Set ``row[to]`` to :func:`extract_boxed` of ``row[field]``. Rows without a ``\boxed``:
    ``on_missing="keep"`` (unchanged), ``"drop"`` or ``"error"``."""
    _choice("on_missing", on_missing, ("keep", "drop", "error"))
    out = []
    for number, row in enumerate(rows):
        answer = extract_boxed(row.get(field))
        if answer is None:
            if on_missing == "error":
                raise ValueError(
                    f"row #{number} field {field!r} has no \\boxed{{...}} answer: {str(row.get(field))[:80]!r}; "
                    "fix the data or use on_missing='keep'/'drop'."
                )
            if on_missing == "drop":
                continue
            out.append(row)
            continue
        out.append({**row, to: answer})
    return out


def normalize(
    rows: Rows,
    *,
    fields: list[str] | str,
    strip: bool = True,
    collapse_whitespace: bool = True,
    lowercase: bool = False,
    unicode_form: str | None = "NFKC",
) -> Rows:
    """Normalize the text ``fields`` of every row (non-text values are left alone)."""
    if unicode_form is not None:
        _choice("unicode_form", unicode_form, ("NFC", "NFKC", "NFD", "NFKD"))
    names = [fields] if isinstance(fields, str) else list(fields)
    out = []
    for row in rows:
        row = dict(row)
        for name in names:
            value = row.get(name)
            if not isinstance(value, str):
                continue
            if unicode_form:
                value = unicodedata.normalize(unicode_form, value)
            if collapse_whitespace:
                value = re.sub(r"\s+", " ", value)
            if strip:
                value = value.strip()
            row[name] = value.lower() if lowercase else value
        out.append(row)
    return out


# -- filters ---------------------------------------------------------------------------------------


def length_filter(
    rows: Rows, *, field: str, min_length: int = 0, max_length: int | None = None, unit: str = "chars"
) -> Rows:
    """Keep rows whose ``field`` has ``min_length <= length <= max_length`` (``unit``: chars or
    words; a missing field has length 0)."""
    _choice("unit", unit, ("chars", "words"))

    def size(value: Any) -> int:
        text = "" if value is None else value if isinstance(value, str) else json.dumps(value)
        return len(text.split()) if unit == "words" else len(text)

    upper = math.inf if max_length is None else max_length
    return [r for r in rows if min_length <= size(r.get(field)) <= upper]


def regex_filter(
    rows: Rows,
    *,
    field: str,
    include: str | None = None,
    exclude: str | None = None,
    ignore_case: bool = False,
) -> Rows:
    """Keep rows whose ``field`` matches ``include`` (``re.search``) and does not match ``exclude``."""
    flags = re.IGNORECASE if ignore_case else 0
    try:
        inc = re.compile(include, flags) if include else None
        exc = re.compile(exclude, flags) if exclude else None
    except re.error as err:
        raise ValueError(
            f"regex filter pattern is invalid ({err}): include={include!r}, exclude={exclude!r}."
        ) from None
    out = []
    for row in rows:
        text = str(row.get(field) or "")
        if (inc is None or inc.search(text)) and not (exc and exc.search(text)):
            out.append(row)
    return out


def dedup(rows: Rows, *, field: str, normalize_text: bool = True) -> Rows:
    """Keep the first row for each value of ``field`` (compared case- and whitespace-insensitively
    when ``normalize_text``)."""
    seen: set[str] = set()
    out = []
    for row in rows:
        value = row.get(field)
        key = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        if normalize_text:
            key = " ".join(key.split()).lower()
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out


# -- scores ----------------------------------------------------------------------------------------


def _task(
    row: dict[str, Any], number: int, prompt_key: str, answer_key: str | None, system_prompt: str | None
) -> Task:
    question = row.get(prompt_key)
    if not isinstance(question, (str, list)):
        raise ValueError(
            f"row #{number} has no prompt in field {prompt_key!r} (keys: {sorted(row)}); set prompt_key."
        )
    answer = row.get(answer_key) if answer_key else None
    return Task(task_id=str(number), question=question, answer=answer, raw=row, system_prompt=system_prompt)


def nll_difficulty(
    rows: Rows,
    *,
    model: Any,
    tokenizer: Any = None,
    prompt_key: str = "question",
    answer_key: str = "answer",
    system_prompt: str | None = None,
    column: str = "difficulty",
    batch_size: int = 8,
    device: str = "cpu",
    dtype: str = "float32",
) -> Rows:
    """``row[column]`` = the auxiliary ``model``'s mean negative log-likelihood per token of the
    reference answer given the (chat-templated) prompt — higher is harder; None without an answer.

    ``model``: a local model directory, or a loaded model with ``tokenizer`` a loaded tokenizer.
    """

    from trine.models.chat import encode_prompt

    lm, tok = _load(model, tokenizer, device, dtype)
    pairs: list[tuple[int, list[int], list[int]]] = []
    for number, row in enumerate(rows):
        task = _task(row, number, prompt_key, answer_key, system_prompt)
        if task.answer is None:
            continue
        prompt = encode_prompt(tok, task.messages()) if getattr(tok, "chat_template", None) else None
        prompt = prompt or tok(str(task.question), add_special_tokens=True)["input_ids"] or [tok.eos_token_id]
        answer = tok(str(task.answer), add_special_tokens=False)["input_ids"]
        if answer:
            pairs.append((number, prompt, answer))
    scores = _mean_nll(lm, tok.pad_token_id or 0, pairs, batch_size)
    return [{**row, column: scores.get(number)} for number, row in enumerate(rows)]


def _mean_nll(
    lm: Any, pad_id: int, pairs: list[tuple[int, list[int], list[int]]], batch_size: int
) -> dict[int, float]:
    """``{row number: mean NLL of the answer ids given the prompt ids}``."""
    from trine.models.batching import response_logprobs

    scores = response_logprobs(
        lm, [(p, a) for _, p, a in pairs], pad_id=pad_id, token_budget=max(1, batch_size) * 512
    )
    return {number: -sum(lp) / len(lp) for (number, _, _), lp in zip(pairs, scores)}


def _load(model: Any, tokenizer: Any, device: str, dtype: str) -> tuple[Any, Any]:
    from trine.models import load_model, load_tokenizer

    if isinstance(model, (str, os.PathLike)):
        return load_model(model, dtype=dtype, device=device), load_tokenizer(tokenizer or model)
    if tokenizer is None:
        raise ValueError(
            "a loaded model needs its tokenizer: pass tokenizer= (a tokenizer or its directory)."
        )
    return model, load_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer


def pass_rate(
    rows: Rows,
    *,
    reward: Callable[..., Any] | str,
    engine: Any = None,
    model: Any = None,
    tokenizer: Any = None,
    device: str = "cpu",
    k: int = 4,
    prompt_key: str = "question",
    answer_key: str | None = "answer",
    system_prompt: str | None = None,
    reward_args: dict[str, Any] | None = None,
    temperature: float = 1.0,
    max_tokens: int = 64,
    threshold: float = 1.0,
    column: str = "pass_rate",
    difficulty_column: str | None = "difficulty",
    batch_size: int = 16,
    seed: int = 0,
) -> Rows:
    """``row[column]`` = the fraction of ``k`` sampled responses whose reward is ``>= threshold``
    (and ``row[difficulty_column] = 1 - pass_rate``).

    ``engine``: an engine with ``encode_chat(messages)`` and ``generate_batch([(prompt_ids,
    SamplingParams), ...])`` (e.g. :class:`trine.models.engine.HFEngine`), or ``model`` (a local
    model directory, or a loaded model with its ``tokenizer``) to build one from on ``device``. ``reward``: ``fn(response, task, **reward_args) -> float |
    dict`` (a dict's parts not starting with ``_`` are summed), or a reward name / import path.
    """
    if k < 1:
        raise ValueError(f"pass_rate k={k}; expected at least 1 sample per task.")
    if isinstance(reward, str):
        from trine.registry import resolve

        reward = resolve("reward", reward)
    tasks = [_task(row, n, prompt_key, answer_key, system_prompt) for n, row in enumerate(rows)]
    own = engine is None
    if own:
        if model is None:
            raise ValueError(
                "pass_rate needs engine= (a rollout engine) or model= (a local model directory)."
            )
        from trine.models.engine import HFEngine

        engine = HFEngine(*_load(model, tokenizer, device, "float32"), seed=seed)
    try:
        params = SamplingParams(temperature, max_tokens=max_tokens, n=k)
        rates = _pass_rates(engine, tasks, reward, reward_args or {}, params, threshold, batch_size, seed)
    finally:
        if own:
            engine.close()
    out = []
    for row, rate in zip(rows, rates):
        row = {**row, column: rate}
        if difficulty_column:
            row[difficulty_column] = 1.0 - rate
        out.append(row)
    return out


def _pass_rates(
    engine: Any,
    tasks: list[Task],
    reward: Callable[..., Any],
    reward_args: dict[str, Any],
    params: SamplingParams,
    threshold: float,
    batch_size: int,
    seed: int,
) -> list[float]:
    """Per task, the share of ``params.n`` samples whose reward reaches ``threshold``."""
    rates = []
    for start in range(0, len(tasks), batch_size):
        chunk = tasks[start : start + batch_size]
        requests = [
            (engine.encode_chat(t.messages()), params.replace(seed=seed + (start + i) * params.n))
            for i, t in enumerate(chunk)
        ]
        for task, completions in zip(chunk, engine.generate_batch(requests)):
            scores = [_total(reward(c.text, task, **reward_args)) for c in completions]
            rates.append(sum(s >= threshold for s in scores) / len(scores))
    return rates


def _total(value: Any) -> float:
    if isinstance(value, dict):
        value = sum(float(v) for key, v in value.items() if not str(key).startswith("_"))
    value = float(value)
    return value if math.isfinite(value) else -math.inf


# -- ordering and export ---------------------------------------------------------------------------


def sort_rows(rows: Rows, *, by: str, descending: bool = False) -> Rows:
    """Rows ordered by the score column ``by`` (stable; rows without a score go last)."""

    def has_score(row: dict[str, Any]) -> bool:
        value = row.get(by)
        return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)

    scored = [r for r in rows if has_score(r)]
    missing = [r for r in rows if not has_score(r)]
    return sorted(scored, key=lambda r: r[by], reverse=descending) + missing


def export(rows: Rows, *, path: str | os.PathLike[str]) -> Rows:
    """Write the rows to ``path`` (``.jsonl`` or ``.parquet``) and return them unchanged."""
    write_rows(rows, path)
    return rows


def write_rows(rows: Rows, path: str | os.PathLike[str]) -> Path:
    """Write rows as a taskset file: ``.jsonl`` (one JSON object per line) or ``.parquet``."""
    path = Path(path).expanduser()
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".parquet"):
        raise ValueError(f"taskset output {str(path)!r} has suffix {suffix!r}; expected .jsonl or .parquet.")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    if suffix == ".jsonl":
        with open(tmp, "w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(list(rows)), tmp)
    os.replace(tmp, path)
    return path


# -- running a pipeline ----------------------------------------------------------------------------

TASK_STEPS: dict[str, Callable[..., Rows]] = {
    "extract_boxed": boxed_answer,
    "normalize": normalize,
    "length": length_filter,
    "regex": regex_filter,
    "dedup": dedup,
    "difficulty_nll": nll_difficulty,
    "pass_rate": pass_rate,
    "sort": sort_rows,
    "export": export,
}


def _choice(name: str, value: Any, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ValueError(f"{name}={value!r}; expected one of {options}.")


def _resolve_step(step: Any, index: int) -> tuple[str, Callable[[Rows], Rows]]:
    if callable(step):
        return getattr(step, "__name__", f"step{index}"), step
    if not isinstance(step, dict) or not isinstance(step.get("name"), str):
        raise ValueError(
            f"task pipeline step #{index} is {step!r}; expected {{'name': <step>, **arguments}} or a callable "
            "rows -> rows."
        )
    name, args = step["name"], {k: v for k, v in step.items() if k != "name"}
    if name in TASK_STEPS:
        fn = TASK_STEPS[name]
    elif ":" in name:
        from trine.registry import import_object

        fn = import_object(name)
    else:
        from trine.registry import unknown_message

        raise ValueError(unknown_message("task step", name, TASK_STEPS))
    return name, lambda rows: fn(rows, **args)


def run_task_pipeline(
    rows: Iterable[dict[str, Any]], steps: Iterable[Any], report: dict[str, float] | None = None
) -> Rows:
    """Run the steps in order over the rows and return the result.

    ``report``, if given, is filled with ``task_pipeline/<name>/in``, ``/out`` and ``/seconds``
    for each step (repeated names get ``_2``, ``_3``...).
    """
    rows = [dict(r) for r in rows]
    resolved = [_resolve_step(step, i) for i, step in enumerate(steps)]  # fail before any work
    seen: dict[str, int] = {}
    for name, fn in resolved:
        seen[name] = seen.get(name, 0) + 1
        key = f"task_pipeline/{name if seen[name] == 1 else f'{name}_{seen[name]}'}"
        start, before = time.perf_counter(), len(rows)
        rows = list(fn(rows))
        if report is not None:
            report.update(
                {f"{key}/in": before, f"{key}/out": len(rows), f"{key}/seconds": time.perf_counter() - start}
            )
    return rows


def read_rows(path: str | os.PathLike[str], split: str | None = None) -> Rows:
    """All rows of a local taskset source (jsonl/json/parquet file, or a dataset directory)."""
    from trine.tasks.taskset import iter_rows

    rows = []
    for where, row in iter_rows(Path(path).expanduser(), split):
        if not isinstance(row, dict):
            raise ValueError(f"{where}: expected a JSON object, got {row!r}; fix the data.")
        rows.append(row)
    return rows


def process_taskset(
    in_path: str | os.PathLike[str],
    out_path: str | os.PathLike[str],
    steps: Iterable[Any],
    split: str | None = None,
) -> dict[str, float]:
    """Read a taskset, run the pipeline, write the result (``.jsonl``/``.parquet``); return the report
    (``task_pipeline/rows_in``, ``task_pipeline/rows_out`` and each step's counts)."""
    rows = read_rows(in_path, split)
    report: dict[str, float] = {"task_pipeline/rows_in": len(rows)}
    rows = run_task_pipeline(rows, steps, report)
    write_rows(rows, out_path)
    report["task_pipeline/rows_out"] = len(rows)
    return report
