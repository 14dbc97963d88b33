"""The explorer: runs batches of tasks through workflows, concurrently, and reports what happened.

Each task runs as its own asyncio task with a timeout and a number of retries; a workflow that
raises, hangs, returns nothing or returns invalid experiences costs its own task only and is
counted (``explorer/skipped``, ``explorer/retries``, ``explorer/skipped_<reason>`` with reason
``error``, ``timeout``, ``reward_timeout``, ``empty`` or ``invalid``), and logged with the task id
and the cause. Rollout-model calls from all tasks are batched by the engine.

Rewards, and every blocking call a workflow makes through :func:`trine.blocking.run_blocking`, run
in the explorer's :class:`~trine.blocking.BlockingPool` (daemon threads; a stuck call's thread is
abandoned and replaced, ``explorer/stuck_threads``). A reward call past ``reward_timeout`` raises
:class:`RewardTimeout` (``explorer/reward_timeouts``).

When more than ``max_skip_ratio`` of the answers of the last training batches failed — those of
skipped tasks, and answers with a failure status such as ``reward_error`` — the explorer raises
:class:`~trine.explorer.failures.SkipRatioError` naming the reasons (:mod:`trine.explorer.failures`);
a batch above ``warn_skip_ratio`` is logged. Evaluation is not counted.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import logging
import math
import statistics
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trine import registry
from trine.blocking import BlockingPool, CallTimeout, use_pool
from trine.explorer.failures import FailureWindow
from trine.explorer.outcomes import Outcome, outcome_metrics, outcomes
from trine.models.auxiliary import AuxiliaryModels
from trine.models.protocol import RolloutModel
from trine.types import Experience, Task, new_id

log = logging.getLogger("trine.explorer")


class RewardTimeout(Exception):
    """A reward call did not return within ``reward_timeout`` (not a ``TimeoutError``, so it is never
    taken for the workflow's own timeout)."""


class InvalidResult(Exception):
    """A workflow returned something other than a non-empty list of valid experiences."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass
class _TaskStats:
    """What happened to one task, beyond its outcome (filled in while it runs)."""

    reward_timeouts: int = 0
    detail: str = ""
    """What went wrong in its last failed attempt."""


_STATS: contextvars.ContextVar[_TaskStats | None] = contextvars.ContextVar("trine_task_stats", default=None)


class Explorer:
    """Turns tasks into experiences with a rollout model (owns one event loop)."""

    def __init__(
        self,
        model: RolloutModel,
        *,
        timeout: float = 600.0,
        max_retries: int = 1,
        max_concurrency: int = 256,
        reward_timeout: float = 30.0,
        rollouts_path: str | Path | None = None,
        blocking_threads: int = 32,
        max_skip_ratio: float = 0.5,
        warn_skip_ratio: float = 0.1,
        auxiliary_models: Mapping[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        self.reward_timeout = reward_timeout
        self.rollouts_path = Path(rollouts_path) if rollouts_path else None
        self.loop = asyncio.new_event_loop()
        self._workflows: dict[tuple, Any] = {}
        self.auxiliary = AuxiliaryModels(auxiliary_models or {}, self.loop)
        """Models workflows (``auxiliary_models=``) and rewards (``models=``) call by name."""
        self.pool = BlockingPool(blocking_threads, name="trine-blocking")
        self.failures = FailureWindow(max_skip_ratio, warn_skip_ratio)
        """The failed answers of the last training batches (``max_skip_ratio``, ``warn_skip_ratio``)."""
        self.running: dict[int, tuple[str, float]] = {}
        """The workflow runs in progress: ``id`` -> (task id, ``time.monotonic()`` at its start), read by
        :meth:`waiting_on` (from another thread: what a stuck run waits for)."""

    # ------------------------------------------------------------------ public: blocking wrappers
    def explore(
        self, tasks: list[Task], *, batch_index: int, version: int
    ) -> tuple[list[Experience], dict[str, float]]:
        """Run one batch of tasks; returns its experiences and ``explorer/*`` metrics (blocking:
        :meth:`explore_async` on the explorer's own event loop)."""
        return self.loop.run_until_complete(
            self.explore_async(tasks, batch_index=batch_index, version=version)
        )

    def explore_batches(
        self, batches: list[list[Task]], *, first_index: int, version: int
    ) -> list[tuple[list[Experience], dict[str, float]]]:
        """Blocking :meth:`explore_batches_async` on the explorer's own event loop."""
        return self.loop.run_until_complete(
            self.explore_batches_async(batches, first_index=first_index, version=version)
        )

    def evaluate(
        self,
        tasks: list[Task],
        *,
        name: str,
        k: int,
        greedy: bool,
        seed: int,
        success_threshold: float = 1.0,
        samples: list[dict[str, Any]] | None = None,
    ) -> dict[str, float]:
        """Blocking :meth:`evaluate_async` on the explorer's own event loop."""
        run = self.evaluate_async(
            tasks,
            name=name,
            k=k,
            greedy=greedy,
            seed=seed,
            success_threshold=success_threshold,
            samples=samples,
        )
        return self.loop.run_until_complete(run)

    # ------------------------------------------------------------------ public: the async core
    async def explore_async(
        self, tasks: list[Task], *, batch_index: int, version: int
    ) -> tuple[list[Experience], dict[str, float]]:
        """Run one batch of tasks in the running event loop (a server loop, an actor, or the
        explorer's own loop); returns its experiences and ``explorer/*`` metrics."""
        return (await self.explore_batches_async([tasks], first_index=batch_index, version=version))[0]

    async def explore_batches_async(
        self, batches: list[list[Task]], *, first_index: int, version: int
    ) -> list[tuple[list[Experience], dict[str, float]]]:
        """Run several batches that use the same weights *concurrently* (one long tail instead of
        one per batch); returns (experiences, metrics) per batch. The wall time is shared equally
        among the batches in ``time/explore_seconds``."""
        start = time.perf_counter()
        flat = [task for tasks in batches for task in tasks]
        stats = [_TaskStats() for _ in flat]
        outcomes = await self._run_all(flat, stats)
        seconds = (time.perf_counter() - start) / max(1, len(batches))
        results, offset = [], 0
        for j, tasks in enumerate(batches):
            n = len(tasks)
            done = list(zip(tasks, outcomes[offset : offset + n], stats[offset : offset + n]))
            results.append(self.assemble(done, first_index + j, [version] * n, seconds))
            offset += n
        return results

    def assemble(
        self, done: list[tuple[Task, Any, Any]], index: int, versions: list[int], seconds: float
    ) -> tuple[list[Experience], dict[str, float]]:
        """Batch ``index`` from finished tasks ``(task, outcome, stats)`` (from :meth:`run_one` or a
        batch run), each sampled with weights ``versions[i]``: its experiences (ids, groups and versions
        filled in), ``explorer/*`` metrics, the rollouts dump and the failure rule (:attr:`failures`)."""
        tasks = [t for t, _, _ in done]
        mine = [o for _, o, _ in done]
        experiences: list[Experience] = []
        for task, (exps, _, _), version in zip(tasks, mine, versions):
            for e in exps:
                e.task_id = e.task_id or task.task_id
                e.group_id = e.group_id or f"{task.task_id}@{index}"
                e.run_id = e.run_id or new_id("run-")
                e.policy_version = version
                e.info.setdefault("batch", index)
                e.info.setdefault("taskset", task.taskset)
                if _truncates(task.sampling):  # the trainer replays it (trine.models.sampling)
                    e.info.setdefault("top_k", task.sampling.top_k)
                    e.info.setdefault("top_p", task.sampling.top_p)
                if "token_versions" in e.info:  # a partial rollout: its tokens span versions
                    e.info["version_spread"] = max(e.info["token_versions"]) - version
            experiences.extend(exps)
        if self.rollouts_path is not None:
            self._dump(tasks, mine, index, min(versions, default=0))
        metrics = self._metrics(experiences, mine, seconds)
        metrics["explorer/reward_timeouts"] = float(sum(s.reward_timeouts for _, _, s in done))
        metrics["explorer/stuck_threads"] = float(self.pool.stuck)
        self.failures.add(tasks, mine, [s.detail for _, _, s in done], index)
        return experiences, metrics

    async def run_one(self, task: Task) -> tuple[Task, Any, Any]:
        """Run one task (timeout, retries, skip) in the running event loop: ``(task, outcome, stats)``
        for :meth:`assemble`; for callers that form batches as tasks finish (a streaming explorer)."""
        stats = _TaskStats()
        return task, await self._run_task(task, stats), stats

    async def evaluate_async(
        self,
        tasks: list[Task],
        *,
        name: str,
        k: int,
        greedy: bool,
        seed: int,
        success_threshold: float = 1.0,
        samples: list[dict[str, Any]] | None = None,
    ) -> dict[str, float]:
        """Greedy accuracy and avg@k / pass@k at the tasks' temperature, as ``eval/<name>/*``, and what the
        rollouts came to (:func:`~trine.explorer.outcomes.outcome_metrics`: ``return_mean``,
        ``invalid_actions``, ``turns_mean``) over the sampled rollouts (the greedy ones when ``k`` is 0).

        Sampling runs inside ``model.seeded(seed)``, so evaluation never disturbs the training
        sampling stream (and is reproducible). When ``samples`` is a list, one row per task
        (``prompt``, ``response``, ``reward``, ``answer``, ``mode``: its greedy rollout, or its first
        sampled one when ``greedy`` is off) is appended to it, e.g. for a table of eval samples.
        """
        out: dict[str, float] = {}
        drawn: list[list[Outcome]] = []
        with self.model.seeded(seed):
            if greedy:
                drawn = await self._draw([_eval_task(t, 1, 0.0) for t in tasks], samples, "greedy")
                correct = _successes(drawn, success_threshold)
                out[f"eval/{name}/accuracy"] = statistics.fmean(c[0] for c in correct)
            if k > 0:
                s = [_eval_task(t, k, None) for t in tasks]
                drawn = await self._draw(s, None if greedy else samples, "sampled")
                correct = _successes(drawn, success_threshold)
                out[f"eval/{name}/avg@{k}"] = statistics.fmean(x for c in correct for x in c)
                out[f"eval/{name}/pass@{k}"] = statistics.fmean(float(any(c)) for c in correct)
        flat = [o for task_outcomes in drawn for o in task_outcomes]
        out.update(outcome_metrics(flat, success_threshold, f"eval/{name}/", success=False))
        return out

    def close_workflows(self, timeout: float = 30.0) -> None:
        """Release what the workflows hold (MCP servers, environment pools): each one's ``aclose()``,
        awaited on the explorer's event loop (at most ``timeout`` seconds), or ``close()``."""
        workflows, self._workflows = list(self._workflows.values()), {}
        for workflow in workflows:
            try:
                if hasattr(workflow, "aclose"):
                    self.loop.run_until_complete(asyncio.wait_for(workflow.aclose(), timeout))
                elif hasattr(workflow, "close"):
                    workflow.close()
            except Exception as err:  # noqa: BLE001 - closing must not fail the run that ended
                log.warning(
                    "closing workflow %s failed: %s: %s", type(workflow).__name__, type(err).__name__, err
                )

    def close(self, timeout: float = 5.0) -> None:
        """Close the workflows and the event loop, and let the idle blocking workers exit (auxiliary
        models belong to the stage: several explorers share them). What still runs on the loop (a run
        stopped mid-batch: workflows, the engine's batching task) is cancelled first and given ``timeout``
        seconds to end, as ``asyncio.run`` does; closed with them pending, the loop left them to be
        destroyed, each with a "Task was destroyed but it is pending!" error at exit."""
        if not self.loop.is_closed():
            self.close_workflows()
            pending = [task for task in asyncio.all_tasks(self.loop) if not task.done()]
            for task in pending:
                task.cancel()
            if pending:
                self.loop.run_until_complete(asyncio.wait(pending, timeout=timeout))
        self.loop.close()
        self.pool.close()

    def waiting_on(self) -> str | None:
        """``4 tasks running, the oldest (t/12) for 650s; 2 past explorer.timeout=600s`` (None: none runs)."""
        now, running = time.monotonic(), list(self.running.values())  # a copy: the event loop changes it
        if not running:
            return None
        task_id, started = min(running, key=lambda r: r[1])
        late = sum(1 for _, t0 in running if now - t0 > self.timeout)
        count = "1 task" if len(running) == 1 else f"{len(running)} tasks"
        text = f"{count} running, the oldest ({task_id}) for {now - started:.0f}s"
        return text + (f"; {late} past explorer.timeout={self.timeout:g}s" if late else "")

    # ------------------------------------------------------------------ internals
    async def _draw(
        self, tasks: list[Task], samples: list | None = None, mode: str = ""
    ) -> list[list[Outcome]]:
        """Per task, the outcome of each of its rollouts ([] when it was skipped). With ``samples``, each
        task's first rollout is appended to it as a row."""
        results = await self._run_all(tasks)
        if samples is not None:
            for task, outcome in zip(tasks, results):
                exps, returns = outcome[0], rollout_returns(outcome[0])
                question = task.question
                if not isinstance(question, str):  # chat messages
                    question = "\n".join(f"{m.get('role')}: {m.get('content')}" for m in question)
                samples.append(
                    {
                        "prompt": question,
                        "response": exps[0].info.get("response", "") if exps else "",
                        "reward": returns[0] if returns else None,
                        "answer": str(task.answer),
                        "mode": mode,
                    }
                )
        return [outcomes(result[0]) for result in results]

    async def _run_all(
        self, tasks: list[Task], stats: list[_TaskStats] | None = None
    ) -> list[tuple[list[Experience], int, str | None]]:
        semaphore = asyncio.Semaphore(self.max_concurrency)
        stats = stats if stats is not None else [_TaskStats() for _ in tasks]

        async def bounded(task: Task, s: _TaskStats):
            async with semaphore:
                return await self._run_task(task, s)

        return await asyncio.gather(*(bounded(t, s) for t, s in zip(tasks, stats)))

    async def _run_task(
        self, task: Task, stats: _TaskStats | None = None
    ) -> tuple[list[Experience], int, str | None]:
        """Returns (experiences, retries used, skip reason or None); ``stats`` gets the details."""
        stats = stats if stats is not None else _TaskStats()
        use_pool(self.pool)  # this asyncio task's context, copied into the tasks it starts
        _STATS.set(stats)
        reason = None
        for attempt in range(self.max_retries + 1):
            self.running[id(stats)] = (task.task_id, time.monotonic())
            try:
                workflow = self._workflow(task)
                result = await asyncio.wait_for(workflow.run(task, self.model), self.timeout)
                return checked_experiences(result), attempt, None
            except asyncio.TimeoutError:
                reason, detail = "timeout", f"the workflow timed out after explorer.timeout={self.timeout}s"
            except RewardTimeout as err:
                reason, detail = "reward_timeout", str(err)
            except InvalidResult as err:
                reason, detail = err.reason, str(err)
            except Exception as err:  # a workflow's failure costs its own task only
                reason, detail = "error", f"{type(err).__name__}: {err}"
            finally:
                self.running.pop(id(stats), None)
            stats.detail = detail
            log.warning(
                "task %s failed (%s, attempt %d of %d): %s",
                task.task_id,
                reason,
                attempt + 1,
                self.max_retries + 1,
                detail,
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
            extra = {"auxiliary_models": self.auxiliary} if _takes(cls, "auxiliary_models") else {}
            self._workflows[key] = cls(
                reward=self._score_fn(task.reward, task.reward_args), **task.workflow_args, **extra
            )
        return self._workflows[key]

    def _score_fn(self, name: str, args: dict[str, Any]):
        from trine.rewards import INLINE_REWARDS, evaluate_reward

        fn = registry.resolve("reward", name)
        timeout, pool = self.reward_timeout, self.pool
        if _takes(fn, "models"):  # e.g. llm_judge: auxiliary models, called from the reward's thread
            args = {**args, "models": self.auxiliary}
        if fn in INLINE_REWARDS:  # linear-time built-ins: no thread hand-off

            async def inline(response: str, task: Task) -> tuple[float, dict[str, float]]:
                return evaluate_reward(fn, response, task, args)

            return inline

        async def score(response: str, task: Task) -> tuple[float, dict[str, float]]:
            try:
                return await pool.call(evaluate_reward, fn, response, task, args, timeout=timeout, label=name)
            except CallTimeout:
                stats = _STATS.get()
                if stats is not None:
                    stats.reward_timeouts += 1
                raise RewardTimeout(
                    f"reward {name!r} did not return within explorer.reward_timeout={timeout}s"
                ) from None

        return score

    def _metrics(self, exps: list[Experience], outcomes: list, seconds: float) -> dict[str, float]:
        rewards = [float(e.reward) for e in exps if e.reward is not None and e.status != "reward_error"]
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
        pending = sum(e.reward is None for e in exps)
        if pending:  # delayed rewards (human feedback, an external judge): not in reward_mean yet
            m["explorer/reward_pending"] = float(pending)
        turns = [e.info["turns"] for e in exps if "turns" in e.info and e.info.get("last_step", True)]
        if turns:  # multi-turn trajectories (one experience each, or the last of their turns)
            m["explorer/turns_mean"] = statistics.fmean(turns)
        returns = [r for r in rollout_returns(episodes) if r is not None]
        if returns:
            m["explorer/episode_return_mean"] = statistics.fmean(returns)
            m["explorer/episode_length_mean"] = statistics.fmean(e.step + 1 for e in episodes)
        for reason in set(reasons):
            m[f"explorer/skipped_{reason}"] = float(reasons.count(reason))
        statuses = Counter(e.status for e in exps if e.status != "ok")  # e.g. reward_error, truncated
        m.update({f"explorer/status_{k}": float(v) for k, v in sorted(statuses.items())})
        counters: Counter = Counter()  # workflow counters, e.g. tools/calls (info["counters"])
        for e in exps:
            counters.update(e.info.get("counters") or {})
        m.update({k: float(v) for k, v in sorted(counters.items())})
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


def checked_experiences(result: Any) -> list[Experience]:
    """A workflow's result as a list of valid experiences (rewards as plain floats).

    Raises :class:`InvalidResult` with reason ``"empty"`` for an empty list and ``"invalid"`` for
    anything else that is wrong — not a list, an item that is not an Experience, inconsistent or
    mistyped fields (:meth:`Experience.check`: token counts, a str/NaN/inf reward, ...), or
    ``info["reward_parts"]`` / ``info["episode_return"]`` that are not finite numbers — naming
    the item and the value.
    """
    if isinstance(result, (list, tuple)) and not result:
        raise InvalidResult("empty", "the workflow returned no experiences")
    if not isinstance(result, (list, tuple)):
        hint = " (does run() end with a return?)" if result is None else ""
        raise InvalidResult(
            "invalid",
            f"the workflow returned {_short(result)} of type {type(result).__name__}{hint}; "
            "expected a list of trine.Experience",
        )
    for i, e in enumerate(result):
        where = f"item {i} of {len(result)} returned by the workflow"
        if not isinstance(e, Experience):
            raise InvalidResult(
                "invalid", f"{where} is {_short(e)} of type {type(e).__name__}; expected a trine.Experience"
            )
        try:
            e.check()
            if e.token_rewards is not None and len(e.token_rewards) != e.response_length:
                raise ValueError(
                    f"token_rewards has {len(e.token_rewards)} entries but the response has "
                    f"{e.response_length} tokens; pass one reward per response token (or None)"
                )
            _check_info(e.info)
        except ValueError as err:
            raise InvalidResult("invalid", f"{where}: {err}") from None
        if e.reward is not None:
            e.reward = float(e.reward)
    return list(result)


def _check_info(info: dict[str, Any]) -> None:
    """The ``info`` entries the explorer's metrics read must be numbers."""
    parts = info.get("reward_parts")
    if parts is not None:
        if not isinstance(parts, Mapping):
            raise ValueError(f"info['reward_parts']={_short(parts)}; expected a dict of part name -> number")
        for key, value in parts.items():
            if not _finite(value):
                raise ValueError(f"info['reward_parts'][{key!r}]={_short(value)}; expected a finite number")
    if info.get("episode_return") is not None and not _finite(info["episode_return"]):
        raise ValueError(f"info['episode_return']={_short(info['episode_return'])}; expected a finite number")


def _finite(value: Any) -> bool:
    if isinstance(value, (bool, str, bytes)):
        return False
    try:
        return math.isfinite(value)
    except TypeError:
        return False


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def rollout_returns(exps: list[Experience]) -> list[float | None]:
    """One value per rollout: the reward of a single-turn experience, or the ``episode_return`` of the
    last step of a multi-step rollout (``info["last_step"]``)."""
    if any("last_step" in e.info for e in exps):
        return [e.info.get("episode_return", e.reward) for e in exps if e.info.get("last_step")]
    return [e.reward for e in exps]


def _successes(drawn: list[list[Outcome]], threshold: float) -> list[list[float]]:
    """Per task, 1/0 per rollout: its return (a multi-step rollout: its episode return) >= ``threshold``
    ([0.0] for a skipped task)."""
    return [[float(o.value is not None and o.value >= threshold) for o in task] or [0.0] for task in drawn]


def _eval_task(task: Task, k: int, temperature: float | None) -> Task:
    """A copy of ``task`` sampling ``k`` responses (greedy when temperature is 0)."""
    from dataclasses import replace

    sampling = task.sampling if temperature is None else task.sampling.replace(temperature=temperature)
    return replace(task, repeat=k, sampling=sampling)


def _takes(fn: Any, name: str) -> bool:
    """Whether ``fn`` (a function or a class) declares a parameter ``name``."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _truncates(sampling: Any) -> bool:
    """Whether ``sampling`` draws from a top-k / top-p truncated distribution (greedy does not)."""
    return sampling.temperature > 0 and (sampling.top_k > 0 or sampling.top_p < 1)
