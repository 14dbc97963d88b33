"""Config sections for watching a run while it runs: the plateau rule (``eval.plateau``, ends a stage when
its evaluations stop improving) and the alerts (``monitor.alerts``, a webhook and/or a command on failed,
stuck, finished, stopped and alarm). Their ``monitor`` and ``eval`` keys are in :mod:`trine.config.learn`;
the rules they configure are in :mod:`trine.monitor.progress` and :mod:`trine.monitor.alerts`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import field_validator, model_validator

from trine.config.base import Count, NonNeg, Positive, Section

if TYPE_CHECKING:
    from trine.config import RunConfig

ALERT_EVENTS = ("failed", "stuck", "finished", "stopped", "alarm")
"""What an alert can be sent on: the run failed, is stuck (its step has not advanced, see
``monitor.stuck_after``), finished, stopped (stop_after_steps, Ctrl-C, SIGTERM), or raised an alarm
(``monitor.alarms``)."""


class PlateauConfig(Section):
    """End a stage early once its evaluations stop improving (``eval.plateau``; off while unset)."""

    evals: Count = 3
    """Evaluations without a gain that end the stage: the best of the last ``evals`` evaluations is no more
    than ``min_delta`` above the best before them (the stage's first evaluation counts, the one at its
    start included)."""
    min_delta: NonNeg = 0.0
    """How much the metric must rise above the earlier best to count as a gain (0: any rise)."""
    metric: str | None = None
    """The eval metric watched (higher is better), e.g. ``eval/addition/accuracy``; None: the eval's main
    metric, as the alarms pick it (the first ``eval/<taskset>/accuracy``, else avg@k, else pass@k)."""

    @field_validator("metric")
    @classmethod
    def _eval_key(cls, v: str | None) -> str | None:
        if v is not None and (not v.startswith("eval/") or v.count("/") < 2):
            raise ValueError(
                f"{v!r} is not an eval metric key; expected one such as 'eval/<taskset>/accuracy' (as "
                "metrics.jsonl names it), or null for the eval's main metric"
            )
        return v


class AlertsConfig(Section):
    """Alerts on what happens to the run (``monitor.alerts``): a JSON POST to ``url`` and/or ``command``
    run with the JSON on stdin, from a background thread (:mod:`trine.monitor.alerts`); a receiver that is
    down or slow never stops or slows the run."""

    url: str | None = None
    """POST each alert as JSON to this ``http://`` or ``https://`` URL (a webhook); None: no POST."""
    command: str | list[str] | None = None
    """Run this for each alert, with the alert's JSON on stdin and ``TRINE_ALERT_EVENT``, ``_RUN``,
    ``_RUN_DIR``, ``_STAGE``, ``_STEP`` and ``_REASON`` in its environment: a string runs through the
    shell, a list as the program and its arguments. None: no command."""
    on: list[str] = ["failed", "stuck", "finished", "alarm"]
    """Events that send an alert: ``failed``, ``stuck``, ``finished``, ``stopped``, ``alarm``. (Write the key
    as ``on:``; YAML's reading of a bare ``on`` as true is undone here.)"""
    timeout_seconds: Positive = 5.0
    """Longest one POST or command may take; also the longest the end of a run waits for alerts still
    being sent."""

    @model_validator(mode="before")
    @classmethod
    def _yaml_on(cls, data: Any) -> Any:
        """YAML 1.1 reads a bare ``on:`` key as the boolean true: take it back as ``on``."""
        if isinstance(data, dict) and True in data and "on" not in data:
            data = {("on" if k is True else k): v for k, v in data.items()}
        return data

    @field_validator("url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        if v is None:
            return v
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(
                f"{v!r} is not an http:// or https:// URL with a host; write e.g. "
                "'https://hooks.example.com/trine' (monitor.alerts.command runs anything else)"
            )
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: str | list[str] | None) -> str | list[str] | None:
        if v is None:
            return v
        if not v.strip() if isinstance(v, str) else (not v or not v[0].strip()):
            raise ValueError(
                "the command is empty; give a shell command (a string) or a program and its arguments "
                "(a list), or null for no command"
            )
        return v

    @field_validator("on")
    @classmethod
    def _events(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError(
                f"no event listed: no alert would ever be sent; list some of {', '.join(ALERT_EVENTS)}, or "
                "leave url and command unset to send none"
            )
        unknown = [e for e in v if e not in ALERT_EVENTS]
        if unknown:
            raise ValueError(
                f"unknown event(s) {', '.join(map(repr, unknown))}; the events are {', '.join(ALERT_EVENTS)}"
            )
        return v


def watch_problems(cfg: RunConfig) -> list[str]:
    """Cross-section problems of the watching settings: a plateau rule with nothing to evaluate."""
    problems = []
    if cfg.eval.plateau is not None and not cfg.tasks.eval:
        problems.append(
            "eval.plateau watches the evaluations, but tasks.eval lists no eval taskset; add one, or remove "
            "eval.plateau"
        )
    return problems
