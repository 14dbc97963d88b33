"""What rollouts came to, for tasks whose reward is a return: mean return, success rate, invalid actions and
turns, per batch (``explorer/*``) and per eval taskset (``eval/<name>/*``).

A *rollout* ends with one experience: a single-turn answer, a whole conversation (``multi_turn`` /
``tool_agent`` with ``output: trajectory``), or the last step of a step-wise rollout (``info["last_step"]``).
Its return is that experience's ``info["episode_return"]`` when it has one, else its reward; a pending
reward (``defer_reward``) counts in none of the numbers. What workflows record and this module reads:

- ``info["turns"]`` (conversations) or ``info["episode_length"]`` (step-wise episodes): turns;
- ``info["invalid_actions"]``: moves the environment refused (its step ``info["invalid_action"]``: the
  grid world's unparsable moves, textarena's invalid moves) or tool calls that failed (``tool_agent``:
  malformed, unknown tool, a tool that raised or timed out).

A rollout *succeeds* when its return reaches ``eval.success_threshold`` — the rule of eval's ``accuracy``
(greedy) and ``avg@k`` (sampled), which are the success rates of evaluation, and of the scheduler's pass
rates.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from trine.types import Experience


@dataclass(frozen=True)
class Outcome:
    """One finished rollout."""

    taskset: str
    value: float | None
    """Its return (None: pending)."""
    turns: float | None
    """Model turns (None: the workflow does not count them)."""
    invalid: float | None
    """Invalid actions or failed tool calls (None: the workflow does not count them)."""


def outcomes(exps: list[Experience]) -> list[Outcome]:
    """One :class:`Outcome` per rollout that ends in ``exps`` (see the module docstring)."""
    out = []
    for e in exps:
        if not e.info.get("last_step", True):
            continue
        value = e.info.get("episode_return", e.reward) if "last_step" in e.info else e.reward
        turns = e.info.get("turns", e.info.get("episode_length"))
        invalid = e.info.get("invalid_actions")
        out.append(
            Outcome(
                str(e.info.get("taskset", "")),
                None if value is None else float(value),
                None if turns is None else float(turns),
                None if invalid is None else float(invalid),
            )
        )
    return out


def outcome_metrics(
    done: list[Outcome], threshold: float, prefix: str, success: bool = True
) -> dict[str, float]:
    """``<prefix>return_mean``, ``success_rate`` (return >= ``threshold``; ``success=False`` leaves it out),
    ``invalid_actions`` (mean per rollout) and ``turns_mean`` of the rollouts ``done``, each only when some
    rollout has the value."""
    values = [o.value for o in done if o.value is not None]
    m: dict[str, float] = {}
    if values:
        m[f"{prefix}return_mean"] = statistics.fmean(values)
        if success:
            m[f"{prefix}success_rate"] = statistics.fmean(float(v >= threshold) for v in values)
    invalid = [o.invalid for o in done if o.invalid is not None]
    if invalid:
        m[f"{prefix}invalid_actions"] = statistics.fmean(invalid)
    turns = [o.turns for o in done if o.turns is not None]
    if turns:
        m[f"{prefix}turns_mean"] = statistics.fmean(turns)
    return m


def batch_metrics(exps: list[Experience], threshold: float) -> dict[str, float]:
    """``explorer/success_rate`` and ``explorer/invalid_actions`` of an explored batch, and when it mixes
    several tasksets, ``explorer/<taskset>/{return_mean,success_rate,invalid_actions,turns_mean}`` each.
    (The batch's mean reward, episode return and turns are the runner's ``explorer/reward_mean``,
    ``episode_return_mean`` and ``turns_mean``.)"""
    done = outcomes(exps)
    whole = outcome_metrics(done, threshold, "explorer/")
    m = {k: v for k, v in whole.items() if k in ("explorer/success_rate", "explorer/invalid_actions")}
    names = sorted({o.taskset for o in done})
    if len(names) > 1:
        for name in names:
            m.update(outcome_metrics([o for o in done if o.taskset == name], threshold, f"explorer/{name}/"))
    return m
