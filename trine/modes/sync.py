"""Mode ``sync``: colocated weights; explore ``sync_interval`` batches with the current weights, then
train on each in turn."""

from __future__ import annotations

from collections.abc import Iterator

from trine import build
from trine.modes.common import explore_batches, train_on


def steps(st: build.Stage) -> Iterator[dict[str, float]]:
    """Colocated: explore ``sync_interval`` batches with the current weights (concurrently, one
    long tail), then train on each in turn."""
    while st.step < st.total_steps:
        if not st.pending:
            version = st.trainer.version
            st.sync.pull(st.engine, version)
            explore_batches(st, st.step, min(st.cfg.sync.sync_interval, st.total_steps - st.step), version)
        if not st.pending:
            return
        metrics = train_on(st)
        if st.trainer.version % st.cfg.sync.sync_interval == 0:  # shared: records the version only
            st.sync.push(st.trainer.model, st.trainer.version)
        yield metrics
