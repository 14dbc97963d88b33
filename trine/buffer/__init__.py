"""Experience storage between explorer and trainer.

``STORAGES`` is the explicit table of built-in storages, each a class taking plain keyword
arguments and implementing :class:`~trine.buffer.base.Buffer`.
"""

from trine.buffer.base import Buffer, BufferTimeout
from trine.buffer.memory import MemoryBuffer

STORAGES = {"memory": MemoryBuffer}

__all__ = ["STORAGES", "Buffer", "BufferTimeout", "MemoryBuffer"]
