"""Reward functions: how good is one response to one task.

The contract
------------
A reward is any callable::

    fn(response: str, task: trine.types.Task, **reward_args) -> float | dict[str, float]

``response`` is the sampled text: the built-in engine decodes it with ``skip_special_tokens=True``,
so it holds no eos / chat-template tokens, is not stripped, and keeps a stop string that ended it;
text from a custom workflow may still end with special tokens such as ``<|im_end|>``, which the
built-ins strip (:func:`trine.rewards.basic.clean_response`). ``task.answer`` is the reference answer
(may be None or not a string), ``task.question`` the prompt (text or chat; the model saw
``task.messages()`` rendered with its chat template) and ``task.raw`` the whole taskset row, for
rewards that need more fields. ``reward_args`` come from the task (``Task.reward_args``, i.e. the
taskset config). docs/workflows.md ("For reward authors") has the details.

- A float is the reward.
- A dict means named parts (``{"accuracy": 1.0, "format": 0.5}``): the total reward is the sum
  of the parts, and each part is logged. Keys starting with ``_`` (``"_timeout"``) are
  diagnostics: logged like parts but not added to the total.

Built-in rewards never raise on garbage responses or answers (empty text, replacement chars, a
100 kB string, a None or numeric answer): they return 0.0. They do raise ``ValueError`` for bad
reward_args (a negative tolerance, an invalid regex), which are configuration errors.

Built-ins are listed in :data:`REWARDS` (the registry looks up ``"trine.rewards:REWARDS"``);
anything else is given as ``"package.module:attr"`` or registered from a plugin file with
``@trine.registry.register("reward", "name")``. Callers score a response with
:func:`evaluate_reward`, which checks the value and splits it into ``(total, parts)``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from math import isfinite  # not `import math`: the submodule trine.rewards.math shadows it here
from typing import Any

from trine.rewards.basic import exact_match, format_reward, numeric_match
from trine.rewards.judge import llm_judge
from trine.rewards.math import math_reward, math_with_format
from trine.rewards.reasoning_gym import reasoning_gym_reward
from trine.types import Task

REWARDS: dict[str, Callable[..., float | dict[str, float]]] = {
    "exact_match": exact_match,
    "numeric_match": numeric_match,
    "math": math_reward,
    "format": format_reward,
    "math_with_format": math_with_format,
    "llm_judge": llm_judge,
    "reasoning_gym": reasoning_gym_reward,
}

INLINE_REWARDS: frozenset[Callable[..., Any]] = frozenset({exact_match, numeric_match})
"""Built-in rewards that run in time linear in the response (fixed patterns, no I/O) and never block: the
explorer calls them on its event loop instead of handing each call to a worker thread (a hand-off costs
more than the call). Every other reward runs in a worker thread under ``explorer.reward_timeout``."""


def _reward_name(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None)
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    return f"{module}:{name}" if module and name else repr(fn)


def _as_number(value: Any, name: str, where: str) -> float:
    if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
        raise ValueError(
            f"reward {name} returned {where}{value!r} of type {type(value).__name__}; expected a "
            "float or a dict of floats. Return float(...) from the reward function."
        )
    try:
        number = float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"reward {name} returned {where}{value!r}, which is not a single number ({err}); "
            "expected a float or a dict of floats."
        ) from err
    if not isfinite(number):
        raise ValueError(
            f"reward {name} returned {where}{number!r}; expected a finite number. Guard the "
            "reward function against NaN/inf (e.g. a division by zero)."
        )
    return number


def evaluate_reward(
    fn: Callable[..., Any],
    response: str,
    task: Task,
    args: Mapping[str, Any] | None = None,
) -> tuple[float, dict[str, float]]:
    """Call ``fn(response, task, **args)`` and normalise the result to ``(total, parts)``.

    A float ``r`` gives ``(r, {})``; a dict gives ``(sum of parts not starting with "_", parts)``.
    Raises ``ValueError`` naming the reward and the value when it returns NaN, inf, a non-number,
    or a dict with a non-string key or a bad value. Exceptions raised by ``fn`` propagate.
    """
    name = _reward_name(fn)
    result = fn(response, task, **dict(args or {}))
    if not isinstance(result, Mapping):
        return _as_number(result, name, ""), {}
    parts: dict[str, float] = {}
    for key, value in result.items():
        if not isinstance(key, str):
            raise ValueError(
                f"reward {name} returned a dict with key {key!r}; expected part names as strings."
            )
        parts[key] = _as_number(value, name, f"part {key!r} = ")
    total = sum(value for key, value in parts.items() if not key.startswith("_"))
    return float(total), parts


__all__ = [
    "REWARDS",
    "evaluate_reward",
    "exact_match",
    "format_reward",
    "llm_judge",
    "math_reward",
    "math_with_format",
    "numeric_match",
    "reasoning_gym_reward",
]
