"""Mode ``train``: trainer only, on supervised rows or preference pairs made from the taskset."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from trine import build
from trine.tasks.supervised import preference_experiences, sft_experiences


def steps(st: build.Stage, tokenizer: Any) -> Iterator[dict[str, float]]:
    """Trainer only: supervised rows, or preference pairs (DPO), made from the taskset."""
    ts = st.cfg.tasks.train
    while st.step < st.total_steps:
        tasks = st.scheduler.next_batch(st.cfg.tasks.batch_size)
        if not tasks:
            return
        if st.algorithm.pairwise:
            yield st.train(preference_experiences(tasks, tokenizer, ts.chosen_key, ts.rejected_key))
        else:
            yield st.train(sft_experiences(tasks, tokenizer, ts.response_key))
