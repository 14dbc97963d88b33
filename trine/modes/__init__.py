"""Modes: one short file per wiring of the same roles (see docs/architecture.md).

- :mod:`trine.modes.sync`: explore ``sync_interval`` batches, train on them, repeat.
- :mod:`trine.modes.offset`: the explorer runs ``sync_offset`` batches ahead in a thread.
- :mod:`trine.modes.asynchronous`: mode ``async``, explorer and trainer concurrently.
- :mod:`trine.modes.train`: trainer only, on a source: the taskset, a persistent buffer, or the steps a
  finished run trained (``trine train --replay``, launched by :mod:`trine.launch.replay`).

Each ``steps(stage)`` yields one metrics dict per training step; the roles they loop over
(``produce`` / ``consume``) are in :mod:`trine.stage`.
"""

from __future__ import annotations

from collections.abc import Iterator

from trine.stage import Stage


def steps(stage: Stage) -> Iterator[dict[str, float]]:
    """The step generator of ``stage``'s mode (``sync_offset`` picks the pipelined wiring)."""
    from trine.modes import asynchronous, offset, sync, train

    wiring = "train" if stage.source is not None else stage.cfg.plan.wiring  # a replay trains a source
    if wiring == "async":
        return asynchronous.steps(stage) if stage.explorer else asynchronous.trainer_steps(stage)
    return {"train": train.steps, "offset": offset.steps, "sync": sync.steps}[wiring](stage)
