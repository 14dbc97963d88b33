"""Real episodes for ``trine check``: the configured workflow, environment, tools and reward, played with the
configured model through the explorer a run uses.

:func:`play_episodes` builds the train taskset and an explorer as :mod:`trine.build` builds them for a run
(the algorithm's rollout arguments included), runs the first ``n`` tasks once each (``repeat`` 1) under a
fixed seed, and turns each into an :class:`Episode`: its experiences cut into trained / masked spans
(:mod:`trine.inspect.mask_view`), the trainer's recomputed logprobs against the engine's for each run of
trained tokens (a turn), and the reward with its parts. :func:`episode_rows` judges them: a task the
explorer skipped, an experience whose mask, logprobs and tokens disagree in length, masked tokens that carry
behaviour logprobs, or a turn whose logprobs differ by more than the tolerance is a FAIL.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from trine.config import RunConfig
from trine.inspect.mask_view import Span, experience_spans, runs
from trine.inspect.probes import CheckRow


@dataclass
class Turn:
    """One run of trained tokens of an experience (a model turn)."""

    start: int
    end: int
    """Token indices in ``Experience.tokens``."""
    max_abs: float
    """Largest ``|engine logprob - trainer logprob|`` over its tokens."""


@dataclass
class Step:
    """One experience of an episode (a whole multi-turn trajectory, or one step of a step-wise one)."""

    spans: list[Span]
    turns: list[Turn]
    reward: float | None
    parts: dict[str, float]
    status: str
    response_tokens: int
    problems: list[str] = field(default_factory=list)


@dataclass
class Episode:
    """One task played once."""

    task_id: str
    workflow: str
    steps: list[Step] = field(default_factory=list)
    skipped: str = ""
    """Why the explorer skipped the task (its workflow raised, timed out, returned nothing valid)."""
    episode_return: float | None = None
    """The reward of the episode (a step-wise one: its return)."""

    @property
    def problems(self) -> list[str]:
        return [p for s in self.steps for p in s.problems]


def play_episodes(cfg: RunConfig, model: Any, tokenizer: Any, n: int, seed: int) -> list[Episode]:
    """Play the first ``n`` train tasks once each (see the module docstring); the engine, the workflows
    (MCP servers, environments) and the explorer are closed afterwards."""
    from trine.build import build_algorithm, build_eval_explorer, build_taskset
    from trine.explorer.runner import rollout_returns

    algorithm = build_algorithm(cfg)
    ts = cfg.tasks.train
    taskset = build_taskset(ts.model_copy(update={"limit": n}), extra_workflow_args=algorithm.rollout_args)
    tasks = [dataclasses.replace(taskset[i], repeat=1) for i in range(min(n, len(taskset)))]
    # every failure is reported here, never raised as a skip ratio
    quiet = cfg.model_copy(update={"explorer": cfg.explorer.model_copy(update={"max_skip_ratio": 1.0})})
    explorer = build_eval_explorer(quiet, model, tokenizer)

    async def play() -> list[tuple[Any, Any, Any]]:
        return list(await asyncio.gather(*(explorer.run_one(t) for t in tasks)))

    try:
        with explorer.model.seeded(seed):
            done = explorer.loop.run_until_complete(play())
        explorer.assemble(done, 0, [0] * len(done), 0.0)  # ids, versions, truncation info
    finally:
        explorer.close()
        explorer.model.close()
    episodes = []
    for task, (exps, _, reason), stats in done:
        episode = Episode(task.task_id, task.workflow, skipped=f"{reason}: {stats.detail}" if reason else "")
        returns = [r for r in rollout_returns(exps) if r is not None]
        episode.episode_return = returns[0] if returns else None
        episode.steps = [_step(model, tokenizer, e) for e in exps]
        episodes.append(episode)
    return episodes


def _step(model: Any, tokenizer: Any, exp: Any) -> Step:
    """One experience measured: spans, per-turn logprob agreement, reward, problems of shape."""
    response = len(exp.tokens) - exp.prompt_length
    problems = []
    if not len(exp.action_mask) == response == len(exp.logprobs):
        problems.append(
            f"action_mask ({len(exp.action_mask)}), logprobs ({len(exp.logprobs)}) and the response "
            f"({response} tokens) differ in length"
        )
    elif any(lp != 0.0 for lp, m in zip(exp.logprobs, exp.action_mask) if not m):
        problems.append("masked tokens carry behaviour logprobs")
    turns = [] if problems else _turns(model, tokenizer, exp)
    return Step(
        spans=experience_spans(tokenizer, exp),
        turns=turns,
        reward=exp.reward,
        parts=dict(exp.info.get("reward_parts") or {}),
        status=exp.status,
        response_tokens=response,
        problems=problems,
    )


def _turns(model: Any, tokenizer: Any, exp: Any) -> list[Turn]:
    """The trainer's logprobs of ``exp`` (``forward_logprobs``, replaying its temperature and truncation)
    against its behaviour logprobs, per run of trained tokens."""
    import torch

    from trine.models.batching import collate, forward_logprobs

    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    with torch.no_grad():
        trainer, _ = forward_logprobs(model, collate([exp], [0], pad, device))
    diff = (torch.tensor(exp.logprobs, dtype=torch.float32) - trainer[0].float().cpu()).abs()
    start = exp.prompt_length
    return [
        Turn(start + a, start + b, float(diff[a:b].max())) for a, b, v in runs(list(exp.action_mask)) if v
    ]


def episode_rows(episodes: list[Episode], tolerance: float) -> list[CheckRow]:
    """One row per episode: what it was (task, workflow, turns, trained tokens), its reward and parts, its
    per-turn logprob agreement, and what is wrong with it (FAIL) if anything."""
    rows = []
    for k, ep in enumerate(episodes, 1):
        name = f"episode {k} ({ep.workflow}, task {ep.task_id})"
        if ep.skipped:
            rows.append(CheckRow(name, "FAIL", "skipped", f"the explorer skipped it: {ep.skipped}"))
            continue
        per_turn = [t.max_abs for s in ep.steps for t in s.turns]
        problems = list(ep.problems)
        if per_turn and max(per_turn) > tolerance:
            problems.append(
                f"engine vs trainer logprobs differ by up to {max(per_turn):.1e} (> {tolerance:g}): the trainer "
                "would start off-policy; see the logprob rows above (or pass --tolerance)"
            )
        trained = sum(s.end - s.start for st in ep.steps for s in st.spans if s.trained)
        response = sum(st.response_tokens for st in ep.steps)
        parts = {key: v for st in ep.steps for key, v in st.parts.items()}
        reward = "-" if ep.episode_return is None else f"{ep.episode_return:g}"
        value = f"reward {reward}" + (f" ({_parts(parts)})" if parts else "")
        agreement = ", ".join(f"{d:.1e}" for d in per_turn) or "no trained token"
        detail = "; ".join(problems) or (
            f"{len(ep.steps)} experience(s), {len(per_turn)} turn(s), {trained} of {response} response tokens "
            f"trained; max |engine - trainer| logprob per turn: {agreement}"
        )
        data = {
            "task_id": ep.task_id,
            "workflow": ep.workflow,
            "return": ep.episode_return,
            "per_turn_max_abs": per_turn,
            "problems": problems,
        }  # the spans: the report's ``episodes``
        rows.append(CheckRow(name, "FAIL" if problems else "OK", value, detail, data=data))
    return rows


def _parts(parts: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in parts.items())
