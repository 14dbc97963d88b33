"""Reward probes for ``trine check``: does the configured reward pay for answers that are not the answer?

A reward with partial credit, a lenient parser or a substring test can be climbed without solving the task:
the policy learns to pad, repeat, or run to ``max_tokens``, and the training reward holds while accuracy
falls. Before the run, :func:`reward_probe_row` takes the first few train tasks that have a reference
answer, finds the correct answer's score (the best of a few renderings of the reference: as is,
``\\boxed{}``, ``<answer>`` tags, a sentence), and scores adversarial answers built from it with the task's
own reward (:data:`PROBES`): padded with filler, repeated, truncated, with junk appended, and empty. A probe
that scores at least ``near`` x the correct score (when that is above 0) is a WARN naming the probe, the
task and both scores (``--strict``: exit 1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trine.config import RunConfig
from trine.inspect.probes import CheckRow

NEAR = 0.8
"""A probe scoring at least this fraction of the correct answer's score is flagged."""
TASKS = 3
"""How many tasks with a reference answer are probed."""
SCANNED = 50
"""How many train rows are read looking for them."""
FILLER = (
    "Let me think about this step by step and check every detail twice before I answer. ",
    " I double-checked the reasoning above, so I am confident this is the final answer to the question.",
)
JUNK = " ### qz7 lorem ipsum <junk> zzz ~~~"


def renderings(answer: str) -> list[str]:
    """Ways a correct response may spell the reference answer (the correct score is the best of them)."""
    return [answer, f"\\boxed{{{answer}}}", f"<answer>{answer}</answer>", f"The answer is {answer}."]


def _repeated(correct: str) -> str:
    return " ".join([correct] * 8)


PROBES: dict[str, Callable[[str], str | None]] = {
    "padded": lambda c: FILLER[0] + c + FILLER[1],
    "repeated": _repeated,
    "truncated": lambda c: c[: len(c) // 2] if len(c) > 1 else None,
    "junk appended": lambda c: c + JUNK,
    "empty": lambda c: "",
}
"""Adversarial answers built from the correct one (None: not applicable, e.g. truncating one character)."""


@dataclass
class ProbeScore:
    task_id: str
    probe: str
    response: str
    score: float | None
    correct: float
    error: str = ""


def reward_probe_row(cfg: RunConfig, tasks: int = TASKS, near: float = NEAR) -> CheckRow:
    """Score :data:`PROBES` on the first ``tasks`` train tasks with a reference answer (see the module
    docstring); one row: OK, WARN (a probe scores near the correct answer, or the reward raised on one),
    INFO (nothing to compare: no reference answers, or the reference scores 0) or SKIP (a reward that
    calls models, such as a judge)."""
    from trine import registry
    from trine.build import build_taskset
    from trine.rewards import evaluate_reward
    from trine.rewards.basic import as_text

    name = "reward probes"
    taskset = build_taskset(cfg.tasks.train.model_copy(update={"limit": SCANNED}))
    chosen = [t for t in taskset if _reference(t.answer, as_text)][:tasks]
    if not chosen:
        return CheckRow(
            name, "INFO", "no task", f"none of the first {SCANNED} train tasks has a reference answer"
        )
    results: list[ProbeScore] = []
    unscored = []
    for task in chosen:
        fn = registry.resolve("reward", task.reward)
        if _takes_models(fn):
            return CheckRow(
                name, "SKIP", task.reward, "the reward calls models (a judge): not probed offline"
            )

        def score(text: str, task: Any = task, fn: Any = fn) -> tuple[float | None, str]:
            try:
                return evaluate_reward(fn, text, task, task.reward_args)[0], ""
            except Exception as err:  # a reward that raises on an odd answer is itself a finding
                return None, f"{type(err).__name__}: {err}"

        scored = [(text, score(text)[0]) for text in renderings(_reference(task.answer, as_text))]
        correct_text, correct = max(scored, key=lambda s: -1e30 if s[1] is None else s[1])
        if correct is None or correct <= 0:
            unscored.append(task.task_id)
            continue
        for probe, build in PROBES.items():
            text = build(correct_text)
            if text is not None:
                value, error = score(text)
                results.append(ProbeScore(task.task_id, probe, text, value, correct, error))
    return _row(name, results, unscored, near)


def _reference(answer: Any, as_text: Callable[[Any], str]) -> str:
    """The reference answer as text ('' when there is none); a list of accepted answers: its first."""
    if isinstance(answer, (list, tuple)):
        answer = answer[0] if answer else None
    return "" if answer is None else as_text(answer).strip()


def _takes_models(fn: Any) -> bool:
    import inspect

    try:
        return "models" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def _row(name: str, results: list[ProbeScore], unscored: list[str], near: float) -> CheckRow:
    flagged = [r for r in results if r.score is not None and r.score >= near * r.correct]
    errors = [r for r in results if r.error]
    data = {
        "near": near,
        "probes": [r.__dict__ for r in results],
        "flagged": [r.__dict__ for r in flagged],
        "unscored_tasks": unscored,
    }
    if not results:
        return CheckRow(
            name,
            "INFO",
            f"{len(unscored)} task(s)",
            f"no rendering of the reference answer scores above 0 on tasks {', '.join(unscored)} (tried as is, "
            "\\boxed{}, <answer> tags, a sentence): nothing to compare the probes with",
            data=data,
        )
    tasks = len({r.task_id for r in results})
    value = f"{len(flagged)} of {len(results)} probes on {tasks} task(s) near the correct score"
    if not flagged and not errors:
        detail = (
            f"padded, repeated, truncated, junk-appended and empty answers score below {near:g} x correct"
        )
        return CheckRow(name, "OK", value, detail, data=data)
    found = [
        f"'{r.probe}' on task {r.task_id} scores {r.score:g} vs the correct answer's {r.correct:g}"
        for r in flagged
    ] + [f"the reward raised on '{r.probe}' (task {r.task_id}): {r.error}" for r in errors]
    detail = "; ".join(found) + (
        ". The policy can learn to game this reward (pad, repeat, run to max_tokens): make it stricter "
        "(exact_match, math_reward, a format reward with a penalty)"
        if flagged
        else ""
    )
    return CheckRow(name, "WARN", value, detail, data=data)
