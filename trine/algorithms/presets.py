"""Algorithms as small records, and the presets by name.

An :class:`Algorithm` names an advantage function and a loss function (keys of
``ADVANTAGES``/``LOSSES`` or import paths) plus their default arguments and the KL/entropy settings.
A config picks a preset with ``algorithm.name`` and may override any field; a user can also give
``"my_pkg.my_module:MY_ALGO"`` pointing at their own record.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from trine import registry
from trine.algorithms.aggregation import aggregate, step_normalizer
from trine.algorithms.inputs import ADVANTAGE_INPUTS, LOSS_INPUTS, check_args, needed_inputs
from trine.algorithms.kl import entropy_from_logits, kl_penalty


@dataclass(frozen=True)
class Algorithm:
    name: str
    loss: str
    """Key of ``trine.algorithms.LOSSES`` or an import path."""
    advantage: str | None = None
    """Key of ``trine.algorithms.ADVANTAGES`` or an import path; None for supervised losses."""
    advantage_args: dict[str, Any] = field(default_factory=dict)
    loss_args: dict[str, Any] = field(default_factory=dict)
    loss_agg: str = "token-mean"
    kl_coef: float = 0.0
    """Coefficient of the KL-to-reference loss term; > 0 loads a frozen reference model."""
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    """Coefficient of an entropy bonus (subtracted from the loss)."""
    needs_critic: bool = False
    from_rollouts: bool = True
    """True: trains on explorer rollouts. False: trains from a dataset (``train`` mode)."""
    paper: str = ""

    @property
    def needs_ref(self) -> bool:
        return self.kl_coef > 0

    # The functions the trainer calls, resolved by name (the trainer never imports this package).
    @property
    def advantage_fn(self) -> Any:
        return None if self.advantage is None else registry.resolve("advantage", self.advantage)

    @property
    def loss_fn(self) -> Any:
        return registry.resolve("loss", self.loss)

    @property
    def kl_fn(self) -> Any:
        return kl_penalty

    @property
    def entropy_fn(self) -> Any:
        return entropy_from_logits

    @property
    def normalizer_fn(self) -> Any:
        return step_normalizer

    @property
    def aggregate_fn(self) -> Any:
        return aggregate

    @property
    def advantage_inputs(self) -> tuple[str, ...]:
        """Batch inputs the advantage function reads (names from ``ADVANTAGE_INPUTS``)."""
        fn = self.advantage_fn
        return () if fn is None else needed_inputs(fn, ADVANTAGE_INPUTS)

    @property
    def loss_inputs(self) -> tuple[str, ...]:
        """Batch inputs the loss function reads (names from ``LOSS_INPUTS``)."""
        return needed_inputs(self.loss_fn, LOSS_INPUTS)

    def check_args(self) -> None:
        """Raise if ``advantage_args``/``loss_args`` name an argument the functions do not take."""
        if self.advantage is not None:
            check_args(self.advantage_fn, self.advantage_args, ADVANTAGE_INPUTS, "algorithm.advantage_args")
        check_args(self.loss_fn, self.loss_args, LOSS_INPUTS, "algorithm.loss_args")

    def with_overrides(self, **overrides: Any) -> Algorithm:
        """A copy with the given fields replaced (None values are ignored; dict args are merged)."""
        names = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"unknown algorithm field(s) {unknown}; valid fields: {sorted(names)}")
        changes = {k: v for k, v in overrides.items() if v is not None}
        for key in ("advantage_args", "loss_args"):
            if key in changes:
                changes[key] = {**getattr(self, key), **changes[key]}
        return replace(self, **changes)


PRESETS: dict[str, Algorithm] = {
    "grpo": Algorithm(
        name="grpo",
        advantage="grpo",
        loss="ppo_clip",
        loss_args={"clip_low": 0.2, "clip_high": 0.2},
        paper="DeepSeekMath (GRPO), arXiv 2402.03300",
    ),
    "sft": Algorithm(
        name="sft",
        loss="sft",
        from_rollouts=False,
        paper="Supervised fine-tuning (maximum likelihood)",
    ),
}
