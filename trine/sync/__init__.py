"""Weight sync between trainer and explorer: the :class:`WeightSync` protocol and its methods."""

from trine.sync.base import WeightSync
from trine.sync.weights import SharedWeights, StateDictCopy

SYNC_METHODS: dict[str, type] = {"shared": SharedWeights, "copy": StateDictCopy}
"""Weight-sync methods by ``sync.method`` name."""

__all__ = ["SYNC_METHODS", "SharedWeights", "StateDictCopy", "WeightSync"]
