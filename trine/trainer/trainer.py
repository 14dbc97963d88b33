"""The update step: advantages, micro-batching, accumulation over the whole step, AdamW.

``Trainer.step(experiences)`` is the ``buffer → trainer`` arrow: it computes advantages with the
algorithm's advantage function, splits the batch into ``mini_batches`` optimizer steps (repeated
``update_epochs`` times), each split into token-budget micro-batches whose losses are normalized
over the whole optimizer step (so the gradient does not depend on the micro-batch split), and
returns one flat dict of ``trainer/*`` metrics. The algorithm is passed in as a record exposing
``advantage_fn``, ``loss_fn``, ``kl_fn``, ``entropy_fn``, ``normalizer_fn`` and their settings; the
trainer never imports the algorithm package.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import Tensor

from trine.trainer.batching import MicroBatch, collate, forward_logprobs, plan_micro_batches
from trine.types import Experience


def lr_lambda(schedule: str, warmup_steps: int, total_steps: int | None, min_lr_ratio: float):
    """Multiplier of the base LR at optimizer step ``s``: linear warmup, then constant or cosine."""

    def factor(s: int) -> float:
        if warmup_steps and s < warmup_steps:
            return (s + 1) / warmup_steps
        if schedule == "constant" or not total_steps:
            return 1.0
        progress = min(1.0, (s - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


class Trainer:
    """Learns from experiences; owns the optimizer, LR schedule and the policy version."""

    def __init__(
        self,
        model: Any,
        algorithm: Any,
        *,
        pad_token_id: int,
        ref_model: Any = None,
        lr: float = 1e-5,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        lr_schedule: str = "constant",
        warmup_steps: int = 0,
        min_lr_ratio: float = 0.0,
        total_steps: int | None = None,
        grad_clip: float = 1.0,
        micro_batch_tokens: int = 8192,
        mini_batches: int = 1,
        update_epochs: int = 1,
        recompute_logprobs: bool = False,
        entropy_metric: bool = True,
        max_response_length: int | None = None,
        seed: int = 0,
    ) -> None:
        self.model = model
        self.algorithm = algorithm
        self.ref_model = ref_model
        self.pad_token_id = pad_token_id
        self.grad_clip = grad_clip
        self.micro_batch_tokens = micro_batch_tokens
        self.mini_batches = mini_batches
        self.update_epochs = update_epochs
        self.recompute_logprobs = recompute_logprobs
        self.entropy_metric = entropy_metric
        self.max_response_length = max_response_length
        self.device = next(model.parameters()).device
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(
            params, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay
        )
        optimizer_steps = total_steps * mini_batches * update_epochs if total_steps else None
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(lr_schedule, warmup_steps, optimizer_steps, min_lr_ratio)
        )
        self.rng = torch.Generator().manual_seed(seed)
        self.version = 0

    # ------------------------------------------------------------------ the step
    def step(self, experiences: list[Experience]) -> dict[str, float]:
        """One training step on one batch; returns ``trainer/*`` metrics and bumps the version."""
        if not experiences:  # every task of the batch was skipped: keep the version schedule
            self.version += 1
            return {"trainer/empty_batch": 1.0}
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        advantages = self._advantages(experiences, metrics)
        minis = self._prepare(experiences, advantages)
        self.model.train()
        lr = self.optimizer.param_groups[0]["lr"]  # the LR this step trains with (before scheduler.step)
        sums: dict[str, float] = {}
        tokens = padded = 0
        for _ in range(self.update_epochs):
            for batches, normalizer in minis:
                loss_total = 0.0
                for batch in batches:
                    loss, stats = self._micro_step(batch, normalizer)
                    loss_total += float(loss)
                    weight = float(batch.action_mask.sum())
                    for k, v in stats.items():
                        sums[k] = sums.get(k, 0.0) + v * weight
                    sums["_weight"] = sums.get("_weight", 0.0) + weight
                    tokens += batch.num_tokens
                    padded += batch.padded_tokens
                grad_norm = self._optimizer_step()
                sums["loss"] = sums.get("loss", 0.0) + loss_total
                sums["grad_norm"] = sums.get("grad_norm", 0.0) + grad_norm
                sums["_opt_steps"] = sums.get("_opt_steps", 0.0) + 1
        self.version += 1
        elapsed = time.perf_counter() - start
        opt_steps, weight = sums.pop("_opt_steps"), max(sums.pop("_weight"), 1.0)
        for key, value in sums.items():
            metrics[f"trainer/{key}"] = value / (opt_steps if key in ("loss", "grad_norm") else weight)
        metrics.update(
            {
                "trainer/lr": lr,
                "trainer/tokens_per_second": tokens / max(elapsed, 1e-9),
                "trainer/padding_fraction": 1.0 - tokens / max(padded, 1),
                "trainer/batch_size": float(len(experiences)),
                "time/train_seconds": elapsed,
            }
        )
        return metrics

    def _advantages(self, experiences: list[Experience], metrics: dict[str, float]) -> Tensor | None:
        fn = self.algorithm.advantage_fn
        if fn is None:
            return None
        missing = [e.id for e in experiences if e.reward is None]
        if missing:
            raise ValueError(
                f"{len(missing)} experiences have no reward yet (e.g. {missing[0]}); "
                "the buffer must only hand out experiences whose reward is ready."
            )
        rewards = torch.tensor([float(e.reward) for e in experiences], dtype=torch.float32)
        seen: dict[str, int] = {}
        groups = torch.tensor([seen.setdefault(e.group_id or e.id, len(seen)) for e in experiences])
        adv, stats = fn(rewards, groups, **self.algorithm.advantage_args)
        metrics.update({f"trainer/{k}": v for k, v in stats.items()})
        return adv

    def _prepare(
        self, experiences: list[Experience], advantages: Tensor | None
    ) -> list[tuple[list[MicroBatch], float]]:
        """Split into mini-batches and micro-batches once; attach advantages, old and ref logprobs."""
        order = (
            torch.randperm(len(experiences), generator=self.rng).tolist()
            if self.mini_batches > 1
            else list(range(len(experiences)))
        )
        size = math.ceil(len(order) / self.mini_batches)
        algo = self.algorithm
        minis = []
        for start in range(0, len(order), size):
            rows = order[start : start + size]
            plan = plan_micro_batches([len(experiences[i].tokens) for i in rows], self.micro_batch_tokens)
            batches = [
                collate(experiences, [rows[j] for j in p], self.pad_token_id, self.device) for p in plan
            ]
            for batch in batches:
                if advantages is not None:
                    batch.extras["advantages"] = advantages[batch.rows].to(self.device)
                self._attach_logprobs(batch)
            normalizer = algo.normalizer_fn(
                [b.action_mask for b in batches], algo.loss_agg, max_response_length=self.max_response_length
            )
            minis.append((batches, normalizer))
        return minis

    @torch.no_grad()
    def _attach_logprobs(self, batch: MicroBatch) -> None:
        needs_old = self.algorithm.advantage_fn is not None
        if needs_old and (self.recompute_logprobs or batch.old_logprobs is None):
            self.model.eval()
            batch.old_logprobs, _ = forward_logprobs(self.model, batch)
        if self.algorithm.needs_ref:
            if self.ref_model is None:
                raise ValueError(
                    "the algorithm has kl_coef > 0 but no reference model was given to the Trainer."
                )
            batch.extras["ref_logprobs"], _ = forward_logprobs(self.ref_model, batch)

    def _micro_step(self, batch: MicroBatch, normalizer: float) -> tuple[Tensor, dict[str, float]]:
        algo = self.algorithm
        logprobs, entropy = forward_logprobs(
            self.model, batch, entropy_fn=algo.entropy_fn if self.entropy_metric else None
        )
        old = batch.old_logprobs if batch.old_logprobs is not None else logprobs.detach()
        loss, stats = algo.loss_fn(
            logprobs=logprobs,
            old_logprobs=old,
            advantages=batch.extras.get("advantages"),
            action_mask=batch.action_mask,
            normalizer=normalizer,
            agg_mode=algo.loss_agg,
            **algo.loss_args,
        )
        mask = batch.action_mask
        if algo.needs_ref:
            kl = algo.kl_fn(logprobs, batch.extras["ref_logprobs"], algo.kl_estimator)
            loss = loss + algo.kl_coef * algo.aggregate_fn(kl, mask, algo.loss_agg, normalizer)
            stats["kl"] = float((kl.detach() * mask).sum() / mask.sum().clamp(min=1))
        if entropy is not None:
            stats["entropy"] = float((entropy * mask).sum() / mask.sum().clamp(min=1))
        loss.backward()
        return loss.detach(), stats

    def _optimizer_step(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip if self.grad_clip > 0 else float("inf"))
        if torch.isfinite(norm):
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": self.rng.get_state(),
            "version": self.version,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.rng.set_state(state["rng"])
        self.version = state["version"]
