"""Between explorer and buffer: the algorithm's operators (DAPO's dynamic sampling with refill, overlong
shaping) and the pass-rate feedback to the task scheduler.

Dynamic sampling (DAPO, arXiv 2503.14476 §3.2) drops groups whose rewards all agree — they carry no
group-relative signal — and keeps drawing tasks from the scheduler and exploring them (with the same
weights version) until the batch holds ``tasks.batch_size`` informative groups, or
``max_extra_draws`` extra draws were made; then the batch proceeds, smaller if need be. Metrics:
``dapo/kept_groups``, ``dapo/dropped_all_correct``, ``dapo/dropped_all_wrong``, ``dapo/extra_draws``.
"""

from __future__ import annotations

from trine.build import Stage


def shape_batch(st: Stage, exps: list, metrics: dict, index: int, version: int) -> list:
    """The algorithm's operators between explorer and buffer: DAPO overlong shaping and dynamic
    sampling (drop zero-variance groups, draw more tasks until the batch is full)."""
    from trine.buffer.operators import overlong_shaping, zero_variance_filter

    algo, max_tokens = st.algorithm, st.cfg.tasks.train.sampling.max_tokens
    buffer = (
        algo.overlong_buffer if algo.overlong_buffer >= 1 else max(1, int(algo.overlong_buffer * max_tokens))
    )
    if algo.overlong_buffer:
        exps, _ = overlong_shaping(exps, max_tokens, buffer, algo.overlong_penalty)
    if not algo.dynamic_sampling:
        return exps
    exps, counts = zero_variance_filter(exps)
    draws, want = 0, st.cfg.tasks.batch_size
    while counts["kept_groups"] < want and draws < algo.max_extra_draws:
        tasks = st.scheduler.next_batch(int(want - counts["kept_groups"]))
        if not tasks:
            break
        draws += 1
        more, _ = st.explorer.explore(tasks, batch_index=index, version=version)
        if algo.overlong_buffer:
            more, _ = overlong_shaping(more, max_tokens, buffer, algo.overlong_penalty)
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
