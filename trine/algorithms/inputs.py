"""The batch inputs advantage and loss functions may take, and which ones a given function needs.

The trainer calls ``advantage_fn(rewards, group_ids, **inputs, **advantage_args)`` and
``loss_fn(logprobs=..., old_logprobs=..., advantages=..., action_mask=..., normalizer=...,
agg_mode=..., **inputs, **loss_args)``. Every built-in accepts and ignores inputs it does not use,
so passing a superset is safe; :func:`needed_inputs` tells the trainer which costly ones (a critic's
``values``, a reference or teacher forward pass) a function actually reads, and :func:`check_args`
catches misspelt configuration arguments, which ``**_`` would otherwise swallow.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

ADVANTAGE_INPUTS = (
    "rewards",
    "group_ids",
    "action_mask",
    "token_rewards",
    "values",
    "run_ids",
    "step_ids",
    "state_ids",
    "baseline_rewards",
)
"""Batch inputs of advantage functions (``[B]`` or ``[B, T]`` tensors)."""

LOSS_INPUTS = (
    "logprobs",
    "old_logprobs",
    "advantages",
    "action_mask",
    "normalizer",
    "expert_normalizer",
    "agg_mode",
    "ref_logprobs",
    "teacher_logprobs",
    "values",
    "old_values",
    "returns",
    "is_expert",
    "group_ids",
    "rewards",
)
"""Batch inputs of loss functions (tensors, the step normalizer(s) and the aggregation mode)."""


def _named_parameters(fn: Callable[..., Any] | inspect.Signature) -> dict[str, inspect.Parameter]:
    params = (fn if isinstance(fn, inspect.Signature) else inspect.signature(fn)).parameters
    return {
        name: p
        for name, p in params.items()
        if p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    }


def needed_inputs(fn: Callable[..., Any], known: tuple[str, ...]) -> tuple[str, ...]:
    """The names in ``known`` (e.g. :data:`LOSS_INPUTS`) that ``fn`` declares as parameters."""
    params = _named_parameters(fn)
    return tuple(name for name in known if name in params)


def check_args(
    fn: Callable[..., Any] | inspect.Signature,
    args: Mapping[str, Any],
    known: tuple[str, ...],
    what: str,
    name: str | None = None,
) -> None:
    """Raise if ``args`` (config arguments for ``fn``) has a name ``fn`` does not take, or a batch input.

    ``fn`` is the function or its signature (:func:`trine.registry.signature`, read without importing
    it); ``what`` names the setting in the message, e.g. ``"algorithm.loss_args"``, and ``name`` the
    function (default: its ``__name__``).
    """
    params = _named_parameters(fn)
    settable = sorted(name for name in params if name not in known)
    for key in args:
        if key in known:
            raise ValueError(
                f"{what}[{key!r}] is a batch input the trainer passes, not a setting; remove it."
            )
        if key not in params:
            raise ValueError(
                f"{what}[{key!r}] is not an argument of {name or getattr(fn, '__name__', fn)}; valid: {settable}"
            )
