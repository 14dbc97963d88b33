"""Algorithms as small records, and the presets by name.

An :class:`Algorithm` names an advantage function and a loss function (keys of
``ADVANTAGES``/``LOSSES`` or import paths) plus their default arguments and the KL/entropy settings.
A config picks a preset with ``algorithm.name`` and may override any field; a user can also give
``"my_pkg.my_module:MY_ALGO"`` pointing at their own record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trine import registry
from trine.algorithms.inputs import ADVANTAGE_INPUTS, LOSS_INPUTS, check_args, needed_inputs
from trine.config.algorithm import AlgorithmRecord

if TYPE_CHECKING:
    from torch import Tensor

EXPLORER_FIELDS = (
    "rollout_args",
    "dynamic_sampling",
    "max_extra_draws",
    "overlong_buffer",
    "overlong_penalty",
    "expert_ratio",
)
"""The record's fields that the explorer side reads (what to sample, how to shape and refill a batch,
which rows to add); the trainer reads none of them (tests/unit/trainer/test_trainer.py checks)."""


class Algorithm(AlgorithmRecord):
    """An algorithm as data (the fields, their types, defaults and docstrings: :class:`AlgorithmRecord`,
    declared once in :mod:`trine.config.algorithm`, where the ``algorithm`` config section is derived
    from them): the *names* of its advantage and loss functions (resolved by :func:`resolve_advantage` /
    :func:`resolve_loss`), their default arguments, the KL / entropy settings, and what it needs from the
    rest of the loop. The trainer reads the math settings and imports the fixed helpers (KL, entropy,
    aggregation, critic loss) from ``trine.algorithms`` itself; the explorer side reads
    :data:`EXPLORER_FIELDS`."""

    @property
    def needs_ref(self) -> bool:
        """A frozen reference model is needed: a KL term, a reference-based loss, or pairs (DPO)."""
        return self.kl_coef > 0 or self.pairwise or "ref_logprobs" in self.loss_inputs

    @property
    def advantage_inputs(self) -> tuple[str, ...]:
        """Batch inputs the advantage function reads (names from ``ADVANTAGE_INPUTS``)."""
        fn = resolve_advantage(self)
        return () if fn is None else needed_inputs(fn, ADVANTAGE_INPUTS)

    @property
    def loss_inputs(self) -> tuple[str, ...]:
        """Batch inputs the loss function reads (names from ``LOSS_INPUTS``)."""
        return needed_inputs(resolve_loss(self), LOSS_INPUTS)

    def check_args(self) -> None:
        """Raise if ``advantage_args``/``loss_args`` name an argument the functions do not take. Only the
        functions' signatures are read: a built-in is not imported (no torch at ``trine validate``)."""
        if self.advantage is not None:
            advantage = registry.signature("advantage", self.advantage)
            what = f"advantage {self.advantage!r}"
            check_args(advantage, self.advantage_args, ADVANTAGE_INPUTS, "algorithm.advantage_args", what)
        loss = registry.signature("loss", self.loss)
        check_args(loss, self.loss_args, LOSS_INPUTS, "algorithm.loss_args", f"loss {self.loss!r}")

    def with_overrides(self, **overrides: Any) -> Algorithm:
        """A copy with the given fields replaced (None values are ignored; dict args are merged)."""
        names = set(type(self).model_fields)
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise ValueError(f"unknown algorithm field(s) {unknown}; valid fields: {sorted(names)}")
        changes = {k: v for k, v in overrides.items() if v is not None}
        for fn_key, args_key in (("advantage", "advantage_args"), ("loss", "loss_args")):
            # the preset's arguments belong to the preset's function: a replaced function starts empty
            same = changes.get(fn_key, getattr(self, fn_key)) == getattr(self, fn_key)
            base = getattr(self, args_key) if same else {}
            changes[args_key] = {**base, **changes.get(args_key, {})}
        return self.model_copy(update=changes)


AdvantageFn = Callable[..., "tuple[Tensor, dict[str, float]]"]
"""``(rewards, group_ids, **inputs, **advantage_args) -> (advantages, stats)`` (see :mod:`.inputs`)."""
LossFn = Callable[..., "tuple[Tensor, dict[str, float]]"]
"""``(logprobs=..., old_logprobs=..., ..., **loss_args) -> (loss, stats)`` (see :mod:`.inputs`)."""


def resolve_advantage(algo: Algorithm) -> AdvantageFn | None:
    """The advantage function ``algo.advantage`` names (a built-in, a plugin or an import path);
    None for algorithms without advantages (supervised and pairwise losses)."""
    return None if algo.advantage is None else registry.resolve("advantage", algo.advantage)


def resolve_loss(algo: Algorithm) -> LossFn:
    """The loss function ``algo.loss`` names (a built-in, a plugin or an import path)."""
    return registry.resolve("loss", algo.loss)


def _preset(name: str, advantage: str | None, loss: str, paper: str, **fields_: Any) -> Algorithm:
    return Algorithm(name=name, advantage=advantage, loss=loss, paper=paper, **fields_)


