"""The reward per weights version of what a trainer process trains (``trine train`` beside ``trine serve``
or ``trine explore``): the reward curve of the run by the weights that answered.

``trainer/reward_mean`` is the mean reward of one step's rows, which mixes the versions the rows were
sampled with (an agent's round answered by version 3 may be trained at step 5 beside rows of version 4).
:class:`VersionRewards` sums the rewards of the rows trained by their ``policy_version`` and reports the
newest *complete* version: the newest one below the newest version trained, which the server or explorers
no longer sample (rows of it that arrive late are still added). Counted in this process since it started.
"""

from __future__ import annotations

from trine.status import REWARD_VERSION, REWARD_VERSION_MEAN, REWARD_VERSION_ROWS
from trine.types import Experience


class VersionRewards:
    """Sums of rewards and counts of the rollouts trained, by ``policy_version`` (see the module docstring)."""

    def __init__(self) -> None:
        self.totals: dict[int, tuple[float, int]] = {}
        """``policy_version`` -> (sum of rewards, rows)."""

    def add(self, experiences: list[Experience]) -> dict[str, float]:
        """Count a step's rows (rollouts with a reward, as ``trainer/reward_mean`` counts them); the metrics
        of the newest complete version (``trainer/reward_version``, ``_mean``, ``_rows``), or none yet."""
        for e in experiences:
            if e.kind == "rollout" and e.reward is not None:
                total, rows = self.totals.get(e.policy_version, (0.0, 0))
                self.totals[e.policy_version] = (total + float(e.reward), rows + 1)
        complete = sorted(self.totals)[:-1]
        if not complete:
            return {}
        version = complete[-1]
        total, rows = self.totals[version]
        return {
            REWARD_VERSION: float(version),
            REWARD_VERSION_MEAN: total / rows,
            REWARD_VERSION_ROWS: float(rows),
        }
