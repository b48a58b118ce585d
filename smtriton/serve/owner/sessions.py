"""The endpoint's stateful sessions, in the main process: the table of open sessions and the keeper that
answers the workers about them (docs/design.md §3b). What a request asks of its session, and the
constants both sides share, are :mod:`smtriton.serve.dataplane.sending.sessions`."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from smtriton.serve.dataplane.sending.sessions import SESSION_SEQUENCES, TRITON_IDLE_S, expires_text
from smtriton.serve.errors import BadRequest
from smtriton.serve.ipc.messages import OpenedSession, UsedSession

if TYPE_CHECKING:
    from smtriton.serve.triton.client import TritonClient


MAX_OPEN = 100_000  # open sessions at most; past this, new ones are refused (expired ones are swept first)
SWEEP_INTERVAL_S = 1.0  # expired sessions are forgotten by the first open this long after the last sweep


@dataclass
class Session:
    """One open session. Its times are of the monotonic clock (a change of the wall clock moves no
    session's expiry); the wall clock only writes the expiry SageMaker is told."""

    id: str
    model: str  # the Triton model it is a sequence of
    sequence_id: int
    idle_s: float  # it expires once idle this long (the model's max_sequence_idle_microseconds)
    expires_at: float  # and at this time in any case
    last_used: float
    started: bool = False  # a request with the start flag reached the model and was answered

    def expired(self, now: float) -> bool:
        return now >= self.expires_at or now - self.last_used > self.idle_s


class SessionTable:
    """The open sessions of an endpoint; every decision about them is made here, once. ``now`` is
    always the monotonic clock's."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self.sessions: dict[str, Session] = {}
        self._sequences: set[int] = set()
        self._swept = -SWEEP_INTERVAL_S

    def open(self, model: str, idle_s: float, now: float) -> Session:
        if now - self._swept >= SWEEP_INTERVAL_S or len(self.sessions) >= MAX_OPEN:
            self.sweep(now)
        if len(self.sessions) >= MAX_OPEN:
            raise BadRequest(f"too many open sessions ({MAX_OPEN}): close some first")
        session_id = secrets.token_hex(16)
        sequence = SESSION_SEQUENCES + secrets.randbelow(SESSION_SEQUENCES)
        while sequence in self._sequences:
            sequence = SESSION_SEQUENCES + secrets.randbelow(SESSION_SEQUENCES)
        session = Session(session_id, model, sequence, idle_s, now + self.ttl_s, last_used=now)
        self.sessions[session_id] = session
        self._sequences.add(sequence)
        return session

    def get(self, session_id: str, model: str, now: float) -> Session:
        """The open session ``session_id`` of ``model`` (400 when it is not, and why)."""
        session = self.sessions.get(session_id)
        if session is None:
            raise BadRequest(f"session '{session_id}' is not open here: unknown, closed or expired")
        if session.expired(now):
            self.forget(session_id)
            idle = now - session.last_used > session.idle_s
            why = f"idle for more than {session.idle_s:g} s" if idle else "past its expiry"
            raise BadRequest(f"session '{session_id}' has expired ({why}): open a new one")
        if session.model != model:
            raise BadRequest(f"session '{session_id}' belongs to another model")
        return session

    def use(self, session_id: str, model: str, now: float) -> Session:
        """The open session of ``model`` for a request sent ``now``, whose idle time starts again now.

        Only the request moves the idle clock, never its answer: Triton's clock for the sequence
        restarts when the request reaches it, a moment later, so the table always finds a sequence
        idle before Triton drops it, and the caller is told the session expired rather than having its
        requests refused by a Triton that no longer knows the sequence."""
        session = self.get(session_id, model, now)
        session.last_used = now
        return session

    def answered(self, session_id: str) -> None:
        """The model answered a request of the session: its sequence has started."""
        session = self.sessions.get(session_id)
        if session is not None:
            session.started = True

    def forget(self, session_id: str) -> Session | None:
        session = self.sessions.pop(session_id, None)
        if session is not None:
            self._sequences.discard(session.sequence_id)
        return session

    def drop_model(self, model: str) -> list[str]:
        """The model is gone (unloaded): its sessions with it."""
        gone = [s.id for s in self.sessions.values() if s.model == model]
        for session_id in gone:
            self.forget(session_id)
        return gone

    def clear(self) -> None:
        """Triton restarted: every sequence's state is gone, and so is every session."""
        self.sessions.clear()
        self._sequences.clear()

    def sweep(self, now: float) -> None:
        """Forget the expired sessions (their ids are refused either way: this bounds the table)."""
        self._swept = now
        for session in [s for s in self.sessions.values() if s.expired(now)]:
            self.forget(session.id)


class SessionKeeper:
    """The endpoint's sessions, as the owner answers the workers about them: the table, and each
    sequence model's idle timeout (read from Triton once per model, forgotten when the model goes)."""

    def __init__(self, ttl_s: float, client: Callable[[], TritonClient], clock: Callable[[], float] = time.monotonic):
        self.table = SessionTable(ttl_s)
        self._client = client
        self._clock = clock
        self._idle_s: dict[str, float] = {}  # a sequence model's idle timeout, once read

    async def open(self, model: str) -> OpenedSession:
        session = self.table.open(model, await self._idle(model), self._clock())
        expires = expires_text(time.time() + self.table.ttl_s)
        return {"id": session.id, "sequence_id": session.sequence_id, "expires": expires}

    def use(self, session_id: str, model: str) -> UsedSession:
        session = self.table.use(session_id, model, self._clock())
        return {"sequence_id": session.sequence_id, "start": not session.started}

    def close(self, session_id: str, model: str, any_model: bool) -> None:
        """The caller's close (400 unless the session is open for ``model``), or with ``any_model`` the
        front's, after the request that ended it."""
        if not any_model:
            self.table.get(session_id, model, self._clock())
        self.table.forget(session_id)

    def answered(self, session_id: str) -> None:
        self.table.answered(session_id)

    def forget_model(self, model: str) -> None:
        """The Triton model ``model`` was unloaded or loaded anew: its sessions end, its idle timeout is
        read again."""
        self.table.drop_model(model)
        self._idle_s.pop(model, None)

    def clear(self) -> None:
        """Triton restarted: every sequence's state is gone, and every model may have changed."""
        self.table.clear()
        self._idle_s.clear()

    async def _idle(self, model: str) -> float:
        """How long Triton keeps an idle sequence of ``model`` (400 for a model that keeps none)."""
        idle = self._idle_s.get(model)
        if idle is None:
            config = await self._client().model_config(model)
            batching = config.get("sequence_batching")
            if not isinstance(batching, dict):
                raise BadRequest(
                    f"model '{model}' keeps no state between requests (its config has no sequence_batching): "
                    "a stateful session needs a sequence model"
                )
            microseconds = int(str(batching.get("max_sequence_idle_microseconds") or 0))
            idle = microseconds / 1e6 if microseconds > 0 else TRITON_IDLE_S
            self._idle_s[model] = idle
        return idle
