"""``trine train CONFIG --replay RUN_DIR``: train CONFIG's model again on the steps a finished (or stopped)
run trained, read from that run's SQL buffer (:class:`trine.buffer.replay.TrainedSteps`), with no
explorer: to debug the trainer on fixed data.

Each stored step is one ``Trainer.step`` on the same experiences, in the same order, with their stored
versions and rewards. The replay is a run of its own: a new run directory (CONFIG's ``run_dir`` /
``runs/<name>``, or ``<RUN_DIR>-replay`` when that is RUN_DIR itself) with its ``config.yaml``,
``metrics.jsonl``, checkpoints (``trainer.save_every``; run the command again to resume) and
``replay.json`` naming the source; RUN_DIR is only read. A step line has the trainer's metrics, the
``buffer/staleness_*`` of the stored versions against the replaying trainer's version (``buffer/reuse``
with the priority sampler) and ``trainer/version``; the explorer's metrics and the other ``buffer/*``
counts belonged to the run and are not replayed, and nothing is evaluated (``trine bench`` evaluates the
replay's checkpoints). With CONFIG's trainer settings and seed equal to the run's, replaying a sync run
reproduces its ``trainer/*`` metrics.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trine.buffer.replay import ReplayError, TrainedSteps
from trine.config import RunConfig
from trine.loop import run
from trine.types import Experience

__all__ = ["ReplayError", "replay", "replay_dir"]


def replay_dir(cfg: RunConfig, source: Path) -> Path:
    """The replay's run directory: ``cfg``'s (``run_dir``, else ``runs/<name>``), or ``<source>-replay``
    when that is the run being replayed (whose directory is never written)."""
    target = cfg.run_path
    if target.resolve() == source.resolve():
        return source.with_name(f"{source.name}-replay")
    return target


def replay(stages: list[RunConfig], source: Path) -> dict[str, Any]:
    """Replay the steps the run in ``source`` trained with the one stage of ``stages`` (model, trainer,
    algorithm, seed); returns the run summary. :class:`ReplayError` (nothing written) when ``stages``
    is not one stage or ``source`` has no SQL buffer with trained steps."""
    if len(stages) != 1:
        raise ReplayError(
            f"--replay trains one stage; this config has {len(stages)} ({[s.stage for s in stages]}). Give a "
            "single-stage config whose model is the replayed stage's starting weights."
        )
    target = replay_dir(stages[0], source)
    _check_target(target, source)
    stored = TrainedSteps.open(source)
    try:
        return _run(stages[0].model_copy(update={"run_dir": str(target)}), stored, source)
    finally:
        stored.close()


def _check_target(target: Path, source: Path) -> None:
    """A replay continues only a replay of the same run; any other run's directory is left alone."""
    note = target / "replay.json"
    if note.is_file():
        theirs = json.loads(note.read_text()).get("source")
        if theirs != str(source.resolve()):
            raise ReplayError(
                f"{target} holds a replay of {theirs}, not of {source}; give the replay another directory "
                "(override run_dir=... or name=...)."
            )
    elif (target / "config.yaml").is_file():
        raise ReplayError(
            f"{target} is the directory of another run; give the replay its own directory (override "
            "run_dir=... or name=...)."
        )


@dataclass
class ReplaySteps:
    """The stored steps as the stage's source: step ``i`` is the run's ``i``-th get, with its stored
    versions and rewards and its ``buffer/staleness_*`` against the replaying trainer's version."""

    stored: TrainedSteps

    def __len__(self) -> int:
        return len(self.stored)

    def next_batch(self, step: int, version: int) -> tuple[list[Experience], dict[str, float]] | None:
        if step >= len(self.stored):
            return None
        experiences, metrics = self.stored.get(step, current_version=version)
        return experiences, {**metrics, "trainer/version": float(version + 1)}

    def state_dict(self) -> dict[str, Any]:
        return {}  # the position is the stage's step

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def _run(cfg: RunConfig, stored: TrainedSteps, source: Path) -> dict[str, Any]:
    target = Path(cfg.run_dir or "")
    target.mkdir(parents=True, exist_ok=True)
    note = {
        "source": str(source.resolve()),
        "buffer": repr(stored),
        "steps": len(stored),
        "exact": stored.exact,
    }
    (target / "replay.json").write_text(json.dumps(note, indent=1) + "\n")
    print(f"replaying {len(stored)} steps of {source} into {target}", flush=True)
    if not stored.exact:
        print("note: the run reused experiences (reuse_limit > 1); each is replayed at its last use only")
    return run([cfg], source=ReplaySteps(stored))
