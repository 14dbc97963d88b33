"""Task generators: the rows of a taskset made in memory instead of read from a file.

A taskset names one with ``generator`` (instead of ``path``) and its arguments with ``generator_args``::

    tasks:
      train:
        generator: reasoning_gym
        generator_args: {dataset: leg_counting, size: 500, min_animals: 2}
        reward: reasoning_gym

A generator is any callable ``fn(**generator_args) -> iterable of row dicts``; the rows then go through
the same mapping as the rows of a file (``prompt_key``, ``answer_key``, ``prompt_template``...), and each
task keeps its whole row as ``task.raw``. When the generator has a ``seed`` parameter and
``generator_args`` gives none, the taskset passes :func:`default_seed` of its ``name``: a ``train`` and an
``eval`` taskset built from the same generator then hold different problems, and every process (explorers,
the trainer, ``trine check``) builds the same rows.

:data:`GENERATORS` holds the built-ins (registry kind ``"generator"``); anything else is given as
``"package.module:function"`` or registered with ``@trine.register("generator", "name")`` in a ``--plugin`` file.
"""

from __future__ import annotations

import difflib
import hashlib
import inspect
import json
from collections.abc import Callable, Iterable
from typing import Any

from trine import registry
from trine.tasks.arithmetic import generate_arithmetic

INSTALL_HINT = 'pip install -e ".[envs]" (or pip install reasoning-gym)'
"""How to install the package of the ``reasoning_gym`` generator and reward."""


def reasoning_gym_rows(
    dataset: str, *, size: int = 500, seed: int = 0, **config: Any
) -> list[dict[str, Any]]:
    """``size`` problems of the reasoning-gym generator ``dataset`` (``leg_counting``,
    ``basic_arithmetic``, ``chain_sum``, ... any name ``reasoning_gym.create_dataset`` knows), drawn with
    ``seed``; ``config`` are the generator's own settings (``min_animals``, ``max_terms``...).

    Each row is reasoning-gym's entry made JSON-able: ``{"question", "answer", "metadata"}`` (tuples become
    lists); ``metadata["source_dataset"]`` names the generator whose ``score_answer`` the ``reasoning_gym``
    reward calls. Procedural and offline: nothing is downloaded.

    reasoning-gym draws problem ``i`` from ``seed + i``, so two sets whose seeds differ by less than
    ``size`` share problems; keep train and eval seeds far apart (the default seeds, hashed from the
    taskset names, are).
    """
    rg = _reasoning_gym()
    from reasoning_gym.factory import DATASETS

    if dataset not in DATASETS:
        close = difflib.get_close_matches(str(dataset), list(DATASETS), n=3)
        hint = f" Did you mean {close}?" if close else ""
        raise ValueError(
            f"generator_args.dataset={dataset!r} is not a reasoning-gym dataset.{hint} Valid names: "
            f"{', '.join(sorted(DATASETS))}."
        )
    try:
        generated = rg.create_dataset(dataset, size=size, seed=seed, **config)
    except (TypeError, ValueError, AssertionError) as err:
        fields = _config_fields(DATASETS[dataset][1])
        raise ValueError(
            f"reasoning-gym dataset {dataset!r} refused generator_args {config} (size={size}, seed={seed}): "
            f"{err!r}; its settings are {fields}."
        ) from None
    return [json.loads(json.dumps(entry, default=_jsonable)) for entry in generated]


def arithmetic_rows(
    size: int | None = None,
    *,
    seed: int = 0,
    ops: Iterable[str] = ("+",),
    min_value: int = 0,
    max_value: int = 9,
    unique: bool = True,
) -> list[dict[str, Any]]:
    """Trine's own ``a <op> b`` problems (:func:`trine.tasks.arithmetic.generate_arithmetic`): ``size``
    rows (None: every combination) ``{"question": "3+5=", "answer": "8", ...}``."""
    return generate_arithmetic(
        size, seed=seed, ops=tuple(ops), min_value=min_value, max_value=max_value, unique=unique
    )


GENERATORS: dict[str, Callable[..., Iterable[dict[str, Any]]]] = {
    "reasoning_gym": reasoning_gym_rows,
    "arithmetic": arithmetic_rows,
}
"""Built-in task generators by name (``tasks.*.generator``)."""


def default_seed(name: str) -> int:
    """The seed a taskset called ``name`` gives its generator when ``generator_args`` has none: a stable
    31-bit hash of the name (equal in every process)."""
    return int.from_bytes(hashlib.sha256(f"taskset:{name}".encode()).digest()[:4], "big") & 0x7FFFFFFF


def generate_rows(generator: str, args: dict[str, Any], taskset: str) -> list[Any]:
    """The rows ``generator`` makes from ``args`` for the taskset called ``taskset`` (which seeds it when
    ``args`` has no ``seed``); raises ValueError naming the generator when it fails or returns no list."""
    fn = registry.resolve("generator", generator)
    kwargs = dict(args)
    if "seed" not in kwargs and _takes(fn, "seed"):
        kwargs["seed"] = default_seed(taskset)
    try:
        rows = fn(**kwargs)
    except TypeError as err:
        raise ValueError(
            f"generator {generator!r} does not take generator_args {sorted(args)}: {err}; its parameters "
            f"are {_parameters(fn)}."
        ) from None
    if isinstance(rows, (str, bytes, dict)) or not isinstance(rows, Iterable):
        raise ValueError(
            f"generator {generator!r} returned {type(rows).__name__}; expected a list (or iterable) of row dicts."
        )
    return list(rows)


def _reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as err:
        raise ImportError(
            f"the reasoning_gym generator and reward need the reasoning-gym package ({err}); install it "
            f"with {INSTALL_HINT}."
        ) from err
    return reasoning_gym


def _config_fields(config_cls: Any) -> list[str]:
    fields = getattr(config_cls, "__dataclass_fields__", None) or {}
    return sorted(name for name in fields if name not in ("size", "seed"))


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if callable(getattr(value, "tolist", None)):
        return value.tolist()
    return repr(value)


def _takes(fn: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _parameters(fn: Callable[..., Any]) -> list[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return []
