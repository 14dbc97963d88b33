"""The explorer: runs batches of tasks through workflows, concurrently, and reports what happened.

Each task runs as its own asyncio task with a timeout and a number of retries; a workflow that
raises, hangs or returns nothing costs its own task only and is counted
(``explorer/skipped``, ``explorer/retries``, ``explorer/skipped_<reason>``). Rollout-model calls
from all tasks are batched by the engine. Rewards run in worker threads with their own timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

from trine import registry
from trine.types import Experience, Task, new_id

log = logging.getLogger("trine.explorer")


class Explorer:
    """Turns tasks into experiences with a rollout model (owns one event loop)."""

    def __init__(
        self,
        model: Any,
        *,
        timeout: float = 600.0,
        max_retries: int = 1,
        max_concurrency: int = 256,
        reward_timeout: float = 30.0,
        rollouts_path: str | Path | None = None,
        teacher: Any = None,
    ) -> None:
        self.model = model
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        self.reward_timeout = reward_timeout
        self.rollouts_path = Path(rollouts_path) if rollouts_path else None
        self.teacher = teacher
        self.loop = asyncio.new_event_loop()
        self._workflows: dict[tuple, Any] = {}

    # ------------------------------------------------------------------ public
    def explore(
        self, tasks: list[Task], *, batch_index: int, version: int
    ) -> tuple[list[Experience], dict[str, float]]:
        """Run one batch of tasks; returns its experiences and ``explorer/*`` metrics."""
        return self.explore_batches([tasks], first_index=batch_index, version=version)[0]

    def explore_batches(
        self, batches: list[list[Task]], *, first_index: int, version: int
    ) -> list[tuple[list[Experience], dict[str, float]]]:
        """Run several batches that use the same weights *concurrently* (one long tail instead of
        one per batch); returns (experiences, metrics) per batch. The wall time is shared equally
        among the batches in ``time/explore_seconds``."""
        start = time.perf_counter()
        flat = [task for tasks in batches for task in tasks]
        outcomes = self.loop.run_until_complete(self._run_all(flat))
        seconds = (time.perf_counter() - start) / max(1, len(batches))
        results, offset = [], 0
        for j, tasks in enumerate(batches):
            index, mine = first_index + j, outcomes[offset : offset + len(tasks)]
            offset += len(tasks)
            experiences: list[Experience] = []
            for task, (exps, _, _) in zip(tasks, mine):
                for e in exps:
                    e.task_id = e.task_id or task.task_id
                    e.group_id = e.group_id or f"{task.task_id}@{index}"
                    e.run_id = e.run_id or new_id("run-")
                    e.policy_version = version
                    e.info.setdefault("batch", index)
                experiences.extend(exps)
            if self.rollouts_path is not None:
                self._dump(tasks, mine, index, version)
            if self.teacher is not None:
                self._score_with_teacher(experiences)
            results.append((experiences, self._metrics(experiences, mine, seconds)))
        return results

    def _score_with_teacher(self, experiences: list[Experience]) -> None:
        """Store the teacher's logprobs of every sampled response in ``info["teacher_logprobs"]``."""
        from trine.models.batching import response_logprobs

        pairs = [(e.tokens[: e.prompt_length], e.response_tokens) for e in experiences]
        scores = self.model.call(response_logprobs, self.teacher, pairs, pad_id=self.model.pad_id)
        for e, logprobs in zip(experiences, scores):
            e.info["teacher_logprobs"] = logprobs

    def evaluate(
        self, tasks: list[Task], *, name: str, k: int, greedy: bool, seed: int, success_threshold: float = 1.0
    ) -> dict[str, float]:
        """Greedy accuracy and avg@k / pass@k at the tasks' temperature, as ``eval/<name>/*``.

        Sampling uses a generator seeded with ``seed`` so evaluation never disturbs the
        training RNG stream (and is reproducible).
        """
        saved = self.model.generator.get_state()
        self.model.generator.manual_seed(seed)
        out: dict[str, float] = {}
        try:
            if greedy:
                g = [_eval_task(t, 1, 0.0) for t in tasks]
                correct = self._success(g, success_threshold)
                out[f"eval/{name}/accuracy"] = statistics.fmean(c[0] for c in correct)
            if k > 0:
                s = [_eval_task(t, k, None) for t in tasks]
                correct = self._success(s, success_threshold)
                out[f"eval/{name}/avg@{k}"] = statistics.fmean(x for c in correct for x in c)
                out[f"eval/{name}/pass@{k}"] = statistics.fmean(float(any(c)) for c in correct)
        finally:
            self.model.generator.set_state(saved)
        return out

    def close(self) -> None:
        self.loop.close()

    # ------------------------------------------------------------------ internals
    def _success(self, tasks: list[Task], threshold: float) -> list[list[float]]:
        """Per task, 1/0 per rollout: its reward (a multi-step rollout: its episode return) >= threshold."""
        outcomes = self.loop.run_until_complete(self._run_all(tasks))
        return [
            [float(r is not None and r >= threshold) for r in rollout_returns(exps)] or [0.0]
            for exps, _, _ in outcomes
        ]

    async def _run_all(self, tasks: list[Task]) -> list[tuple[list[Experience], int, str | None]]:
        semaphore = asyncio.Semaphore(self.max_concurrency)

        async def bounded(task: Task):
            async with semaphore:
                return await self._run_task(task)

        return await asyncio.gather(*(bounded(t) for t in tasks))

    async def _run_task(self, task: Task) -> tuple[list[Experience], int, str | None]:
        """Returns (experiences, retries used, skip reason or None)."""
        workflow = self._workflow(task)
        reason = None
        for attempt in range(self.max_retries + 1):
            try:
                exps = await asyncio.wait_for(workflow.run(task, self.model), self.timeout)
                if not exps:
                    reason = "empty"
                    continue
                for e in exps:
                    e.check()
                return list(exps), attempt, None
            except asyncio.TimeoutError:
                reason = "timeout"
                log.warning(
                    "task %s timed out after %ss (attempt %d)", task.task_id, self.timeout, attempt + 1
                )
            except Exception as err:  # a workflow's failure costs its own task only
                reason = "error"
                log.warning(
                    "task %s failed (attempt %d): %s: %s", task.task_id, attempt + 1, type(err).__name__, err
                )
        return [], self.max_retries, reason

    def _workflow(self, task: Task) -> Any:
        key = (
            task.workflow,
            task.reward,
            json.dumps(task.workflow_args, sort_keys=True, default=str),
            json.dumps(task.reward_args, sort_keys=True, default=str),
        )
        if key not in self._workflows:
            cls = registry.resolve("workflow", task.workflow)
            self._workflows[key] = cls(
                reward=self._score_fn(task.reward, task.reward_args), **task.workflow_args
            )
        return self._workflows[key]

    def _score_fn(self, name: str, args: dict[str, Any]):
        from trine.rewards import evaluate_reward

        fn = registry.resolve("reward", name)
        timeout = self.reward_timeout

        async def score(response: str, task: Task) -> tuple[float, dict[str, float]]:
            return await asyncio.wait_for(
                asyncio.to_thread(evaluate_reward, fn, response, task, args), timeout
            )

        return score

    def _metrics(self, exps: list[Experience], outcomes: list, seconds: float) -> dict[str, float]:
        rewards = [float(e.reward) for e in exps if e.reward is not None]
        lengths = [e.response_length for e in exps]
        reasons = [r for _, _, r in outcomes if r]
        episodes = [e for e in exps if e.info.get("last_step")]
        m = {
            "explorer/tasks": float(len(outcomes)),
            "explorer/experiences": float(len(exps)),
            "explorer/skipped": float(len(reasons)),
            "explorer/retries": float(sum(n for _, n, _ in outcomes)),
            "explorer/reward_mean": statistics.fmean(rewards) if rewards else float("nan"),
            "explorer/reward_std": statistics.pstdev(rewards) if len(rewards) > 1 else 0.0,
            "explorer/response_length_mean": statistics.fmean(lengths) if lengths else 0.0,
            "explorer/response_length_max": float(max(lengths, default=0)),
            "explorer/truncated_fraction": statistics.fmean(
                float(e.info.get("finish_reason") == "length") for e in exps
            )
            if exps
            else 0.0,
            "time/explore_seconds": seconds,
        }
        if episodes:
            m["explorer/episode_return_mean"] = statistics.fmean(rollout_returns(episodes))
            m["explorer/episode_length_mean"] = statistics.fmean(e.step + 1 for e in episodes)
        for reason in set(reasons):
            m[f"explorer/skipped_{reason}"] = float(reasons.count(reason))
        parts: dict[str, list[float]] = {}
        for e in exps:
            for k, v in (e.info.get("reward_parts") or {}).items():
                parts.setdefault(k, []).append(float(v))
        if len(parts) > 1:
            m.update({f"explorer/reward/{k}": statistics.fmean(v) for k, v in parts.items()})
        return m

    def _dump(self, tasks: list[Task], outcomes: list, batch_index: int, version: int) -> None:
        self.rollouts_path.parent.mkdir(parents=True, exist_ok=True)
        with self.rollouts_path.open("a", encoding="utf-8") as f:
            for task, (exps, _, reason) in zip(tasks, outcomes):
                row = {
                    "batch": batch_index,
                    "version": version,
                    "task_id": task.task_id,
                    "question": task.question,
                    "answer": task.answer,
                    "skipped": reason,
                    "responses": [
                        {
                            "text": e.info.get("response"),
                            "reward": e.reward,
                            "parts": e.info.get("reward_parts"),
                        }
                        for e in exps
                    ],
                }
                f.write(json.dumps(row, default=str) + "\n")


def rollout_returns(exps: list[Experience]) -> list[float | None]:
    """One value per rollout: the reward of a single-turn experience, or the ``episode_return`` of the
    last step of a multi-step rollout (``info["last_step"]``)."""
    if any("last_step" in e.info for e in exps):
        return [e.info.get("episode_return", e.reward) for e in exps if e.info.get("last_step")]
    return [e.reward for e in exps]


def _eval_task(task: Task, k: int, temperature: float | None) -> Task:
    """A copy of ``task`` sampling ``k`` responses (greedy when temperature is 0)."""
    from dataclasses import replace

    sampling = task.sampling if temperature is None else task.sampling.replace(temperature=temperature)
    return replace(task, repeat=k, sampling=sampling)
