"""Mode ``train``: trainer only, on supervised rows or preference pairs (DPO) made from the taskset."""

from __future__ import annotations

from collections.abc import Iterator

from trine.roles import Stage


def steps(stage: Stage) -> Iterator[dict[str, float]]:
    """One training step per batch of the supervised source, until it runs out."""
    assert stage.source is not None
    while stage.step < stage.total_steps:
        batch = stage.source.next_batch()
        if batch is None:
            return
        yield stage.trainer.train(batch)
