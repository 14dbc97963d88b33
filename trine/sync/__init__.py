"""Weight sync between trainer and explorer."""

from trine.sync.weights import SharedWeights, StateDictCopy

__all__ = ["SharedWeights", "StateDictCopy"]
