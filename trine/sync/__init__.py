"""Weight sync between trainer and explorer: the :class:`WeightSync` protocol and its methods."""

from trine.sync.base import WeightSync
from trine.sync.published import PublishedWeights
from trine.sync.weights import SharedWeights, StateDictCopy

SYNC_METHODS: dict[str, type] = {
    "shared": SharedWeights,
    "copy": StateDictCopy,
    "published": PublishedWeights,
}
"""Weight-sync methods by ``sync.method`` name."""

__all__ = ["SYNC_METHODS", "PublishedWeights", "SharedWeights", "StateDictCopy", "WeightSync"]
