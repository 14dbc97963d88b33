"""Modes: one short file per wiring of the same objects (see docs/architecture.md).

- :mod:`trine.modes.sync`: explore ``sync_interval`` batches, train on them, repeat.
- :mod:`trine.modes.offset`: the explorer runs ``sync_offset`` batches ahead in a thread.
- :mod:`trine.modes.train`: trainer only, from the taskset.

Each ``steps(...)`` yields one metrics dict per training step; :mod:`trine.modes.common` holds the
arrows they share.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from trine import build


def steps(st: build.Stage, tokenizer: Any) -> Iterator[dict[str, float]]:
    """The step generator of ``st``'s mode (``sync_offset`` picks the pipelined wiring)."""
    from trine.modes import offset, sync, train

    if st.cfg.mode == "train":
        return train.steps(st, tokenizer)
    return offset.steps(st) if st.cfg.sync.sync_offset > 0 else sync.steps(st)
