"""The recorder of ``trine serve``: every call becomes experience, sessions become one trajectory each.

:class:`SessionStore` owns what the server remembers between calls and writes experiences through the
Buffer protocol only (``put`` and ``set_rewards``; each write runs on a blocking-pool thread under a
timeout, so a slow SQL buffer never stalls the event loop):

- **One call** (no ``session_id``), :meth:`SessionStore.record_response`: one experience per choice,
  written at once with ``reward=None`` (pending); the choices of a response share ``task_id`` /
  ``group_id`` (the ``task_id`` extension, else the response id). Feedback on the response id fills
  the reward of all its choices.
- **A session** (``session_id``), :meth:`SessionStore.turn`: calls are joined into one
  :class:`~trine.workflows.trajectory.Trajectory`, token-in token-out. The first call renders the
  opening chat (and tools); a later call whose messages are the session's so far, then our reply (any
  echo of it), then new messages, appends only the new ones (``add_messages``: action_mask 0). A call
  that does not continue the session (history edited, tools changed) writes the current trajectory
  (pending, ``info["forked"]``) and starts a new one in the same session. Turns of one session run one
  at a time (a per-session lock).
- **Writing a session**: :meth:`SessionStore.commit` (with or without its reward), feedback on the
  session or on one of its responses (commits it with the reward), or :meth:`SessionStore.expire` after
  ``session_timeout`` idle seconds (pending, ``info["session_expired"]``; a later call reopens the
  session with a new trajectory, until its reward commits it). A session's reward fills every
  trajectory it wrote; a committed session takes no more calls (409).

A reward is given once: a second feedback for the same response or session is refused (409) and
nothing is written twice. Unknown ids are 404.

**Across a restart** (:meth:`SessionStore.persist`, which ``trine serve`` calls): each session's state is
saved to a :class:`~trine.serve.journal.SessionJournal` before its answer goes out, so a server killed
with ``kill -9`` loses no acknowledged turn; the next server restores the open sessions (their idle time
starts again) and reads any other session back when a call names it. Feedback for a response this
process never answered is looked up in the journal (a session's response), then in the buffer
(:meth:`SessionStore.find_response`: the rows of a call without a session).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from trine.blocking import CallTimeout, run_blocking
from trine.buffer.base import Buffer
from trine.buffer.states import READY, STALE, TRAINED
from trine.config.serve import ServeConfig
from trine.serve.journal import SessionJournal
from trine.serve.records import (
    ResponseRecord,
    Session,
    SessionTurn,
    call_experiences,
    restore_session,
    segment_experience,
    session_state,
    snapshot,
    undo,
)
from trine.serve.render import (
    TemplateMessage,
    continues,
    history_keys,
    render_prompt,
    template_error,
)
from trine.serve.schemas import ApiError
from trine.types import Completion, Experience
from trine.workflows.trajectory import ChatDelta, Trajectory

_REWARDED = (READY, TRAINED, STALE)
"""Buffer states of a row whose reward was given."""


class SessionStore:
    """Sessions, responses and their rewards; writes experiences to ``buffer`` (see the module docstring).

    Args:
        buffer: where experiences go (any :class:`~trine.buffer.base.Buffer`).
        tokenizer: the rollout model's tokenizer (its chat template renders sessions).
        session_timeout: idle seconds before an open session is written pending (default: the default of
            ``serve.session_timeout``, :class:`~trine.config.ServeConfig`).
        write_timeout: seconds one buffer write may take before the call fails.
        max_records: closed sessions and responses remembered for late feedback (oldest forgotten first).
        clock: monotonic seconds (inject one in tests).
    """

    def __init__(
        self,
        buffer: Buffer,
        tokenizer: Any,
        *,
        session_timeout: float = ServeConfig.model_fields["session_timeout"].default,
        write_timeout: float = 60.0,
        max_records: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.buffer = buffer
        self.tokenizer = tokenizer
        self.session_timeout = session_timeout
        self.write_timeout = write_timeout
        self.max_records = max_records
        self.clock = clock
        self.sessions: OrderedDict[str, Session] = OrderedDict()
        self.responses: OrderedDict[str, ResponseRecord] = OrderedDict()
        self.counts: Counter[str] = Counter()
        self.journal: SessionJournal | None = None
        """Where sessions are saved (:meth:`persist`); None: in memory only."""
        self._delta: ChatDelta | None = None  # the tokenizer's, for the trajectories restored

    def persist(self, path: str | Path) -> int:
        """Save every session to the journal at ``path`` from now on, and restore the sessions it holds
        open (a server killed on this run directory); returns how many were restored."""
        self.journal = SessionJournal(path)
        states = self.journal.open_sessions()
        for state in states:
            self._remember(self.sessions, state["session_id"], self._restore(state))
        self.counts["sessions_restored"] += len(states)
        return len(states)

    async def find_response(self, response_id: str) -> list[tuple[Experience, str]]:
        """The buffer's rows of the call without a session answered as ``response_id`` (by this process or
        an earlier one), in choice order, with their states (:mod:`trine.buffer.states`); ``[]`` when the
        buffer does not say (it keeps no rows across processes, e.g. a memory buffer)."""
        find_runs = getattr(self.buffer, "find_runs", None)  # the SQL buffer's query
        if find_runs is None:
            return []
        found: list[tuple[Experience, str]] = []
        batch = 64  # choices are numbered 0, 1, ...: ask for the next 64 while all were there
        while True:
            run_ids = [f"{response_id}/{i}" for i in range(len(found), len(found) + batch)]
            rows = await self._io(find_runs, run_ids, what="the buffer")
            found += [(e, state) for e, state in rows if e.info.get("response_id") == response_id]
            if len(rows) < batch:
                return sorted(found, key=lambda row: row[0].info.get("choice_index", 0))

    # ------------------------------------------------------------------ one-call responses
    async def record_response(
        self,
        response_id: str,
        prompt_ids: list[int],
        completions: list[Completion],
        *,
        task_id: str | None = None,
        version: int = 0,
        info: dict[str, Any] | None = None,
    ) -> list[Experience]:
        """Write one pending experience per choice of a call without a session; returns them."""
        exps = call_experiences(
            response_id, prompt_ids, completions, task_id=task_id, version=version, info=info
        )
        await self._write(self.buffer.put, exps)
        self.counts["experiences_written"] += len(exps)
        self._remember(self.responses, response_id, ResponseRecord([e.id for e in exps]))
        return exps

    # ------------------------------------------------------------------ sessions
    @contextlib.asynccontextmanager
    async def turn(
        self,
        session_id: str,
        messages: list[TemplateMessage],
        tools: list[dict[str, Any]] | None = None,
        *,
        task_id: str | None = None,
        user: str | None = None,
        max_prompt_tokens: int | None = None,
    ) -> AsyncIterator[SessionTurn]:
        """Open the next turn of ``session_id`` (one at a time per session); yields the prompt to sample
        from. Call :meth:`SessionTurn`'s :meth:`complete` with the completion; leaving the block without
        it (an engine error, a cancelled request) undoes what the call appended."""
        while True:  # the session may be dropped while we wait for its lock (its first call failed)
            session = await self._session(session_id, task_id, user)
            await session.lock.acquire()
            if self.sessions.get(session_id) is session:
                break
            session.lock.release()
        session.busy += 1
        try:
            if session.state == "committed":
                raise _committed(session_id)
            turn = await self._begin(session, messages, tools, max_prompt_tokens)
            try:
                yield turn
            finally:
                if not turn.done:
                    undo(turn)
                await self._save(session)  # before the answer goes out: an acknowledged turn is kept
        finally:
            session.busy -= 1
            session.last_used = self.clock()
            if session.traj is None and not session.written and session.state == "open":
                self.sessions.pop(session_id, None)  # its first call failed: no session was opened
            session.lock.release()

    def complete(self, turn: SessionTurn, completion: Completion, response_id: str, version: int = 0) -> None:
        """Append the sampled turn to the session's trajectory (exactly as sampled)."""
        session = turn.session
        assert session.traj is not None
        session.traj.add_completion(completion, version)
        session.history = [*turn.history, ("assistant", None)]
        session.response_ids.append(response_id)
        session.turns += 1
        turn.done = True
        self._remember(self.responses, response_id, ResponseRecord([], session_id=session.session_id))

    async def commit(self, session_id: str, reward: float | None = None) -> dict[str, Any]:
        """Close a session: write its open trajectory (ready with ``reward``, else pending). 404 unknown,
        409 already committed."""
        session = await self._known(session_id)
        async with session.lock:
            if session.state == "committed":
                raise ApiError(
                    409,
                    f"session {session_id!r} is already committed; send its reward with POST /v1/feedback "
                    '{"session_id": ..., "reward": ...} if it has none yet.',
                    param="session_id",
                )
            if reward is not None and session.rewarded:
                raise _twice("session_id", session_id)
            written = await self._close(session, reward)
            session.state = "committed"
            self.counts["sessions_committed"] += 1
            await self._save(session)
        return {
            "session_id": session_id,
            "committed": True,
            "experiences": written,
            "rewarded": reward is not None,
        }

    async def feedback(
        self,
        *,
        response_id: str | None = None,
        session_id: str | None = None,
        reward: float,
        choice: int | None = None,
    ) -> dict[str, Any]:
        """Give the reward of one response (all its choices, or choice ``choice``) or one session (which
        commits it), once each."""
        if response_id is not None:
            record = self.responses.get(response_id) or await self._find_record(response_id)
            if record is None:
                raise ApiError(
                    404,
                    f"response_id {response_id!r} is unknown (never answered here, or forgotten).",
                    param="response_id",
                )
            if record.session_id is not None:
                if choice not in (None, 0):
                    raise ApiError(
                        400, f"choice={choice}: a session's response has one choice (0).", param="choice"
                    )
                return {"response_id": response_id, **await self._session_feedback(record.session_id, reward)}
            choices = set(range(len(record.exp_ids))) if choice is None else {choice}
            if choice is not None and choice >= len(record.exp_ids):
                raise ApiError(
                    400,
                    f"choice={choice}: response {response_id!r} has {len(record.exp_ids)} choice(s), "
                    f"numbered from 0.",
                    param="choice",
                )
            if choices & record.rewarded:
                raise _twice("response_id", response_id)
            record.rewarded |= choices
            try:
                filled = await self._write(
                    self.buffer.set_rewards, {record.exp_ids[i]: float(reward) for i in sorted(choices)}
                )
            except BaseException:
                record.rewarded -= choices
                raise
            self.counts["feedback"] += 1
            self.counts["rewards_filled"] += filled
            return {"response_id": response_id, "rewarded": filled}
        if session_id is None:
            raise ApiError(400, "feedback names neither response_id nor session_id; give one of them.")
        return await self._session_feedback(session_id, reward)

    async def expire(self) -> int:
        """Write every open session idle for ``session_timeout`` seconds (pending, ``session_expired``)."""
        now, count = self.clock(), 0
        for session in list(self.sessions.values()):
            idle = session.state == "open" and not session.busy and not session.lock.locked()
            if not idle or now - session.last_used < self.session_timeout:
                continue
            async with session.lock:
                if session.state != "open" or session.busy:
                    continue
                await self._close(session, None, session_expired=True)
                session.state = "expired"
                self.counts["sessions_expired"] += 1
                count += 1
                await self._save(session)
        return count

    async def aclose(self) -> int:
        """Write every open session pending (server shutdown); returns how many."""
        count = 0
        for session in list(self.sessions.values()):
            if session.state == "open" and session.traj is not None:
                async with session.lock:
                    await self._close(session, None, session_closed="shutdown")
                    session.state = "expired"
                    count += 1
                    await self._save(session)
        if self.journal is not None:
            self.journal.close()
        return count

    def metrics(self) -> dict[str, float]:
        """``serve/sessions_*``, ``serve/feedback``, ``serve/experiences_written`` counters."""
        names = (
            "sessions_opened", "sessions_committed", "sessions_expired", "sessions_forked",
            "sessions_reopened", "sessions_restored", "feedback", "rewards_filled", "experiences_written",
        )  # fmt: skip
        out = {f"serve/{name}": float(self.counts[name]) for name in names}
        out["serve/sessions_open"] = float(sum(s.state == "open" for s in self.sessions.values()))
        return out

    # ------------------------------------------------------------------ internals
    async def _session(self, session_id: str, task_id: str | None, user: str | None) -> Session:
        session = await self._lookup(session_id)
        if session is None:
            session = Session(session_id, task_id or session_id, user, last_used=self.clock())
            self._remember(self.sessions, session_id, session)
        return session

    async def _known(self, session_id: str) -> Session:
        session = await self._lookup(session_id)
        if session is None:
            raise ApiError(
                404, f"session_id {session_id!r} is unknown (never opened, or forgotten).", param="session_id"
            )
        return session

    async def _lookup(self, session_id: str) -> Session | None:
        """The session in memory, else as the journal saved it (read back into memory), else None."""
        session = self.sessions.get(session_id)
        if session is not None or self.journal is None:
            return session
        state = await self._io(self.journal.load, session_id)
        if state is not None and session_id not in self.sessions:  # not read back by another call meanwhile
            self._remember(self.sessions, session_id, self._restore(state))
        return self.sessions.get(session_id)

    def _restore(self, state: dict[str, Any]) -> Session:
        if self._delta is None:
            self._delta = ChatDelta(self.tokenizer)
        return restore_session(state, self.tokenizer, self._delta, self.clock())

    async def _save(self, session: Session) -> None:
        """Save the session to the journal (if any) once it holds something: a trajectory, or writes."""
        if self.journal is None or (session.traj is None and not session.written and not session.rewarded):
            return
        await self._io(self.journal.save, session_state(session))

    async def _find_record(self, response_id: str) -> ResponseRecord | None:
        """A response this process does not remember: a session's (journal) or a call's (buffer)."""
        record = None
        session_id = None if self.journal is None else await self._io(self.journal.session_of, response_id)
        if session_id is not None:
            record = ResponseRecord([], session_id=session_id)
        else:
            rows = await self.find_response(response_id)
            if rows:
                rewarded = {i for i, (_, state) in enumerate(rows) if state in _REWARDED}
                record = ResponseRecord([e.id for e, _ in rows], rewarded=rewarded)
        if record is None or response_id in self.responses:  # found meanwhile by another call: share it
            return self.responses.get(response_id)
        self._remember(self.responses, response_id, record)
        return record

    async def _begin(
        self,
        session: Session,
        messages: list[TemplateMessage],
        tools: list[dict[str, Any]] | None,
        max_prompt_tokens: int | None,
    ) -> SessionTurn:
        keys = history_keys(messages)
        tools_key = json.dumps(tools or [], sort_keys=True)
        traj = session.traj
        if traj is not None and tools_key == session.tools_key and continues(keys, session.history):
            turn = SessionTurn(session, [], session.turns, keys, snapshot(traj))
            try:
                await _tokenize(traj.add_messages, messages[len(session.history) :])
            except Exception as err:
                undo(turn)
                raise template_error(err) from None
            except BaseException:  # cancelled: _tokenize waited for the thread, so this undoes all of it
                undo(turn)
                raise
            self._check_length(turn, len(traj.tokens), max_prompt_tokens)
            turn.prompt_ids = list(traj.tokens)
            return turn
        new = await _tokenize(self._new_trajectory, messages, tools)
        turn = SessionTurn(session, list(new.tokens), session.turns, keys, None)
        self._check_length(turn, len(new.tokens), max_prompt_tokens)
        if traj is not None and traj.turns:
            await self._write_segment(session, None, forked=True)
            turn.forked = True
            self.counts["sessions_forked"] += 1
        elif session.state == "expired":
            self.counts["sessions_reopened"] += 1
        elif not session.written:
            self.counts["sessions_opened"] += 1
        session.state, session.traj, session.tools_key, session.history = "open", new, tools_key, []
        return turn

    def _new_trajectory(
        self, messages: list[TemplateMessage], tools: list[dict[str, Any]] | None
    ) -> Trajectory:
        render_prompt(self.tokenizer, messages, tools)  # a template error is the client's: 400
        try:
            return Trajectory(self.tokenizer, messages, tools=tools)
        except ValueError as err:  # a template that cannot continue a conversation token-in token-out
            raise ApiError(
                400, f"sessions cannot be served with this model: {err}", param="session_id"
            ) from None

    def _check_length(self, turn: SessionTurn, length: int, limit: int | None) -> None:
        if limit is not None and length > limit:
            undo(turn)
            raise ApiError(
                400,
                f"the session's conversation is {length} tokens after the chat template, above "
                f"max_prompt_tokens={limit}; commit the session and start a new one with a shorter history.",
                param="messages",
            )

    async def _close(self, session: Session, reward: float | None, **info: Any) -> int:
        """Write the open trajectory (with ``reward``) and fill earlier ones; returns experiences written."""
        written = 0
        if session.traj is not None and session.traj.turns:
            await self._write_segment(session, reward, **info)
            written = 1
        session.traj, session.history = None, []
        if reward is not None:
            await self._reward_session(session, reward)
        return written

    async def _write_segment(self, session: Session, reward: float | None, **info: Any) -> None:
        exp = segment_experience(session, reward, **info)
        await self._write(self.buffer.put, [exp])
        self.counts["experiences_written"] += 1
        if reward is None:
            session.written.append(exp.id)
        else:
            session.rewarded = True
        session.segment += 1
        session.traj, session.response_ids = None, []

    async def _reward_session(self, session: Session, reward: float) -> None:
        if session.written:
            filled = await self._write(self.buffer.set_rewards, dict.fromkeys(session.written, float(reward)))
            self.counts["rewards_filled"] += filled
        session.rewarded = True
        self.counts["feedback"] += 1

    async def _session_feedback(self, session_id: str, reward: float) -> dict[str, Any]:
        session = await self._known(session_id)
        async with session.lock:
            if session.rewarded:
                raise _twice("session_id", session_id)
            written = 0
            if session.state == "open":
                written = await self._close(session, reward)
            else:
                await self._reward_session(session, reward)  # an expired session: its reward commits it
            if session.state != "committed":
                session.state = "committed"
                self.counts["sessions_committed"] += 1
            await self._save(session)
            return {"session_id": session_id, "committed": True, "experiences": written}

    async def _write(self, fn: Callable[..., Any], arg: Any) -> Any:
        return await self._io(fn, arg, what="the buffer")

    async def _io(self, fn: Callable[..., Any], *args: Any, what: str = "the session journal") -> Any:
        """``fn(*args)`` on a worker thread within ``write_timeout`` (503 past it)."""
        try:
            return await run_blocking(fn, *args, timeout=self.write_timeout)
        except CallTimeout:
            raise ApiError(
                503,
                f"{what} did not answer within {self.write_timeout:g} s; retry later.",
                kind="server_error",
            ) from None

    def _remember(self, table: OrderedDict[str, Any], key: str, value: Any) -> None:
        """Keep ``value``; beyond ``max_records`` forget the oldest entries (an open session never)."""
        table[key] = value
        if len(table) <= self.max_records:
            return
        for old in list(table):
            if len(table) <= self.max_records:
                break
            item = table[old]
            if not (isinstance(item, Session) and item.state == "open"):
                del table[old]


async def _tokenize(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` (tokenizing) on a worker thread, so the event loop goes on answering others. If the
    caller is cancelled meanwhile, the thread is waited for first: it may be appending to a trajectory."""
    call = asyncio.ensure_future(run_blocking(fn, *args))
    try:
        return await asyncio.shield(call)
    except asyncio.CancelledError:
        with contextlib.suppress(BaseException):
            await call
        raise


def _committed(session_id: str) -> ApiError:
    return ApiError(
        409,
        f"session {session_id!r} is committed; start the next episode with a new session_id.",
        param="session_id",
    )


def _twice(param: str, value: str) -> ApiError:
    return ApiError(409, f"{param} {value!r} already has its reward; a reward is given once.", param=param)


__all__ = ["Session", "SessionStore", "SessionTurn"]
