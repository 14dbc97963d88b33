"""The algorithm record and the ``algorithm`` config section, declared once (re-exported by :mod:`trine.config`).

DESIGN §2: "an algorithm is a small record (...). Each field is declared once." :class:`AlgorithmRecord`
declares every field of the record: its type (with the range a config accepts), its default (what a
preset gets when it does not say) and its docstring. :class:`trine.algorithms.Algorithm` is this record
plus what needs the algorithms library (its functions' inputs, argument checks); the presets and plugin
algorithms are instances of it.

:class:`AlgorithmConfig` is derived from the record: ``name`` (a preset) and one override per record field
but those in :data:`NOT_OVERRIDABLE`, with the record's type and docstring and the default None (= keep
the preset's value). A field added to the record is therefore a config key at once, or listed in
:data:`NOT_OVERRIDABLE` with the reason (tests/unit/config/test_declarations.py checks that nothing else is
possible).

The record lives here, not in :mod:`trine.algorithms`, because the config is the base every part reads and
may not import the algorithms library (nor torch with it: ``trine --help`` reads the config).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator
from pydantic.fields import FieldInfo

from trine.config.base import NonNeg, NonNegInt, Positive, Section, _check_name

AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
"""Loss aggregations (:func:`trine.algorithms.aggregation.aggregate`)."""
KL_ESTIMATORS = ("k1", "k2", "k3", "low_var_kl", "abs", "mse")
"""KL estimators (:func:`trine.algorithms.kl.kl_penalty`)."""


class AlgorithmRecord(BaseModel):
    """An algorithm as data: the *names* of its advantage and loss functions, their default arguments,
    the KL / entropy settings, and what it needs from the rest of the loop (see the module docstring)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", strict=True, allow_inf_nan=False, use_attribute_docstrings=True
    )

    name: str
    """The name configs use (``algorithm.name``)."""
    advantage: str | None = None
    """The advantage function: a key of ``trine.algorithms.ADVANTAGES`` or an import path; None for
    supervised and pairwise losses."""
    loss: str
    """The policy loss: a key of ``trine.algorithms.LOSSES`` or an import path."""
    advantage_args: dict[str, Any] = {}
    """Extra keyword arguments of the advantage function (merged over the preset's)."""
    loss_args: dict[str, Any] = {}
    """Extra keyword arguments of the loss (e.g. clip_low, clip_high; merged over the preset's)."""
    loss_agg: Literal[AGG_MODES] = "token-mean"
    """Loss aggregation; normalized over the whole step, not per micro-batch."""
    kl_coef: NonNeg = 0.0
    """KL-to-reference loss coefficient (> 0 loads a frozen reference model)."""
    kl_estimator: Literal[KL_ESTIMATORS] = "k3"
    """KL estimator for the KL loss."""
    kl_mode: Literal["loss", "reward"] = "loss"
    """Where the KL to the reference goes: a loss term, or a per-token penalty inside the reward."""
    kl_target: Positive | None = None
    """Adaptive KL coefficient: steer towards this KL per token (None: fixed coefficient)."""
    kl_horizon: Positive = 10000.0
    """Adaptive KL horizon in samples."""
    entropy_coef: NonNeg = 0.0
    """Entropy bonus coefficient."""
    needs_critic: bool = False
    """Train a critic (value model) beside the policy (PPO)."""
    critic_args: dict[str, Any] = {}
    """Arguments of the critic's value loss (e.g. ``clip_eps``), for algorithms with a critic."""
    pairwise: bool = False
    """The loss reads (chosen, rejected) sequence pairs (DPO) instead of per-token rollouts."""
    rollout_args: dict[str, Any] = {}
    """Extra workflow arguments the algorithm needs from the explorer (e.g. ReMax's greedy baseline)."""
    dynamic_sampling: bool = False
    """Drop groups whose rewards all agree and draw more tasks until the batch is full (DAPO)."""
    max_extra_draws: NonNegInt = 4
    """Dynamic sampling: at most this many extra task draws per batch, then it proceeds smaller."""
    overlong_buffer: NonNeg = 0
    """Overlong reward shaping over the last N tokens before max_tokens (< 1: a fraction of max_tokens; 0: off)."""
    overlong_penalty: NonNeg = 1.0
    """Overlong reward shaping: the penalty at max_tokens."""
    expert_ratio: NonNeg = 0.0
    """MIX: expert rows per rollout row (from ``tasks.expert``)."""
    rollout_is: Literal["off", "token", "sequence"] = "off"
    """Rollout correction for an engine whose logprobs differ from the trainer's (vLLM, bf16 kernels):
    truncated importance weights ``min(π_old / π_rollout, cap)`` per ``token`` or per ``sequence`` (TIS);
    needs ``trainer.recompute_logprobs: true``. ``trainer/rollout_kl`` reports the mismatch either way."""
    rollout_is_cap: Positive = 2.0
    """Rollout correction: the cap of the importance weights (default 2)."""
    rollout_mask_threshold: Annotated[float, Field(gt=1)] | None = None
    """Rollout correction: drop sequences whose geometric-mean ratio ``π_old / π_rollout`` lies outside
    ``[1/M, M]`` (masked importance sampling); needs ``trainer.recompute_logprobs: true``."""
    from_rollouts: bool = True
    """True: trains on explorer rollouts. False: trains from a dataset (``train`` mode)."""
    paper: str = ""
    """Where the algorithm comes from (shown in ``docs/algorithms.md``)."""


NOT_OVERRIDABLE: dict[str, str] = {
    "name": "the config's algorithm.name picks the preset instead",
    "paper": "documentation of the record, not a setting",
    "needs_critic": "PPO's critic goes with its GAE advantage; pick the ppo preset",
    "pairwise": "the loss reads preference pairs; the data format follows the algorithm",
    "rollout_args": "what the algorithm's advantage needs from the workflow (ReMax's greedy baseline)",
    "from_rollouts": "decides the mode the algorithm runs in (sync or train)",
}
"""Record fields a config cannot override, and why. Every other record field is an ``algorithm`` key."""


def _override(field: FieldInfo) -> tuple[Any, FieldInfo]:
    """A record field as a config override: the same type and range or None (the default: the preset's value)."""
    annotation = Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation
    return annotation | None, Field(None, description=field.description)


class _PresetChoice(Section):
    """The ``algorithm`` section: a preset (``name``) and overrides of its fields (derived from the record)."""

    name: str = "grpo"
    """Preset name (``grpo``, ``sft``, ...) or ``package.module:ALGO``; fields below override it."""

    _name = field_validator("name")(lambda v: _check_name("algorithm", v))
    _adv = field_validator("advantage", check_fields=False)(lambda v: _check_name("advantage", v))
    _loss = field_validator("loss", check_fields=False)(lambda v: _check_name("loss", v))


AlgorithmConfig = create_model(
    "AlgorithmConfig",
    __base__=_PresetChoice,
    __module__=__name__,
    __doc__=_PresetChoice.__doc__,
    **{
        name: _override(field)
        for name, field in AlgorithmRecord.model_fields.items()
        if name not in NOT_OVERRIDABLE
    },
)
"""The ``algorithm`` config section: ``name`` and an override (None: the preset's value) of every field of
:class:`AlgorithmRecord` but :data:`NOT_OVERRIDABLE` (see the module docstring)."""
