"""Between explorer and buffer: the algorithm's operators (DAPO's dynamic sampling with refill, overlong
shaping) and the pass-rate feedback to the task scheduler.

Dynamic sampling (DAPO, arXiv 2503.14476 §3.2) drops groups whose rewards all agree — they carry no
group-relative signal — and keeps drawing tasks from the scheduler and exploring them (with the same
weights version) until the batch holds ``tasks.batch_size`` informative groups, or
``max_extra_draws`` extra draws were made; then the batch proceeds, smaller if need be. Metrics:
``dapo/kept_groups``, ``dapo/dropped_all_correct``, ``dapo/dropped_all_wrong``, ``dapo/extra_draws``.
"""

from __future__ import annotations

from collections.abc import Callable

from trine.types import Experience


def shape_batch(
    exps: list[Experience],
    metrics: dict[str, float],
    *,
    max_tokens: int,
    batch_size: int,
    draw_more: Callable[[int], list[Experience] | None],
    dynamic_sampling: bool = False,
    max_extra_draws: int = 4,
    overlong_buffer: float = 0,
    overlong_penalty: float = 1.0,
) -> list[Experience]:
    """The algorithm's operators between explorer and buffer: DAPO overlong shaping and dynamic
    sampling (drop zero-variance groups, draw more tasks until the batch is full).

    ``exps`` is one explored batch and ``metrics`` its explorer metrics (``dapo/*`` are added to it
    when ``dynamic_sampling`` is on). ``max_tokens`` is the sampling limit the overlong penalty is
    measured against, ``batch_size`` the number of informative groups wanted, and the other keywords
    are the algorithm's rollout-side settings (:data:`trine.algorithms.presets.EXPLORER_FIELDS`).
    ``draw_more(n)`` draws ``n`` more tasks and explores them with the batch's weights version,
    returning their experiences, or None when the task scheduler has none left.
    """
    from trine.buffer.operators import overlong_shaping, zero_variance_filter

    buffer = overlong_buffer if overlong_buffer >= 1 else max(1, int(overlong_buffer * max_tokens))
    if overlong_buffer:
        exps, _ = overlong_shaping(exps, max_tokens, buffer, overlong_penalty)
    if not dynamic_sampling:
        return exps
    exps, counts = zero_variance_filter(exps)
    draws = 0
    while counts["kept_groups"] < batch_size and draws < max_extra_draws:
        more = draw_more(int(batch_size - counts["kept_groups"]))
        if more is None:
            break
        draws += 1
        if overlong_buffer:
            more, _ = overlong_shaping(more, max_tokens, buffer, overlong_penalty)
        more, extra = zero_variance_filter(more)
        exps += more
        counts = {k: counts[k] + extra[k] for k in counts}
    metrics.update({f"dapo/{k}": v for k, v in counts.items()} | {"dapo/extra_draws": float(draws)})
    return exps


def pass_rates(exps: list, threshold: float) -> tuple[list[str], dict[str, list[float]]]:
    """``(task_ids, {"pass_rate": [...]})`` of a batch: per task, the share of rollouts whose reward
    (a multi-step rollout: its episode return) reaches ``threshold`` — the scheduler's feedback."""
    from trine.explorer import rollout_returns

    by_task: dict[str, list] = {}
    for e in exps:
        by_task.setdefault(e.task_id, []).append(e)
    ids = list(by_task)
    rates = []
    for task_id in ids:
        values = [r for r in rollout_returns(by_task[task_id]) if r is not None]
        rates.append(sum(float(r >= threshold) for r in values) / len(values) if values else 0.0)
    return ids, {"pass_rate": rates}
