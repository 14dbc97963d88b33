"""LLM-as-judge reward: an auxiliary model (``explorer.auxiliary_models``) grades the response.

``reward: llm_judge`` with ``reward_args: {judge: judge}`` asks the model named ``judge`` — a local model
or an OpenAI-compatible endpoint — with ``template`` filled in with the task's question, reference answer
and the response (and any field of the task's row, ``{row[difficulty]}``), and reads its verdict: a reply
starting with yes / no (also correct / incorrect, true / false) is 1 / 0; otherwise its first number,
divided by ``scale`` and clipped to [0, 1] when ``scale`` is given. A reply it cannot read raises
``ValueError`` with the reply: a failed judgement is an error (a skipped task, or ``reward_error`` in
multi-turn workflows), never a silent 0.

The request runs on the explorer's event loop (:meth:`trine.models.auxiliary.AuxiliaryModels.ask`), at
most ``timeout`` seconds; the explorer's ``explorer.reward_timeout`` bounds the whole call too.
"""

from __future__ import annotations

import re
from typing import Any

from trine.types import Task

DEFAULT_TEMPLATE = (
    "Question:\n{question}\n\nReference answer:\n{answer}\n\nResponse:\n{response}\n\n"
    "Is the response correct? Reply with yes or no."
)
_YES = ("yes", "correct", "true", "right")
_NO = ("no", "incorrect", "false", "wrong")


def llm_judge(
    response: str,
    task: Task,
    *,
    models: Any,
    judge: str = "judge",
    template: str = DEFAULT_TEMPLATE,
    system: str | None = None,
    scale: float | None = None,
    max_tokens: int = 16,
    timeout: float = 60.0,
) -> dict[str, float]:
    """Score ``response`` with the auxiliary model ``judge`` (see the module docstring); returns
    ``{"judge": score}``."""
    if scale is not None and scale <= 0:
        raise ValueError(
            f"llm_judge scale={scale!r}; expected a positive number (the top of the judge's scale)"
        )
    question = task.question if isinstance(task.question, str) else _last_user(task.question)
    try:
        prompt = template.format(question=question, answer=task.answer, response=response, row=task.raw)
    except (KeyError, IndexError) as err:
        raise ValueError(
            f"llm_judge template has the unknown field {err}; use {{question}}, {{answer}}, {{response}} or "
            "{row[key]}"
        ) from None
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": prompt}
    ]
    reply = models.ask(judge, messages, max_tokens=max_tokens, timeout=timeout)
    return {"judge": parse_verdict(reply, scale, judge)}


def parse_verdict(reply: str, scale: float | None = None, judge: str = "judge") -> float:
    """1.0 / 0.0 for a yes / no reply; else the first number (divided by ``scale``, clipped to [0, 1])."""
    words = re.findall(r"[a-z]+", reply.lower())
    if words and words[0] in _YES:
        return 1.0
    if words and words[0] in _NO:
        return 0.0
    number = re.search(r"-?\d+(?:\.\d+)?", reply)
    if number is not None:
        value = float(number.group())
        return min(1.0, max(0.0, value / scale)) if scale else value
    raise ValueError(
        f"judge {judge!r} replied {reply[:200]!r}; expected yes/no or a number. Make the template ask for "
        "one of them (and raise max_tokens if the reply was cut)."
    )


def _last_user(chat: list[dict[str, str]]) -> str:
    users = [m.get("content", "") for m in chat if m.get("role") == "user"]
    return users[-1] if users else ""
