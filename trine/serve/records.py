"""What :class:`~trine.serve.sessions.SessionStore` keeps per session and response, and the experiences it
writes from them.

- :func:`call_experiences`: a call without a session, one pending experience per choice (prompt + the
  choice's tokens exactly as sampled, all of them ``action_mask`` 1; the choices of one response share
  ``task_id`` / ``group_id``);
- :func:`segment_experience`: a session's open trajectory as one experience
  (:meth:`~trine.workflows.trajectory.Trajectory.experience`: observations masked 0, ``token_versions``
  where versions differ) with the session's ``task_id`` / ``group_id`` and the version of its first token;
- :func:`snapshot` / :func:`undo`: take back what a failed call appended to a trajectory;
- :func:`session_state` / :func:`restore_session`: a session as plain JSON data and back (the journal of
  :mod:`trine.serve.journal` keeps it across a restart, its open trajectory token for token).
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from trine.serve.render import HistoryKey
from trine.types import Completion, Experience
from trine.workflows.trajectory import ChatDelta, Trajectory, Turn

SessionState = Literal["open", "expired", "committed"]
Snapshot = tuple[int, int, int, int, int]


@dataclass
class Session:
    """One agent session: the open trajectory and what was written of it."""

    session_id: str
    task_id: str
    """``task_id`` / ``group_id`` of its experiences (the ``task_id`` extension, else the session id)."""
    user: str | None = None
    state: SessionState = "open"
    traj: Trajectory | None = None
    tools_key: str = ""
    history: list[HistoryKey] = field(default_factory=list)
    """The open trajectory's messages as the client sent them, then our last reply."""
    turns: int = 0
    """Turns answered over the whole session (the next response's ``turn``)."""
    segment: int = 0
    """Trajectories written so far (forks, expiry)."""
    response_ids: list[str] = field(default_factory=list)
    """Responses of the open trajectory."""
    written: list[str] = field(default_factory=list)
    """Ids of the experiences written without a reward (filled when the session's reward comes)."""
    rewarded: bool = False
    last_used: float = 0.0
    busy: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class ResponseRecord:
    """One response: its experiences (a call without a session) or its session."""

    exp_ids: list[str]
    """One per choice, in choice order."""
    session_id: str | None = None
    rewarded: set[int] = field(default_factory=set)
    """The choices rewarded so far."""


@dataclass
class SessionTurn:
    """One call of a session while it generates: sample from ``prompt_ids``, then
    :meth:`~trine.serve.sessions.SessionStore.complete`."""

    session: Session
    prompt_ids: list[int]
    turn: int
    """This response's index in the session."""
    history: list[HistoryKey]
    snapshot: Snapshot | None
    """Lengths of the trajectory's lists before this call appended to it (None: a new trajectory)."""
    forked: bool = False
    done: bool = False


def call_experiences(
    response_id: str,
    prompt_ids: list[int],
    completions: list[Completion],
    *,
    task_id: str | None,
    version: int,
    info: dict[str, Any] | None,
) -> list[Experience]:
    """One pending experience per choice of a call without a session."""
    group = task_id or response_id
    exps = []
    for index, c in enumerate(completions):
        exp = Experience(
            tokens=list(prompt_ids) + list(c.response_ids),
            prompt_length=len(prompt_ids),
            action_mask=[1] * len(c.response_ids),
            logprobs=list(c.logprobs),
            reward=None,
            task_id=group,
            group_id=group,
            run_id=f"{response_id}/{index}",
            policy_version=c.policy_version if c.policy_version is not None else version,
            info={
                **(info or {}),
                "response": c.text,
                "finish_reason": c.finish_reason,
                "response_id": response_id,
                "choice_index": index,
            },
        )
        if c.token_versions and min(c.token_versions) != max(c.token_versions):
            exp.info["token_versions"] = list(c.token_versions)
        exp.check()
        exps.append(exp)
    return exps