PRESETS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        _preset(
            "grpo",
            "grpo",
            "ppo_clip",
            "DeepSeekMath (GRPO), arXiv 2402.03300",
            loss_args={"clip_low": 0.2, "clip_high": 0.2},
        ),
        _preset(
            "dr_grpo",
            "dr_grpo",
            "ppo_clip",
            "Understanding R1-Zero-Like Training (Dr. GRPO), arXiv 2503.20783",
            loss_agg="seq-mean-token-sum-norm",
        ),
        _preset(
            "dapo",
            "grpo",
            "ppo_clip",
            "DAPO, arXiv 2503.14476",
            loss_args={"clip_low": 0.2, "clip_high": 0.28},
            dynamic_sampling=True,
            overlong_buffer=0.2,
            overlong_penalty=1.0,
        ),
        _preset(
            "gspo",
            "grpo",
            "gspo",
            "Group Sequence Policy Optimization, arXiv 2507.18071",
            loss_agg="seq-mean-token-mean",
        ),
        _preset("cispo", "grpo", "cispo", "MiniMax-M1 (CISPO), arXiv 2506.13585"),
        _preset("sapo", "grpo", "sapo", "Soft Adaptive Policy Optimization (SAPO), arXiv 2511.20347"),
        _preset("rloo", "rloo", "ppo_clip", "Back to Basics: REINFORCE Leave-One-Out, arXiv 2402.14740"),
        _preset("reinforce_pp", "reinforce_pp", "ppo_clip", "REINFORCE++, arXiv 2501.03262"),
        _preset(
            "remax", "remax", "ppo_clip", "ReMax, arXiv 2310.10505", rollout_args={"greedy_baseline": True}
        ),
        _preset(
            "opmd",
            "opmd",
            "opmd",
            "Trinity-RFT (OPMD), arXiv 2505.17826 App. A",
            advantage_args={"tau": 1.0},
            loss_args={"tau": 1.0},
        ),
        _preset(
            "opmd_pairwise",
            "opmd",
            "opmd_pairwise",
            "Trinity-RFT (pairwise OPMD), arXiv 2505.17826 App. A",
            loss_agg="seq-mean-token-mean",
        ),
        _preset("asymre", "asymre", "pg", "Asymmetric REINFORCE, arXiv 2506.20520"),
        _preset(
            "ppo",
            "gae",
            "ppo_clip",
            "PPO, arXiv 1707.06347 (GAE: arXiv 1506.02438)",
            needs_critic=True,
            advantage_args={"gamma": 1.0, "lam": 0.95},
            critic_args={"clip_eps": 0.2},
        ),
        _preset(
            "mix",
            "grpo",
            "mix",
            "Trinity-RFT (MIX), arXiv 2505.17826",
            loss_args={"mu": 0.1},
            expert_ratio=0.25,
        ),
        _preset(
            "multi_step_grpo", "step_wise_grpo", "ppo_clip", "Trinity-RFT multi-step GRPO, arXiv 2505.17826"
        ),
        _preset(
            "gigpo",
            "gigpo",
            "ppo_clip",
            "GiGPO, arXiv 2505.10978",
            advantage_args={"omega": 1.0, "gamma": 0.95},
        ),
        _preset(
            "distill", None, "distill", "On-policy distillation (reverse KL to a teacher), arXiv 2306.13649"
        ),
        _preset("sft", None, "sft", "Supervised fine-tuning (maximum likelihood)", from_rollouts=False),
        _preset(
            "dpo",
            None,
            "dpo",
            "Direct Preference Optimization, arXiv 2305.18290",
            from_rollouts=False,
            pairwise=True,
            loss_args={"beta": 0.1},
        ),
    )
}


def presets_markdown() -> str:
    """The table of presets in ``docs/algorithms.md`` (generated, so it cannot drift)."""

    def call(name: str | None, args: dict[str, Any]) -> str:
        if name is None:
            return "-"
        return f"`{name}`" + (f" ({', '.join(f'{k}={v}' for k, v in args.items())})" if args else "")

    rows = [
        "| preset | advantage | loss | aggregation | KL / entropy | needs | paper |",
        "|---|---|---|---|---|---|---|",
    ]
    for a in PRESETS.values():
        kl = f"{a.kl_estimator} KL × {a.kl_coef}" if a.kl_coef else "-"
        kl += f", entropy × {a.entropy_coef}" if a.entropy_coef else ""
        needs = [
            x
            for x, on in (
                ("critic", a.needs_critic),
                ("reference model", a.needs_ref),
                ("preference pairs", a.pairwise),
                ("dynamic sampling", a.dynamic_sampling),
                (f"overlong shaping ({a.overlong_buffer} tokens)", a.overlong_buffer),
                (f"expert rows × {a.expert_ratio}", a.expert_ratio),
                ("greedy baseline rollout", a.rollout_args),
                ("teacher model", a.loss == "distill"),
                ("step-wise workflow", a.advantage in ("step_wise_grpo", "gigpo")),
                ("dataset (train mode)", not a.from_rollouts),
            )
            if on
        ]
        rows.append(
            f"| `{a.name}` | {call(a.advantage, a.advantage_args)} | {call(a.loss, a.loss_args)} "
            f"| {a.loss_agg} | {kl} | {', '.join(needs) or '-'} | {a.paper} |"
        )
    return "\n".join(rows)
