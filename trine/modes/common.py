"""The arrows every RL mode shares: tasks → explorer → (shaping, operators) → buffer, and
buffer → trainer for the oldest explored batch."""

from __future__ import annotations

from trine import build
from trine.refill import pass_rates, shape_batch
from trine.tasks.supervised import sft_experiences


def explore_batches(st: build.Stage, first: int, count: int, version: int) -> bool:
    """tasks → explorer → buffer for ``count`` batches of one version; False when tasks run out."""
    batches = []
    for _ in range(count):
        tasks = st.scheduler.next_batch(st.cfg.tasks.batch_size)
        if not tasks:
            break
        batches.append(tasks)
    results = st.explorer.explore_batches(batches, first_index=first, version=version)
    for experiences, _ in results:  # pass rates back to the scheduler (curricula use them)
        st.scheduler.feedback(*pass_rates(experiences, st.cfg.eval.success_threshold))
    for j, (experiences, metrics) in enumerate(results):
        experiences = shape(st, experiences, metrics, first + j, version)
        if st.operators is not None:
            experiences, op_metrics = st.operators(experiences, step=first + j)
            metrics.update(op_metrics)
        st.buffer.put(experiences)
        st.pending.append((first + j, len(experiences), metrics))
    return len(batches) == count


def shape(st: build.Stage, experiences: list, metrics: dict[str, float], index: int, version: int) -> list:
    """:func:`trine.refill.shape_batch` with the stage's settings; refills draw tasks from the
    scheduler and explore them with the batch's version."""

    def draw_more(n: int) -> list | None:
        tasks = st.scheduler.next_batch(n)
        return st.explorer.explore(tasks, batch_index=index, version=version)[0] if tasks else None

    a = st.algorithm
    return shape_batch(
        experiences,
        metrics,
        max_tokens=st.cfg.tasks.train.sampling.max_tokens,
        batch_size=st.cfg.tasks.batch_size,
        draw_more=draw_more,
        dynamic_sampling=a.dynamic_sampling,
        max_extra_draws=a.max_extra_draws,
        overlong_buffer=a.overlong_buffer,
        overlong_penalty=a.overlong_penalty,
    )


def train_on(st: build.Stage) -> dict[str, float]:
    """buffer → trainer for the oldest explored batch."""
    _, n, metrics = st.pending[0]
    experiences = (
        st.buffer.get(n, current_version=st.trainer.version, timeout=st.cfg.buffer.get_timeout) if n else []
    )
    st.pending.pop(0)
    if st.expert is not None:  # MIX: expert rows ride along with the rollouts
        tasks = st.expert.next_batch(max(1, round(st.algorithm.expert_ratio * len(experiences))))
        experiences = experiences + sft_experiences(
            tasks, st.engine.tokenizer, st.cfg.tasks.expert.response_key
        )
    metrics = {
        **metrics,
        **st.train(experiences),
        **st.buffer.metrics(),  # incl. buffer/staleness_mean|max of this batch (current_version given)
        "sync/seconds": st.sync.seconds,
        "trainer/version": float(st.trainer.version),
    }
    return metrics
