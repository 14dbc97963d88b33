"""Experience storage between explorer and trainer.

``STORAGES`` is the explicit table of built-in storages, each a class taking plain keyword
arguments and implementing :class:`~trine.buffer.base.Buffer`.
"""

from trine.buffer.base import Buffer, BufferTimeout
from trine.buffer.files import FileBuffer
from trine.buffer.memory import MemoryBuffer
from trine.buffer.sql import SQLBuffer

STORAGES = {"memory": MemoryBuffer, "sql": SQLBuffer, "sqlite": SQLBuffer, "file": FileBuffer}

__all__ = ["STORAGES", "Buffer", "BufferTimeout", "FileBuffer", "MemoryBuffer", "SQLBuffer"]
