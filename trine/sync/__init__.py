"""Weight sync between trainer and explorer: the :class:`WeightSync` protocol and its methods."""

from trine.sync.base import WeightSync
from trine.sync.broadcast import BroadcastReceiver, BroadcastSender
from trine.sync.published import PublishedWeights
from trine.sync.weights import SharedWeights, StateDictCopy

SYNC_METHODS: dict[str, type] = {
    "shared": SharedWeights,
    "copy": StateDictCopy,
    "published": PublishedWeights,
}
"""In-process weight-sync methods by ``sync.method`` name (between processes: ``published`` and
``broadcast``, built by :func:`trine.build.process_sync`)."""

__all__ = [
    "SYNC_METHODS",
    "BroadcastReceiver",
    "BroadcastSender",
    "PublishedWeights",
    "SharedWeights",
    "StateDictCopy",
    "WeightSync",
]
