"""The critic for PPO: a value model initialised from the policy, with its own optimizer.

:class:`ValueModel` is a separate copy of the policy's transformer body plus a zero-initialised
scalar head. Its value for action token ``t`` is read from the same position whose logits predict
that token (the state before the action), so values line up with the trainer's ``[B, R]`` tensors.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor

from trine.algorithms import LossFn
from trine.models.batching import MicroBatch


class ValueModel(torch.nn.Module):
    """Transformer body + ``Linear(hidden, 1)`` head."""

    def __init__(self, body: torch.nn.Module, hidden_size: int) -> None:
        super().__init__()
        self.body = body
        self.head = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    @classmethod
    def from_policy(cls, policy: Any) -> ValueModel:
        """A critic whose body is a copy of ``policy``'s base model (HF ``base_model``)."""
        body = copy.deepcopy(policy.base_model)
        body.requires_grad_(True)
        critic = cls(body, policy.config.hidden_size)
        return critic.to(device=next(policy.parameters()).device, dtype=next(policy.parameters()).dtype)

    def forward(self, batch: MicroBatch) -> Tensor:
        """Values ``[B, R]`` for the response tokens of ``batch``."""
        resp = batch.targets.shape[1]
        out = self.body(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        )
        hidden = out.last_hidden_state[:, -(resp + 1) : -1]
        return self.head(hidden).squeeze(-1).float()


class Critic:
    """A value model with its optimizer, and the clipped value-loss update over micro-batches."""

    def __init__(
        self,
        model: ValueModel,
        *,
        lr: float,
        grad_clip: float = 1.0,
        warmup_steps: int = 0,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
    ) -> None:
        self.model = model
        self.grad_clip = grad_clip
        self.warmup_steps = warmup_steps
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, weight_decay=weight_decay)

    @torch.no_grad()
    def values(self, batch: MicroBatch) -> Tensor:
        self.model.eval()
        return self.model(batch)

    def update(
        self,
        batches: list[MicroBatch],
        loss_fn: LossFn,
        normalizer: float,
        agg_mode: str,
        loss_args: dict[str, Any],
    ) -> dict[str, float]:
        """One optimizer step of ``loss_fn(values, old_values, returns, ...)`` over the micro-batches."""
        self.model.train()
        sums: dict[str, float] = {}
        weight = 0.0
        for batch in batches:
            values = self.model(batch)
            loss, stats = loss_fn(
                values,
                batch.extras["old_values"],
                batch.extras["returns"],
                batch.action_mask,
                normalizer=normalizer,
                agg_mode=agg_mode,
                **loss_args,
            )
            loss.backward()
            w = float(batch.action_mask.sum())
            weight += w
            sums["value_loss"] = sums.get("value_loss", 0.0) + float(loss.detach())
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v * w
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip if self.grad_clip > 0 else float("inf"))
        if torch.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        out = {k: (v if k == "value_loss" else v / max(weight, 1.0)) for k, v in sums.items()}
        out["critic_grad_norm"] = float(norm)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
