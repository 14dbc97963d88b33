"""Mode ``train``: trainer only, on supervised rows or preference pairs (DPO) made from the taskset, or
on the steps a run trained (``trine train --replay``, :mod:`trine.modes.replay`)."""

from __future__ import annotations

from collections.abc import Iterator

from trine.roles import Stage


def steps(stage: Stage) -> Iterator[dict[str, float]]:
    """One training step per batch of the stage's source, until it runs out."""
    assert stage.source is not None
    while stage.step < stage.total_steps:
        batch = stage.source.next_batch(stage.step, stage.trainer.version)
        if batch is None:
            return
        experiences, metrics = batch
        yield {**stage.trainer.train(experiences), **metrics}
