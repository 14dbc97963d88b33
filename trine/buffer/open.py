"""From the ``buffer`` config section to a storage: the one route, for the run and for ``trine buffer``.

:func:`open_buffer` is what ``trine.build`` calls to give a run its buffer and what every ``trine
buffer`` command calls (through :mod:`trine.buffer.inspect`, on the section the run wrote into its
``config.yaml``), so both reach the same database, table and file. A storage class is called as
``cls(rules=SamplingRules, **arguments)``: the sampling rules travel as one typed value
(:class:`~trine.buffer.sampling.SamplingRules`, read from the section by field name), and the
arguments are the run-directory defaults of the built-in storages under ``buffer.storage_args``:

- ``sql`` / ``sqlite``: ``url`` = ``buffer.url``, else ``sqlite:///<run_dir>/buffer.db``;
- ``file``: ``path`` = ``<run_dir>/buffer.jsonl``;
- ``memory`` and plugin storages (``package.module:Class`` or a registered name): only
  ``storage_args``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trine.buffer.base import Buffer
from trine.buffer.sampling import SamplingRules

if TYPE_CHECKING:
    from trine.config import BufferConfig

SQL_STORAGES = ("sql", "sqlite")


def storage_class(config: BufferConfig) -> type:
    """The class named by ``buffer.storage`` (a built-in, a registered plugin or an import path)."""
    from trine.registry import resolve

    return resolve("storage", config.storage)


def storage_arguments(config: BufferConfig, run_dir: str | Path) -> dict[str, Any]:
    """The storage class's keyword arguments besides ``rules``: its run-directory defaults (see the
    module docstring), then ``buffer.storage_args`` over them."""
    defaults: dict[str, Any] = {}
    if config.storage in SQL_STORAGES:
        defaults["url"] = config.url or f"sqlite:///{Path(run_dir) / 'buffer.db'}"
    elif config.storage == "file":
        defaults["path"] = str(Path(run_dir) / "buffer.jsonl")
    return {**defaults, **config.storage_args}


def open_buffer(config: BufferConfig, run_dir: str | Path, **extra: Any) -> Buffer:
    """The storage ``config`` describes, for the run in ``run_dir`` (SQL connects lazily, a file
    buffer replays its log now); ``extra`` keyword arguments go to the storage class (e.g. a trainer
    process's ``rewind="reads"``)."""
    rules = SamplingRules.from_section(config)
    cls = storage_class(config)
    try:
        return cls(rules=rules, **storage_arguments(config, run_dir), **extra)
    except TypeError as err:
        raise TypeError(
            f"buffer.storage={config.storage!r} ({cls.__name__}) with buffer.storage_args="
            f"{config.storage_args!r}: {err}; fix or remove that key (the class's docstring lists "
            "its arguments)."
        ) from err
