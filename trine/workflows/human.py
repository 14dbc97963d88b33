"""Human feedback: people rate or compare the sampled responses, and their answers become the rewards.

``human_feedback`` samples a task like ``single_turn`` with ``defer_reward=True`` (``repeat`` answers,
each returned with ``reward=None``: pending in the buffer) and posts the task's responses to the
annotation queue (:mod:`trine.feedback.queue`) as one batch, committed at once:

- ``ask: rate``: one item per response; a person gives a number in ``scale`` (default ``[0, 1]``) and
  that number becomes the experience's reward.
- ``ask: pair``: responses are paired 0-1, 2-3, ... (``repeat`` must be even); a person picks ``a``,
  ``b`` or ``tie``. The chosen experience's reward becomes 1.0 and the rejected one's 0.0, and the pair
  also lands as two preference rows (the items carry ``prompt_tokens`` and each response's tokens), so a
  later ``mode: train`` DPO stage can learn from them (``tasks.source: buffer``). A tie lands nothing.

Each returned experience carries ``info["annotation_item"]`` (the item's id). Answers reach the run's
buffer when the studio (or ``trine annotate land``) *lands* them (:mod:`trine.feedback.landing`): the
pending rows become trainable and training picks them up with no extra step. Items nobody answers
within ``timeout`` seconds expire (counted); their experiences wait until ``buffer.pending_timeout``
drops them (or gives them ``buffer.default_reward``). Because another process writes the rewards, the
run needs a buffer that process can reach (``buffer.storage: sql``; checked by ``trine validate``).

The queue defaults to ``<run_dir>/annotations.db``: the wiring passes the run directory to a workflow
class that declares a ``run_dir`` parameter (``trine.build._run_dir_args``); ``queue``
names another database (a SQLAlchemy URL, or a path for a SQLite file).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, ClassVar

from trine.blocking import run_blocking
from trine.feedback.queue import AnnotationQueue, Item, normalize_url, queue_url
from trine.models.chat import chat_text
from trine.types import Experience, Task
from trine.workflows.base import RolloutModel, ScoreFn
from trine.workflows.single_turn import SingleTurnWorkflow

ASKS = ("rate", "pair")


class HumanFeedbackWorkflow:
    """Sample ``task.repeat`` answers (rewards pending) and post them to the annotation queue.

    Args:
        reward: the task's reward function; not called (people give the rewards), taken because the
            explorer builds every workflow with one.
        ask: ``rate`` (one item per response) or ``pair`` (responses 0-1, 2-3, ... compared).
        scale: ``[lo, hi]`` of a rating (``ask: rate``); the rating is the reward.
        timeout: seconds an item waits for a person before it expires.
        queue: the annotation queue's database (SQLAlchemy URL or SQLite path); default
            ``<run_dir>/annotations.db``.
        run_dir: the run directory, passed by trine itself (not a ``workflow_args`` key).
    """

    rewards_from_outside: ClassVar[bool] = True
    """Its rewards are written by another process (the studio, ``trine annotate land``), so the run's
    buffer must be one that process can reach (read by :mod:`trine.config.checks`)."""

    @staticmethod
    def argument_problems(
        ask: Any = "rate", scale: Any = (0.0, 1.0), timeout: Any = 3600.0, **_: Any
    ) -> list[str]:
        """What is wrong with these ``workflow_args`` values (``trine validate`` reports them)."""
        return argument_problems(ask, scale, timeout)

    def __init__(
        self,
        reward: ScoreFn,
        ask: str = "rate",
        scale: Sequence[float] = (0.0, 1.0),
        timeout: float = 3600.0,
        queue: str | None = None,
        run_dir: str | None = None,
    ) -> None:
        problems = argument_problems(ask, scale, timeout)
        if problems:
            raise ValueError("human_feedback: " + "; ".join(problems))
        if queue is None and run_dir is None:
            raise ValueError(
                "human_feedback needs the annotation queue's database: set workflow_args.queue (a SQLAlchemy "
                "URL or a SQLite path), or run it through trine, which passes the run directory"
            )
        self.sampler = SingleTurnWorkflow(reward, defer_reward=True)
        self.ask = ask
        self.scale = (float(scale[0]), float(scale[1]))
        self.timeout = float(timeout)
        self.url = normalize_url(queue) if queue is not None else queue_url(run_dir)  # type: ignore[arg-type]
        self._queue: AnnotationQueue | None = None
        self._lock = threading.Lock()

    async def run(self, task: Task, model: RolloutModel) -> list[Experience]:
        """Sample the task's answers (rewards pending), post them as one batch, return them."""
        if self.ask == "pair" and task.repeat % 2:
            raise ValueError(
                f"human_feedback ask: pair compares responses 0-1, 2-3, ...; task {task.task_id} has "
                f"repeat={task.repeat}: set tasks.train.repeat to an even number"
            )
        experiences = await self.sampler.run(task, model)
        items = self.items(task, experiences)
        await run_blocking(self._post, items)
        return experiences

    def items(self, task: Task, experiences: list[Experience]) -> list[Item]:
        """The annotation items of one task's experiences; marks each experience with its item's id."""
        messages = [
            {"role": str(m.get("role", "")), "content": str(m.get("content", ""))} for m in task.messages()
        ]
        prompt = chat_text(messages)
        meta: dict[str, Any] = {"task_id": task.task_id, "taskset": task.taskset, "messages": messages}
        if task.answer is not None:
            meta["answer"] = str(task.answer)  # a reference for the annotator, never shown as a response
        if self.ask == "rate":
            out = [
                Item("rate", prompt, [_response(e)], scale=self.scale, meta=dict(meta)) for e in experiences
            ]
            for item, e in zip(out, experiences):
                e.info["annotation_item"] = item.id
            return out
        out = []
        for a, b in zip(experiences[0::2], experiences[1::2]):
            prompt_tokens = a.tokens[: a.prompt_length]
            item = Item(
                "pair", prompt, [_response(a), _response(b)], meta={**meta, "prompt_tokens": prompt_tokens}
            )
            a.info["annotation_item"] = b.info["annotation_item"] = item.id
            out.append(item)
        return out

    def _post(self, items: list[Item]) -> str:
        """Post ``items`` as one batch (one transaction); opens the queue on first use."""
        with self._lock:
            if self._queue is None:
                self._queue = AnnotationQueue(self.url)
            queue = self._queue
        return queue.post(items, timeout=self.timeout)

    def close(self) -> None:
        """Release the queue's connections (the explorer calls it when the stage ends)."""
        with self._lock:
            if self._queue is not None:
                self._queue.close()
                self._queue = None


def argument_problems(ask: Any, scale: Any, timeout: Any) -> list[str]:
    """What is wrong with the workflow's arguments (``[]`` when nothing is)."""
    problems = []
    if ask not in ASKS:
        problems.append(f"ask={ask!r}; expected one of {list(ASKS)}")
    numbers = isinstance(scale, (list, tuple)) and len(scale) == 2
    numbers = numbers and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in scale)
    if not numbers or not scale[0] < scale[1]:
        problems.append(f"scale={scale!r}; expected [lo, hi] with lo < hi, e.g. [0, 1] or [1, 5]")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        problems.append(f"timeout={timeout!r}; expected the seconds an item waits for a person (> 0)")
    return problems


def _response(e: Experience) -> dict[str, Any]:
    return {"text": str(e.info.get("response", "")), "experience_id": e.id, "tokens": e.response_tokens}
