"""The in-process weight-sync methods (the protocol is :class:`trine.sync.base.WeightSync`).

- :class:`SharedWeights`: colocated; the engine's model *is* the trainer's model, nothing moves.
- :class:`StateDictCopy`: in-process copy into a separate explorer model (used when the explorer
  runs ahead of the trainer). Pushed versions are kept until pulled, so the explorer always
  samples from exactly the version the schedule says, however the threads interleave.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from torch import nn

from trine.models.export import rollout_state_dict
from trine.models.protocol import RolloutModel


class SharedWeights:
    """Colocated weights: pushing only records the version."""

    def __init__(self) -> None:
        self.version = 0
        self.seconds = 0.0

    def push(self, model: nn.Module, version: int) -> None:
        self.version = version

    def pull(self, engine: RolloutModel, version: int, timeout: float | None = None) -> None:
        engine.policy_version = version

    def latest(self) -> int | None:
        return self.version

    def state_dict(self) -> dict[str, Any]:
        return {"version": self.version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.version = int(state.get("version", 0))

    def metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


class StateDictCopy:
    """Copies of the trainer's weights, keyed by version, loaded into the explorer's model."""

    def __init__(self) -> None:
        self._states: dict[int, dict[str, Any]] = {}
        self._cond = threading.Condition()
        self._closed = False
        self.seconds = 0.0

    def push(self, model: nn.Module, version: int) -> None:
        start = time.perf_counter()
        state = {k: v.to("cpu", copy=True) for k, v in rollout_state_dict(model).items()}
        with self._cond:
            self._states[version] = state
            self._cond.notify_all()
        self.seconds += time.perf_counter() - start

    def pull(self, engine: RolloutModel, version: int, timeout: float | None = None) -> None:
        """Load ``version`` into ``engine`` (waiting for it); drop older versions."""
        if engine.policy_version == version:
            return
        with self._cond:
            ok = self._cond.wait_for(lambda: version in self._states or self._closed, timeout)
            if not ok or version not in self._states:
                raise TimeoutError(f"weights version {version} was not pushed within {timeout}s")
            state = self._states[version]
            for old in [v for v in self._states if v < version]:
                del self._states[old]
        start = time.perf_counter()
        engine.load_weights(state, version)
        self.seconds += time.perf_counter() - start

    def latest(self) -> int | None:
        with self._cond:
            return max(self._states, default=None)

    def state_dict(self) -> dict[str, Any]:
        with self._cond:
            return {"states": dict(self._states)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self._cond:
            self._states = dict(state["states"])

    def metrics(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
