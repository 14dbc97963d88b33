"""Mode ``train``: trainer only, on supervised rows or preference pairs (DPO) made from the taskset, on the
rows of a persistent buffer (``tasks.source: buffer``), or on the steps a run trained (``trine train
--replay``, :mod:`trine.launch.replay`)."""

from __future__ import annotations

from collections.abc import Iterator

from trine.stage import Stage


def steps(stage: Stage) -> Iterator[dict[str, float]]:
    """One training step per batch of the stage's source, until it runs out. A source that may run dry
    (``more()``, :class:`~trine.trainer.sources.BufferSource`) is asked for the next batch before a step is reported:
    when none comes, that step becomes the stage's last (``total_steps``), so the loop evaluates and
    checkpoints it as the end of the stage."""
    assert stage.source is not None
    more = getattr(stage.source, "more", None)
    while stage.step < stage.total_steps:
        batch = stage.source.next_batch(stage.step, stage.trainer.version)
        if batch is None:
            return
        experiences, metrics = batch
        metrics = {**stage.trainer.train(experiences), **metrics}
        if more is not None and stage.step + 1 < stage.total_steps and not more():
            stage.total_steps = stage.step + 1  # the source ran dry: this step ends the stage
            why = getattr(stage.source, "ended", "")
            print(f"stage {stage.cfg.stage} ends at its step {stage.total_steps}: {why}", flush=True)
        yield metrics
