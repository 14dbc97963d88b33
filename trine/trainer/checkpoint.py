"""Checkpoints: HF-format weights + tokenizer, trainer state, and the loop's own state.

``runs/<name>/checkpoints/step_<N>/`` holds ``model`` files (``save_pretrained``), the tokenizer,
``trainer_state.pt`` (optimizer, scheduler, RNG) and ``loop_state.pt`` (step, stage, task cursor,
buffer contents, explorer RNG...). A checkpoint is written into ``step_<N>.tmp`` and renamed
when complete, so a crash never leaves a half checkpoint that looks valid.
"""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from trine.models.export import save_model
from trine.models.loading import quiet_progress

_STEP = re.compile(r"^step_(\d+)$")


def rng_state() -> dict[str, Any]:
    import numpy as np

    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(
    root: str | Path,
    step: int,
    *,
    model: Any,
    tokenizer: Any,
    trainer_state: dict[str, Any],
    loop_state: dict[str, Any],
    keep: int = 2,
    extra_models: dict[str, Any] | None = None,
) -> Path:
    """Write checkpoint ``step`` atomically and keep only the ``keep`` most recent ones."""
    root = Path(root)
    final = root / f"step_{step}"
    tmp = root / f"step_{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with quiet_progress():
        save_model(model, tmp)  # plain HF weights (LoRA merged, shards gathered) + a LoRA adapter
        for name, other in (extra_models or {}).items():
            other.save_pretrained(tmp / name)
    tokenizer.save_pretrained(tmp)
    torch.save(trainer_state, tmp / "trainer_state.pt")
    torch.save({**loop_state, "rng": rng_state()}, tmp / "loop_state.pt")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in list_checkpoints(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(root: str | Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP.match(p.name))]
    return [p for _, p in sorted(found)]


def load_states(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(trainer_state, loop_state) of a checkpoint directory."""
    path = Path(path)
    trainer_state = torch.load(path / "trainer_state.pt", weights_only=False)
    loop_state = torch.load(path / "loop_state.pt", weights_only=False)
    return trainer_state, loop_state
