"""Experience storage between explorer and trainer, and the operators applied on the way in.

``STORAGES`` is the explicit table of built-in storages, each a class implementing
:class:`~trine.buffer.base.Buffer` and taking ``rules=``:class:`~trine.buffer.sampling.SamplingRules`
plus plain keyword arguments; :func:`open_buffer` is the one route from the ``buffer`` config section
to a storage (the run's and ``trine buffer``'s). ``OPERATORS`` is the table of
built-in experience operators (the registry kind ``"operator"``), each a class taking plain
keyword arguments; :func:`build_pipeline` turns specs ``{"name": ..., **args}`` into a
:class:`Pipeline`.
"""

from trine.buffer.base import Buffer, BufferTimeout
from trine.buffer.data_juicer import DataJuicerOperator
from trine.buffer.files import FileBuffer
from trine.buffer.mappers import DiversityMapper, OverlongShaping, QualityMapper, RewardShaping
from trine.buffer.memory import MemoryBuffer
from trine.buffer.open import open_buffer
from trine.buffer.operators import (
    DuplicateResponseFilter,
    InvalidRewardFilter,
    LengthFilter,
    Operator,
    Pipeline,
    ZeroVarianceFilter,
    build_pipeline,
)
from trine.buffer.sampling import SamplingRules
from trine.buffer.sql import SQLBuffer

STORAGES = {"memory": MemoryBuffer, "sql": SQLBuffer, "sqlite": SQLBuffer, "file": FileBuffer}

OPERATORS = {
    # filters
    "zero_variance": ZeroVarianceFilter,
    "invalid_reward": InvalidRewardFilter,
    "length": LengthFilter,
    "duplicate_responses": DuplicateResponseFilter,
    # reward mappers
    "reward_shaping": RewardShaping,
    "overlong": OverlongShaping,
    "quality": QualityMapper,
    "diversity": DiversityMapper,
    # bridge (needs the `data` extra)
    "data_juicer": DataJuicerOperator,
}

__all__ = [
    "OPERATORS",
    "STORAGES",
    "Buffer",
    "BufferTimeout",
    "FileBuffer",
    "MemoryBuffer",
    "Operator",
    "Pipeline",
    "SQLBuffer",
    "SamplingRules",
    "build_pipeline",
    "open_buffer",
]
