"""Experience operators: ``list[Experience] -> list[Experience]`` steps between explorer and buffer.

Each function returns the (possibly filtered or reshaped) experiences and a dict of counts for the
metrics. Group-level operators treat experiences sharing a ``group_id`` as one group.
"""

from __future__ import annotations

from collections import defaultdict

from trine.types import Experience


def groups_of(experiences: list[Experience]) -> dict[str, list[Experience]]:
    """Experiences by ``group_id``, in first-seen order."""
    out: dict[str, list[Experience]] = defaultdict(list)
    for e in experiences:
        out[e.group_id or e.id].append(e)
    return dict(out)


def zero_variance_filter(
    experiences: list[Experience], tol: float = 1e-8
) -> tuple[list[Experience], dict[str, float]]:
    """Drop groups whose rewards are all equal (they carry no group-relative signal).

    DAPO's dynamic sampling (arXiv 2503.14476, §3.2). Counts: ``kept_groups``, ``dropped_all_correct``
    (all rewards equal to the group's max possible here: equal and > 0), ``dropped_all_wrong`` (equal
    and <= 0).
    """
    kept: list[Experience] = []
    stats = {"kept_groups": 0.0, "dropped_all_correct": 0.0, "dropped_all_wrong": 0.0}
    for group in groups_of(experiences).values():
        rewards = [float(e.reward or 0.0) for e in group]
        if len(group) > 1 and max(rewards) - min(rewards) <= tol:
            stats["dropped_all_correct" if rewards[0] > 0 else "dropped_all_wrong"] += 1
            continue
        kept.extend(group)
        stats["kept_groups"] += 1
    return kept, stats


def overlong_penalty(length: int, max_tokens: int, buffer: int, penalty: float = 1.0) -> float:
    """DAPO's soft overlong punishment (arXiv 2503.14476, eq. 13).

    ``0`` if ``L <= L_max - L_cache``; ``((L_max - L_cache) - L) / L_cache · penalty`` inside the
    buffer (linear from 0 down to ``-penalty``); ``-penalty`` at or beyond ``L_max``.
    """
    if buffer <= 0 or length <= max_tokens - buffer:
        return 0.0
    if length >= max_tokens:
        return -penalty
    return (max_tokens - buffer - length) / buffer * penalty


def overlong_shaping(
    experiences: list[Experience], max_tokens: int, buffer: int, penalty: float = 1.0
) -> tuple[list[Experience], dict[str, float]]:
    """Add :func:`overlong_penalty` of each response's length to its reward (recorded in
    ``info["reward_parts"]["overlong"]``). Pending rewards are left alone."""
    shaped = 0
    for e in experiences:
        if e.reward is None:
            continue
        p = overlong_penalty(e.response_length, max_tokens, buffer, penalty)
        if p:
            e.reward = float(e.reward) + p
            e.info.setdefault("reward_parts", {})["overlong"] = p
            shaped += 1
    return experiences, {"overlong_shaped": float(shaped)}
