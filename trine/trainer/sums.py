"""The metrics of one training step, summed over its micro-batches (and trainer ranks)."""

from __future__ import annotations

import torch

from trine.models.batching import MicroBatch
from trine.trainer.ranks import sum_floats


class StepSums:
    """Accumulates metrics: token-weighted micro-batch stats, per-optimizer-step sums, once-per-step stats."""

    def __init__(self) -> None:
        self.weighted: dict[str, float] = {}
        self.weight = 0.0
        self.per_step: dict[str, float] = {}
        self.steps: dict[str, int] = {}
        self.once: dict[str, float] = {}
        self.tokens = self.real = self.padded = 0

    def add_tokens(self, stats: dict[str, float], batch: MicroBatch) -> None:
        w = float(batch.action_mask.sum())
        for k, v in stats.items():  # every key, even at weight 0: trainer ranks sum the same keys
            self.weighted[k] = self.weighted.get(k, 0.0) + (v * w if w else 0.0)
        self.weight += w
        if w:  # an idle pass of a trainer rank trains nothing and counts no tokens
            self.tokens += batch.num_tokens
            real, padded = batch.forward_tokens
            self.real += real
            self.padded += padded

    def add_step(self, stats: dict[str, float]) -> None:
        for k, v in stats.items():
            self.per_step[k] = self.per_step.get(k, 0.0) + v
            self.steps[k] = self.steps.get(k, 0) + 1

    def add_once(self, stats: dict[str, float]) -> None:
        self.once.update(stats)

    def reduce(self, device: torch.device) -> None:
        """Sum what every trainer rank accumulated over its share of the step (same keys on every rank);
        the gradient norm is already global (FSDP2's clipping sees every shard)."""
        keys = sorted(self.weighted)
        local = {**{f"w/{k}": self.weighted[k] for k in keys}, "weight": self.weight}
        local.update(
            tokens=float(self.tokens),
            real=float(self.real),
            padded=float(self.padded),
            loss=self.per_step.get("loss", 0.0),
        )
        total = sum_floats(local, device)
        self.weighted = {k: total[f"w/{k}"] for k in keys}
        self.weight, self.tokens = total["weight"], int(total["tokens"])
        self.real, self.padded = int(total["real"]), int(total["padded"])
        if "loss" in self.per_step:
            self.per_step["loss"] = total["loss"]

    def result(self, prefix: str) -> dict[str, float]:
        out = {f"{prefix}{k}": v for k, v in self.once.items()}
        out.update({f"{prefix}{k}": v / max(self.weight, 1.0) for k, v in self.weighted.items()})
        out.update({f"{prefix}{k}": v / self.steps[k] for k, v in self.per_step.items()})
        return out
