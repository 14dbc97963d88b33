"""The update step: advantages, micro-batching, accumulation over the whole step, AdamW.

``Trainer.step(experiences)`` is the ``buffer → trainer`` arrow. It builds the batch inputs the
algorithm's functions read (:mod:`trine.trainer.inputs`; critic values, reference logprobs and
teacher logprobs only when needed), computes advantages, splits the batch into ``mini_batches``
optimizer steps (repeated ``update_epochs`` times), each split into token-budget micro-batches whose
losses are normalized over the whole optimizer step (so the gradient does not depend on the split),
updates the critic when there is one, and returns one flat dict of ``trainer/*`` metrics.

The algorithm is a record (:class:`trine.algorithms.Algorithm`): the names of its advantage and
loss functions, resolved once when the Trainer is built, and their settings. The optimizer, schedule,
micro-batching and precision settings come as the ``trainer`` config section itself
(:class:`~trine.config.TrainerConfig`), where each is declared once. The fixed math (KL,
entropy, aggregation, normalizers, GAE returns, the critic's value loss) is imported from
``trine.algorithms``, the pure-math library under the trainer. Preference pairs (DPO) take
:meth:`Trainer._pair_updates`.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any

import torch
from torch import Tensor

from trine.algorithms import (
    CORRECTION_SUMS,
    Algorithm,
    adaptive_kl_coef,
    aggregate,
    correction_metrics,
    entropy_bonus,
    entropy_from_logits,
    gae,
    kl_in_reward,
    kl_penalty,
    outcome_token_rewards,
    resolve_advantage,
    resolve_loss,
    rollout_correction,
    sequence_logps,
    split_normalizer,
    step_normalizer,
    value_loss,
)
from trine.config import TrainerConfig
from trine.models.batching import (
    MicroBatch,
    choose_micro_batches,
    collate,
    forward_logprobs,
    response_logprobs,
)
from trine.models.shared_prompt import shared_pays, unsupported_reason
from trine.trainer.inputs import (
    SAMPLE_INPUTS,
    TOKEN_INPUTS,
    sample_inputs,
    slice_rows,
    token_inputs,
)
from trine.trainer.ranks import idle_batch, my_share, sum_across, sum_floats, world
from trine.trainer.sums import StepSums
from trine.types import Experience

STANDARD_LOSS_INPUTS = ("logprobs", "old_logprobs", "advantages", "action_mask", "normalizer", "agg_mode")


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
    """Learns from experiences; owns the optimizer, LR schedule, the critic and the policy version."""

    def __init__(
        self,
        model: Any,
        algorithm: Algorithm,
        settings: TrainerConfig | None = None,
        *,
        pad_token_id: int,
        ref_model: Any = None,
        critic: Any = None,
        total_steps: int | None = None,
        max_response_length: int | None = None,
        seed: int = 0,
        teacher: Any = None,
        entropy_metric: bool = True,
    ) -> None:
        """``settings``: the ``trainer`` config section (None: its defaults); the Trainer reads the optimizer,
        schedule, micro-batching and precision fields, and :data:`trine.build.ROUTED` names who reads the
        others. The rest are plain arguments: ``total_steps`` (the LR schedule's length),
        ``max_response_length`` (``seq-mean-token-sum-norm``'s constant), ``seed`` (mini-batch shuffles),
        ``teacher`` (distillation), ``entropy_metric`` (report ``trainer/entropy``)."""
        if settings is None:
            settings = TrainerConfig()
        self.model = model
        self.algorithm = algorithm
        self.advantage_fn = resolve_advantage(algorithm)
        """The algorithm's advantage function (None for supervised and pairwise losses)."""
        self.loss_fn = resolve_loss(algorithm)
        """The algorithm's loss function."""
        self.advantage_inputs = algorithm.advantage_inputs
        """Batch inputs the advantage function reads."""
        self.loss_inputs = algorithm.loss_inputs
        """Batch inputs the loss function reads."""
        self.ref_model = ref_model
        self.teacher = teacher
        """Frozen teacher model: scores every response into ``info["teacher_logprobs"]`` (distillation)."""
        self.critic = critic
        self.pad_token_id = pad_token_id
        self.grad_clip = settings.grad_clip
        self.micro_batch_tokens = settings.micro_batch_tokens
        self.mini_batches = settings.mini_batches
        self.update_epochs = settings.update_epochs
        self.recompute_logprobs = settings.recompute_logprobs
        self.train_statuses = frozenset(settings.train_statuses)
        self.entropy_metric = entropy_metric
        self.max_response_length = max_response_length
        self.device = next(model.parameters()).device
        self.precision = settings.precision
        """``bf16``: forwards under bfloat16 autocast, float32 weights and loss math (:meth:`autocast`)."""
        self.packed = settings.packed
        """Micro-batches run packed, without padding (:func:`trine.models.batching.packed_logits`)."""
        self.shared_prompt = settings.shared_prompt
        """Micro-batches run each distinct prompt once (:meth:`_micro_plan`): True, False or ``auto``."""
        if self.shared_prompt is not False and (reason := unsupported_reason(model)) is not None:
            if self.shared_prompt is True:
                raise ValueError(
                    f"trainer.shared_prompt: true, but {reason}, which the shared-prompt forward cannot "
                    "run with; set trainer.shared_prompt: auto (it then stays off) or false"
                )
            self.shared_prompt = False
        self.world, self.rank = world()
        """Trainer ranks (:mod:`trine.trainer.ranks`): each runs its share of every step's micro-batches."""
        if self.world > 1:
            sharded = any(hasattr(p, "full_tensor") for p in model.parameters())
            if not sharded or critic is not None:
                raise ValueError(
                    f"{self.world} trainer ranks need the policy sharded by FSDP2 (trainer.fsdp: true) and no "
                    f"critic (the critic is not sharded); got fsdp={sharded}, critic={critic is not None}"
                )
        params = [p for p in model.parameters() if p.requires_grad]
        adamw = {
            "lr": settings.lr,
            "betas": tuple(settings.betas),
            "eps": settings.eps,
            "weight_decay": settings.weight_decay,
        }
        fused = {"fused": True} if settings.fused_adamw else {}
        try:
            self.optimizer = torch.optim.AdamW(params, **adamw, **fused)
        except RuntimeError as err:  # no fused kernel for this device/dtype
            raise ValueError(
                f"trainer.fused_adamw=true, but torch has no fused AdamW for these parameters ({err}); "
                "set trainer.fused_adamw: false."
            ) from err
        optimizer_steps = total_steps * self.mini_batches * self.update_epochs if total_steps else None
        schedule = lr_lambda(
            settings.lr_schedule, settings.warmup_steps, optimizer_steps, settings.min_lr_ratio
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
        self.rng = torch.Generator().manual_seed(seed)
        self.version = 0
        self.kl_coef = float(algorithm.kl_coef)
        """The KL coefficient in use (moves when the algorithm has an adaptive ``kl_target``)."""
        self._observed_kl = 0.0

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context every forward of the trainer runs in: bfloat16 autocast under ``precision:
        bf16`` (matmuls in bf16, weights and the float32 logits math untouched), else nothing."""
        if self.precision == "bf16":
            return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _logprobs(self, model: Any, batch: MicroBatch, **kwargs: Any) -> tuple[Tensor, Tensor | None]:
        with self.autocast():
            return forward_logprobs(model, batch, packed=self.packed, **kwargs)

    # ------------------------------------------------------------------ the step
    def step(self, experiences: list[Experience]) -> dict[str, float]:
        """One training step on one batch; returns ``trainer/*`` metrics and bumps the version.
        Experiences whose trajectory status is not in ``train_statuses`` stay out of the loss (and out
        of their group's statistics), counted in ``trainer/excluded_status``. ``trainer/reward_mean`` is
        the mean reward of the rollouts trained on (the rewards as they reached the trainer: delayed or
        human ones landed, shaping applied), in every mode, also where the explorer runs elsewhere."""
        kept = [e for e in experiences if e.status in self.train_statuses]
        excluded = (
            {"trainer/excluded_status": float(len(experiences) - len(kept))}
            if len(kept) < len(experiences)
            else {}
        )
        experiences = kept
        if not experiences:  # every task of the batch was skipped: keep the version schedule
            self.version += 1
            return {"trainer/empty_batch": 1.0, **excluded}
        start = time.perf_counter()
        lr = self.optimizer.param_groups[0]["lr"]  # the LR this step trains with (before scheduler.step)
        stats = StepSums()
        if self.teacher is not None:
            self._score_with_teacher(experiences)
        if self.algorithm.pairwise:
            self._pair_updates(experiences, stats)
        else:
            minis = self._prepare(experiences, stats)
            policy_on = self.critic is None or self.version >= self.critic.warmup_steps
            for _ in range(self.update_epochs):
                for batches, norms in minis:
                    if policy_on:
                        self._policy_update(batches, norms, stats)
                    if self.critic is not None:
                        a = self.algorithm
                        stats.add_step(
                            self.critic.update(
                                batches, value_loss, norms["normalizer"], a.loss_agg, a.critic_args
                            )
                        )
        self.version += 1
        if self.world > 1:  # every rank ran its share: the step's sums over all of them
            stats.reduce(self.device)
        self._adapt_kl(stats, len(experiences))
        elapsed = time.perf_counter() - start
        metrics = stats.result("trainer/")
        metrics.update(
            {
                "trainer/lr": lr,
                "trainer/tokens_per_second": stats.tokens / max(elapsed, 1e-9),
                "trainer/padding_fraction": 1.0 - stats.real / max(stats.padded, 1),
                "trainer/batch_size": float(len(experiences)),
                "time/train_seconds": elapsed,
                **excluded,
            }
        )
        rewards = [float(e.reward) for e in experiences if e.kind == "rollout" and e.reward is not None]
        if rewards:
            metrics["trainer/reward_mean"] = sum(rewards) / len(rewards)
        return metrics

    # ------------------------------------------------------------------ preparing the inputs
    def _score_with_teacher(self, experiences: list[Experience]) -> None:
        """The teacher's logprobs of every response not scored yet, into ``info["teacher_logprobs"]``
        (an input of the loss, like ``ref_logprobs``)."""
        todo = [e for e in experiences if e.info.get("teacher_logprobs") is None]
        pairs = [(e.tokens[: e.prompt_length], e.response_tokens) for e in todo]
        shared = self.shared_prompt if unsupported_reason(self.teacher) is None else False
        scores = (
            response_logprobs(self.teacher, pairs, pad_id=self.pad_token_id, shared_prompt=shared)
            if pairs
            else []
        )
        for e, logprobs in zip(todo, scores):
            e.info["teacher_logprobs"] = logprobs

    def _prepare(
        self, exps: list[Experience], stats: StepSums
    ) -> list[tuple[list[MicroBatch], dict[str, float]]]:
        """Mini-batches of collated micro-batches with every input their loss needs attached."""
        algo = self.algorithm
        width = max(e.response_length for e in exps)
        minis = self._plan(exps)
        every = [b for mbs, _ in minis for b in mbs]  # the step's micro-batches (inputs and normalizers)
        batches = [b for _, mine in minis for b in mine]  # this rank's share, the forward passes
        idle = [b for b in batches if all(b is not x for x in every)]
        adv_names = set(self.advantage_inputs)
        loss_names = set(self.loss_inputs) - set(STANDARD_LOSS_INPUTS)
        step: dict[str, Tensor] = sample_inputs(
            exps, tuple(n for n in SAMPLE_INPUTS if n in adv_names | loss_names)
        )
        token_names = (adv_names | loss_names) & set(TOKEN_INPUTS)
        if self.critic is not None:
            token_names |= {"token_rewards", "action_mask"}
            step["values"] = self._assemble(batches, self.critic.values, len(exps), width)
        step.update(token_inputs(exps, tuple(sorted(token_names)), width))
        with getattr(self.ref_model, "on_device", contextlib.nullcontext)():  # ref_offload: moved once
            for batch in batches:
                self._attach_logprobs(batch)
        if algo.needs_ref and algo.kl_mode == "reward":
            self._kl_into_rewards(exps, batches, step, width, stats)
        advantages = self._advantages(exps, step, stats)
        for batch in every + idle:
            rows, w = batch.rows, batch.targets.shape[1]
            if advantages is not None:
                batch.extras["advantages"] = slice_rows(advantages, rows, w).to(self.device)
            for name in loss_names & set(step):
                batch.extras[name] = slice_rows(step[name], rows, w).to(self.device)
            if self.critic is not None:
                batch.extras["old_values"] = slice_rows(step["values"], rows, w).to(self.device)
                batch.extras["returns"] = slice_rows(step["returns"], rows, w).to(self.device)
        norms = [self._normalizers(mbs) for mbs, _ in minis]  # over every rank's rows, before corrections
        mismatch: dict[str, float] = {}
        for batch in batches:
            if "rollout_logprobs" in batch.extras and advantages is not None:
                self._correct_rollout(batch, mismatch)
        if self.world > 1 and advantages is not None and self.recompute_logprobs:
            mismatch = sum_floats({k: mismatch.get(k, 0.0) for k in CORRECTION_SUMS}, self.device)
        if mismatch.get("tokens"):
            stats.add_once(correction_metrics(mismatch))
        return [(mine, n) for (_, mine), n in zip(minis, norms)]

    def _correct_rollout(self, batch: MicroBatch, sums: dict[str, float]) -> None:
        """Rollout correction (``algorithm.rollout_is`` / ``rollout_mask_threshold``): the advantages
        scaled by the truncated importance weights, masked sequences out of the loss; the mismatch
        metrics (``trainer/rollout_kl``, ...) whenever engine logprobs were replaced by the trainer's."""
        algo = self.algorithm
        rollout = batch.extras.pop("rollout_logprobs")
        weights, keep, part = rollout_correction(
            batch.old_logprobs,
            rollout,
            batch.action_mask,
            level=algo.rollout_is,  # type: ignore[arg-type]
            cap=algo.rollout_is_cap,
            mask_threshold=algo.rollout_mask_threshold,
        )
        for k, v in part.items():
            sums[k] = sums.get(k, 0.0) + v
        adv = batch.extras["advantages"]
        if algo.rollout_is == "sequence" and adv.dim() == 1:  # one weight per row keeps [B] advantages
            batch.extras["advantages"] = adv * weights.amax(-1)
        elif algo.rollout_is != "off":
            batch.extras["advantages"] = (adv.unsqueeze(-1) if adv.dim() == 1 else adv) * weights
        if algo.rollout_mask_threshold is not None:
            batch.action_mask = batch.action_mask * keep

    def _plan(self, exps: list[Experience]) -> list[tuple[list[MicroBatch], list[MicroBatch]]]:
        """Per mini-batch: (all its micro-batches, this rank's share of them)."""
        order = list(range(len(exps)))
        if self.mini_batches > 1:
            order = torch.randperm(len(exps), generator=self.rng).tolist()
        size = math.ceil(len(order) / self.mini_batches)
        minis = []
        for start in range(0, len(order), size):
            rows = order[start : start + size]
            plan, shared = self._micro_plan([exps[i] for i in rows])
            every = [
                collate(exps, [rows[j] for j in p], self.pad_token_id, self.device, shared_prompt=shared)
                for p in plan
            ]
            minis.append(
                (every, my_share(every, self.world, self.rank, idle_batch) if self.world > 1 else every)
            )
        return minis

    def _micro_plan(self, exps: list[Experience]) -> tuple[list[list[int]], bool]:
        """A mini-batch's micro-batches (indices into ``exps``) and whether they run the shared-prompt
        forward (``trainer.shared_prompt``, :func:`~trine.models.batching.choose_micro_batches`)."""
        return choose_micro_batches(
            [e.tokens[: e.prompt_length] for e in exps],
            [e.response_length for e in exps],
            self.micro_batch_tokens,
            self.shared_prompt,
            self.packed,
        )

    def _assemble(self, batches: list[MicroBatch], fn: Any, n: int, width: int) -> Tensor:
        """Run ``fn(batch) -> [B_mb, R_mb]`` on every micro-batch; gather into a right-aligned ``[n, width]``."""
        out = torch.zeros((n, width), dtype=torch.float32)
        for batch in batches:
            if self.world > 1 and not batch.action_mask.any():  # an idle copy: its rows are another rank's
                continue
            values = fn(batch).detach().float().cpu()
            out[batch.rows, width - values.shape[1] :] = values
        return sum_across(out, self.device) if self.world > 1 else out

    def _advantages(self, exps: list[Experience], step: dict[str, Tensor], stats: StepSums) -> Tensor | None:
        algo = self.algorithm
        fn = self.advantage_fn
        if fn is None:
            return None
        missing = [e.id for e in exps if e.reward is None]
        if missing:
            raise ValueError(
                f"{len(missing)} experiences have no reward yet (e.g. {missing[0]}); "
                "the buffer must only hand out experiences whose reward is ready."
            )
        base = sample_inputs(exps, ("rewards", "group_ids"))
        base["rewards"] = step.get("shaped_rewards", base["rewards"])
        extra = {k: step[k] for k in self.advantage_inputs if k in step and k not in base}
        adv, adv_stats = fn(base["rewards"], base["group_ids"], **extra, **algo.advantage_args)
        stats.add_once(adv_stats)
        if self.critic is not None:
            token_rewards = step.get("token_rewards")
            if token_rewards is None:
                token_rewards = outcome_token_rewards(base["rewards"], step["action_mask"]).float()
            gamma, lam = algo.advantage_args.get("gamma", 1.0), algo.advantage_args.get("lam", 1.0)
            _, step["returns"] = gae(token_rewards, step["values"], step["action_mask"], gamma, lam)
        return adv.float()

    def _kl_into_rewards(
        self,
        exps: list[Experience],
        batches: list[MicroBatch],
        step: dict[str, Tensor],
        width: int,
        stats: StepSums,
    ) -> None:
        """KL as a reward penalty: ``r_t - β kl_t`` for token-level advantages, ``r - β Σ_t kl_t`` otherwise."""
        algo = self.algorithm
        kl = self._assemble(
            batches,
            lambda b: kl_penalty(b.old_logprobs, b.extras["ref_logprobs"], algo.kl_estimator),
            len(exps),
            width,
        )
        mask = self._assemble(batches, lambda b: b.action_mask, len(exps), width)
        rewards = sample_inputs(exps, ("rewards",))["rewards"]
        if "token_rewards" in self.advantage_inputs:
            tokens = step.get("token_rewards")
            tokens = outcome_token_rewards(rewards, mask).float() if tokens is None else tokens
            step["token_rewards"], kl_stats = kl_in_reward(tokens, kl, self.kl_coef, mask)
        else:
            step["shaped_rewards"], kl_stats = kl_in_reward(rewards, kl, self.kl_coef, mask)
        stats.add_once(kl_stats)
        self._observed_kl = kl_stats["kl_in_reward"]

    @torch.no_grad()
    def _attach_logprobs(self, batch: MicroBatch) -> None:
        algo = self.algorithm
        if self.advantage_fn is not None and (self.recompute_logprobs or batch.old_logprobs is None):
            if batch.old_logprobs is not None:  # the engine's: kept for the rollout correction
                batch.extras["rollout_logprobs"] = batch.old_logprobs
            self.model.eval()
            batch.old_logprobs, _ = self._logprobs(self.model, batch)
        if algo.needs_ref:
            if self.ref_model is None:
                raise ValueError(
                    "the algorithm needs reference logprobs (kl_coef > 0 or a reference-based loss) "
                    "but no reference model was given to the Trainer."
                )
            batch.extras["ref_logprobs"], _ = self._logprobs(self.ref_model, batch)

    def _normalizers(self, batches: list[MicroBatch]) -> dict[str, float]:
        algo = self.algorithm
        masks = [b.action_mask for b in batches]
        if "expert_normalizer" in self.loss_inputs:
            flags = [b.extras["is_expert"] for b in batches]
            n, n_exp = split_normalizer(
                masks, flags, algo.loss_agg, max_response_length=self.max_response_length
            )
            return {"normalizer": n, "expert_normalizer": n_exp}
        return {
            "normalizer": step_normalizer(masks, algo.loss_agg, max_response_length=self.max_response_length)
        }

    # ------------------------------------------------------------------ updates
    def _policy_update(self, batches: list[MicroBatch], norms: dict[str, float], stats: StepSums) -> None:
        self.model.train()
        total = 0.0
        for batch in batches:
            loss, micro = self._micro_step(batch, norms)
            total += float(loss)
            stats.add_tokens(micro, batch)
        stats.add_step({"loss": total, "grad_norm": self._optimizer_step()})

    def _micro_step(self, batch: MicroBatch, norms: dict[str, float]) -> tuple[Tensor, dict[str, float]]:
        algo = self.algorithm
        bonus = algo.entropy_coef > 0
        want_entropy = self.entropy_metric or bonus
        logprobs, entropy = self._logprobs(
            self.model, batch, entropy_fn=entropy_from_logits if want_entropy else None, entropy_grad=bonus
        )
        old = batch.old_logprobs if batch.old_logprobs is not None else logprobs.detach()
        mask = batch.action_mask
        extras = {k: v for k, v in batch.extras.items() if k not in ("old_values", "returns")}
        loss, stats = self.loss_fn(
            logprobs=logprobs,
            old_logprobs=old,
            action_mask=mask,
            agg_mode=algo.loss_agg,
            **norms,
            **{"advantages": None, **extras},
            **algo.loss_args,
        )
        if self.kl_coef > 0 and algo.kl_mode == "loss":
            kl = kl_penalty(logprobs, batch.extras["ref_logprobs"], algo.kl_estimator)
            loss = loss + self.kl_coef * aggregate(kl, mask, algo.loss_agg, norms["normalizer"])
            stats["kl"] = float((kl.detach() * mask).sum() / mask.sum().clamp(min=1))
        if bonus:
            term, _ = entropy_bonus(entropy, mask, algo.entropy_coef, norms["normalizer"], algo.loss_agg)
            loss = loss + term
        if entropy is not None:
            stats["entropy"] = float((entropy.detach() * mask).sum() / mask.sum().clamp(min=1))
        (loss * self.world if self.world > 1 else loss).backward()  # FSDP2 averages the ranks: sum them
        return loss.detach(), stats

    def _pair_updates(self, exps: list[Experience], stats: StepSums) -> None:
        """Preference pairs: rows sharing a ``group_id``, ``info["chosen"]`` True for the preferred one."""
        algo = self.algorithm
        pairs = _pairs(exps)
        order = list(range(len(pairs)))
        self.model.train()
        for _ in range(self.update_epochs):
            total = 0.0
            chunks = _chunks(
                order, self.micro_batch_tokens, [len(exps[c].tokens) + len(exps[r].tokens) for c, r in pairs]
            )
            mine = my_share(chunks, self.world, self.rank, lambda _: None) if self.world > 1 else chunks
            for chunk in mine:  # None: an idle pass of another chunk (trainer ranks run equal counts)
                part, scale = (chunks[0], 0.0) if chunk is None else (chunk, 1.0)
                rows = [i for p in part for i in pairs[p]]
                shared = shared_pays(
                    [exps[i].tokens[: exps[i].prompt_length] for i in rows],
                    [exps[i].response_length for i in rows],
                    self.shared_prompt,
                )
                batch = collate(exps, rows, self.pad_token_id, self.device, shared_prompt=shared)
                with torch.no_grad():
                    ref, _ = self._logprobs(self.ref_model, batch)
                logprobs, _ = self._logprobs(self.model, batch)
                seq, ref_seq = (
                    sequence_logps(logprobs, batch.action_mask),
                    sequence_logps(ref, batch.action_mask),
                )
                loss, micro = self.loss_fn(
                    seq[0::2],
                    seq[1::2],
                    ref_seq[0::2],
                    ref_seq[1::2],
                    normalizer=float(len(pairs)),
                    **algo.loss_args,
                )
                (loss * scale * self.world).backward()  # FSDP2 averages the ranks' gradients: sum them
                total += scale * float(loss.detach())
                stats.add_tokens(micro, batch if scale else idle_batch(batch))
            stats.add_step({"loss": total, "grad_norm": self._optimizer_step()})

    def _adapt_kl(self, stats: StepSums, samples: int) -> None:
        """Adaptive KL (``kl_target``): move the coefficient towards the target KL per token."""
        algo = self.algorithm
        if algo.kl_target is None or self.kl_coef <= 0:
            return
        observed = (
            stats.weighted.get("kl", 0.0) / max(stats.weight, 1.0)
            if algo.kl_mode == "loss"
            else self._observed_kl
        )
        self.kl_coef = adaptive_kl_coef(self.kl_coef, observed, algo.kl_target, algo.kl_horizon, samples)
        stats.add_once({"kl_coef": self.kl_coef})

    def _optimizer_step(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip if self.grad_clip > 0 else float("inf"))
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: a replicated DTensor
        if torch.isfinite(norm):
            self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        state = {
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": self.rng.get_state(),
            "version": self.version,
            "kl_coef": self.kl_coef,
        }
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.rng.set_state(state["rng"])
        self.version = state["version"]
        self.kl_coef = state.get("kl_coef", self.kl_coef)
        if self.critic is not None and "critic" in state:
            self.critic.load_state_dict(state["critic"])


def _pairs(exps: list[Experience]) -> list[tuple[int, int]]:
    """(chosen, rejected) row indices, one pair per group_id."""
    groups: dict[str, dict[bool, int]] = {}
    for i, e in enumerate(exps):
        groups.setdefault(e.group_id, {})[bool(e.info.get("chosen"))] = i
    bad = [g for g, rows in groups.items() if set(rows) != {True, False}]
    if bad:
        raise ValueError(
            f"preference group {bad[0]!r} does not hold exactly one chosen and one rejected row; "
            "pairs share a group_id and carry info['chosen'] True / False."
        )
    return [(rows[True], rows[False]) for rows in groups.values()]


def _chunks(order: list[int], budget: int, sizes: list[int]) -> list[list[int]]:
    """Consecutive chunks of ``order`` whose padded size (count × longest) fits ``budget``."""
    out: list[list[int]] = []
    current: list[int] = []
    for i in order:
        if current and (len(current) + 1) * max(sizes[j] for j in current + [i]) > budget:
            out.append(current)
            current = []
        current.append(i)
    return out + ([current] if current else [])
