"""Mode ``sync``: explore ``sync_interval`` batches with the current weights (concurrently, one long
tail), then train on each in turn; the weights are pushed every ``sync_interval`` steps."""

from __future__ import annotations

from collections.abc import Iterator

from trine.stage import Stage


def steps(stage: Stage) -> Iterator[dict[str, float]]:
    """One metrics dict per training step: the explored batch's report merged with the step's."""
    explorer, trainer, k = stage.explorer, stage.trainer, stage.cfg.sync.sync_interval
    assert explorer is not None
    while stage.step < stage.total_steps:
        if not trainer.batches_waiting():
            explorer.produce(trainer.version, count=min(k, stage.total_steps - stage.step))
        if not trainer.batches_waiting():
            return  # the tasks ran out
        yield {**explorer.report(), **trainer.consume()}