def segment_experience(session: Session, reward: float | None, **info: Any) -> Experience:
    """The session's open trajectory as one experience (``info``: e.g. ``forked``, ``session_expired``)."""
    traj = session.traj
    assert traj is not None and traj.turns, "a segment is written only once it has a turn"
    exp = traj.experience(reward)
    exp.task_id = exp.group_id = session.task_id
    known = [v for v in traj.versions if v >= 0]
    exp.policy_version = known[0] if known else 0
    exp.info.update(
        session_id=session.session_id,
        response_ids=list(session.response_ids),
        segment=session.segment,
        **info,
    )
    if session.user is not None:
        exp.info["user"] = session.user
    exp.check()
    return exp


def snapshot(traj: Trajectory) -> Snapshot:
    """The lengths of the trajectory's lists, to :func:`undo` what comes after."""
    return len(traj.tokens), len(traj.mask), len(traj.logprobs), len(traj.versions), len(traj.messages)


def undo(turn: SessionTurn) -> None:
    """Take back what ``turn`` appended (its messages), or drop the new trajectory it opened."""
    session, traj = turn.session, turn.session.traj
    if traj is None:
        return
    if turn.snapshot is None:
        if not traj.turns:
            session.traj, session.history = None, []
        return
    n_tokens, n_mask, n_logprobs, n_versions, n_messages = turn.snapshot
    del traj.tokens[n_tokens:], traj.mask[n_mask:], traj.logprobs[n_logprobs:]
    del traj.versions[n_versions:], traj.messages[n_messages:]


def session_state(session: Session) -> dict[str, Any]:
    """What :func:`restore_session` needs, as JSON-ready data (copies: the session may change meanwhile)."""
    traj = session.traj
    return {
        "session_id": session.session_id,
        "task_id": session.task_id,
        "user": session.user,
        "state": session.state,
        "tools_key": session.tools_key,
        "history": [list(key) for key in session.history],
        "turns": session.turns,
        "segment": session.segment,
        "response_ids": list(session.response_ids),
        "written": list(session.written),
        "rewarded": session.rewarded,
        "traj": None if traj is None else _trajectory_state(traj),
    }


def restore_session(state: dict[str, Any], tokenizer: Any, delta: ChatDelta, now: float) -> Session:
    """The session :func:`session_state` saved (``delta``: the tokenizer's, shared by every restored
    trajectory; ``now``: its idle time starts again)."""
    session = Session(state["session_id"], state["task_id"], state["user"], last_used=now)
    session.state, session.tools_key = state["state"], state["tools_key"]
    session.history = [(role, content) for role, content in state["history"]]
    session.turns, session.segment, session.rewarded = state["turns"], state["segment"], state["rewarded"]
    session.response_ids, session.written = list(state["response_ids"]), list(state["written"])
    if state["traj"] is not None:
        session.traj = _restore_trajectory(state["traj"], tokenizer, delta)
    return session


_TRAJECTORY_FIELDS = ("messages", "tokens", "prompt_length", "mask", "logprobs", "versions", "max_tokens")


def _trajectory_state(traj: Trajectory) -> dict[str, Any]:
    state = {name: getattr(traj, name) for name in _TRAJECTORY_FIELDS}
    state = {k: (list(v) if isinstance(v, list) else v) for k, v in state.items()}
    state.update(turns=[asdict(t) for t in traj.turns], status=traj.status, reason=traj.reason)
    state["run_id"] = traj.run_id
    return state


def _restore_trajectory(state: dict[str, Any], tokenizer: Any, delta: ChatDelta) -> Trajectory:
    traj = Trajectory.__new__(Trajectory)  # not rendered again: its tokens are the ones sampled and seen
    traj.tokenizer, traj.delta = tokenizer, delta
    for name in _TRAJECTORY_FIELDS:
        setattr(traj, name, state[name])
    traj.turns = [Turn(**turn) for turn in state["turns"]]
    traj.status, traj.reason, traj.run_id = state["status"], state["reason"], state["run_id"]
    return traj


__all__ = [
    "ResponseRecord",
    "Session",
    "SessionState",
    "SessionTurn",
    "call_experiences",
    "restore_session",
    "segment_experience",
    "session_state",
    "snapshot",
    "undo",
]
