"""The ``reasoning_gym`` reward: reasoning-gym's own ``score_answer`` on the task's entry.

`reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ ships procedural generators of
verifiable problems, each with a ``score_answer(answer, entry) -> float`` in [0, 1]. A taskset built by
the ``reasoning_gym`` generator (:mod:`trine.tasks.generators`) keeps each entry whole as ``task.raw``
(``{"question", "answer", "metadata"}``), and this reward hands the model's final answer and that entry to
the scorer of the generator named in ``metadata["source_dataset"]``: the reward is exactly what
reasoning-gym's own evaluations compute. Rows of a file exported from reasoning-gym work the same way.

**The final answer.** reasoning-gym scores the answer alone, not the reasoning around it; ``extract``
says how it is taken from the response (after trailing special tokens are stripped):

- ``answer_tag`` (default, reasoning-gym's convention and its system prompts'): the content of the
  last ``<answer>...</answer>``, stripped; a response without one scores 0;
- ``last_line``: the last non-empty line, stripped (models that answer plainly);
- ``whole``: the whole response, stripped.

**Partial credit.** Several scorers give partial credit: the default one gives
``len(oracle) / len(answer)`` when the oracle answer merely occurs in a longer answer, and numeric ones
give credit by distance. A policy can learn to exploit it (long answers that contain the oracle).
``partial_credit: false`` counts only a full score (1.0) and gives 0 otherwise. Either way the result
has the part ``score`` (the reward) and the diagnostic ``_exact`` (1 for a full score), logged next to it,
so that a rising reward with a flat ``_exact`` shows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

from trine.rewards.basic import clean_response
from trine.types import Task

EXTRACT_MODES = ("answer_tag", "last_line", "whole")
"""How the final answer is taken from a response (see the module docstring)."""


def reasoning_gym_reward(
    response: str,
    task: Task,
    *,
    extract: Literal["answer_tag", "last_line", "whole"] = "answer_tag",
    partial_credit: bool = True,
    dataset: str | None = None,
) -> dict[str, float]:
    """reasoning-gym's ``score_answer(final answer, task.raw)`` (see the module docstring).

    Args:
        extract: ``answer_tag``, ``last_line`` or ``whole``: how the final answer is taken.
        partial_credit: keep the scorer's fractional scores; False gives 0 for anything below 1.
        dataset: the generator whose scorer is used for rows without ``metadata.source_dataset``.

    Returns ``{"score": reward, "_exact": 1.0 if the scorer gave full marks else 0.0}``. A response the
    scorer cannot parse scores 0; a row that names no known generator is a configuration error (ValueError).
    """
    if extract not in EXTRACT_MODES:
        raise ValueError(f"reward_args.extract={extract!r}; expected one of {EXTRACT_MODES}.")
    entry = task.raw if isinstance(task.raw, dict) else {}
    score_answer = _scorer(_generator_of(entry, dataset, task.task_id))
    answer = final_answer(response, extract)
    try:
        score = float(score_answer(answer, entry)) if answer is not None else 0.0
    except Exception:  # a scorer choking on a garbage answer: that answer is wrong, not the run
        score = 0.0
    if not 0.0 <= score <= 1.0 or score != score:
        score = 0.0
    exact = 1.0 if score >= 1.0 else 0.0
    return {"score": score if partial_credit else exact, "_exact": exact}


def final_answer(response: Any, extract: str = "answer_tag") -> str | None:
    """The final answer in ``response`` as ``extract`` says (None: there is none to score)."""
    text = clean_response(response)
    if extract == "whole":
        return text
    if extract == "last_line":
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return lines[-1] if lines else ""
    end = text.rfind("</answer>")
    start = text.rfind("<answer>", 0, end) if end >= 0 else -1
    if start < 0:
        return None
    return text[start + len("<answer>") : end].strip()


def _generator_of(entry: dict[str, Any], dataset: str | None, task_id: str) -> str:
    metadata = entry.get("metadata")
    named = metadata.get("source_dataset") if isinstance(metadata, dict) else None
    if isinstance(named, str) and named:
        return named
    if dataset:
        return dataset
    raise ValueError(
        f"task {task_id!r}: the reasoning_gym reward needs the row's metadata.source_dataset (rows made by "
        f"generator: reasoning_gym have it; this row has keys {sorted(entry)}); build the taskset with "
        "generator: reasoning_gym, or name the generator with reward_args: {dataset: <name>}."
    )


@functools.cache
def _scorer(name: str) -> Callable[[str | None, dict[str, Any]], float]:
    try:
        import reasoning_gym
    except ImportError as err:
        raise ImportError(
            f"the reasoning_gym reward needs the reasoning-gym package ({err}); install it with "
            'pip install -e ".[envs]" (or pip install reasoning-gym).'
        ) from err
    try:
        return reasoning_gym.get_score_answer_fn(name)
    except ValueError:
        from reasoning_gym.factory import DATASETS

        raise ValueError(
            f"reasoning-gym has no generator {name!r} to score with; valid names: {', '.join(sorted(DATASETS))}."
        ) from None
