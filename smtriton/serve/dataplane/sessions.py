"""SageMaker's stateful sessions on Triton sequence models (docs/contract.md §8).

SageMaker sends every request of a stateful session to one instance (``InvokeEndpoint`` with
``SessionId``); the container names the session, says when it expires and when it was closed. Here a
session is a Triton sequence: a model with ``sequence_batching`` keeps its state per sequence, and the
front gives the sequence's id to every request of the session, the start flag to its first and the end
flag to the one that closes it. The caller never sees or sends a sequence id, so it cannot reach into
another caller's sequence: session ids are 128 random bits, and the sequence ids sessions use are a
range plain requests may not name.

The table of sessions is decided once, by the endpoint's owner in the main process (whichever front
worker a request reaches); this module holds it, and what a worker reads from a request.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import orjson

from smtriton.serve.codec import RequestBody, json_part
from smtriton.serve.errors import BadRequest
from smtriton.serve.messages import OpenedSession, UsedSession

if TYPE_CHECKING:
    from smtriton.serve.triton.client import TritonClient

SESSION_HEADER = "X-Amzn-SageMaker-Session-Id"  # the request's session, or NEW_SESSION
NEW_SESSION_HEADER = "X-Amzn-SageMaker-New-Session-Id"  # a session opened: "<id>; Expires=<time>"
CLOSED_SESSION_HEADER = "X-Amzn-SageMaker-Closed-Session-Id"
NEW_SESSION = "NEW_SESSION"
# An inference request that closes its session says so in its parameters (JSON and binary+json alike).
CLOSE_PARAMETER = "sagemaker_session_close"
SEQUENCE_PARAMETERS = ("sequence_id", "sequence_start", "sequence_end")
# Sequence ids of sessions: [2**62, 2**63). Plain requests may name any other.
SESSION_SEQUENCES = 1 << 62
MAX_ID_LENGTH = 256
_ID = re.compile(r"[a-zA-Z0-9](-*[a-zA-Z0-9])*")
# Triton's own default max_sequence_idle_microseconds: a sequence idle this long is dropped.
TRITON_IDLE_S = 1.0
MAX_OPEN = 100_000  # open sessions at most; past this, new ones are refused (expired ones are swept first)
SWEEP_INTERVAL_S = 1.0  # expired sessions are forgotten by the first open this long after the last sweep


def expires_text(at: float) -> str:
    """SageMaker's form of an expiry time: ``2026-11-25T10:00:00Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


# ----- what a front worker reads from a request --------------------------------------------------------
@dataclass(frozen=True)
class SessionRequest:
    """What a request asks of its session: ``session`` (an id, or None for NEW_SESSION), ``control``
    ("open" or "close" with no inference: the body of AWS's LMI containers, ``{"requestType": ...}``),
    ``close`` (an inference that closes the session, :data:`CLOSE_PARAMETER`)."""

    session: str | None
    control: Literal["open", "close"] | None = None
    close: bool = False


def read_request(header: str, body: RequestBody, header_length: int | None) -> SessionRequest:
    """The session request in a request's session header and body (400 for a malformed one)."""
    value = header.split(";", 1)[0].strip()  # the whole New-Session-Id value, sent back, names its session
    if value == NEW_SESSION:
        session = None
    elif len(value) <= MAX_ID_LENGTH and _ID.fullmatch(value):
        session = value
    else:
        raise BadRequest(f"invalid {SESSION_HEADER}: {NEW_SESSION}, or a session id this endpoint gave")
    request = _json(body, header_length)
    control = _control(request)
    parameters = request.get("parameters") if isinstance(request, dict) else None
    parameters = parameters if isinstance(parameters, dict) else {}
    if any(name in parameters for name in SEQUENCE_PARAMETERS):
        raise BadRequest(f"a request in a session may not set {', '.join(SEQUENCE_PARAMETERS)}: the session does")
    close = parameters.get(CLOSE_PARAMETER) is True
    if session is None and (control == "close" or close):
        raise BadRequest(f"{NEW_SESSION} cannot close a session: send the session's id")
    if session is not None and control == "open":
        raise BadRequest(f"a session is opened with {SESSION_HEADER}: {NEW_SESSION}")
    return SessionRequest(session, control, close)


def _json(body: RequestBody, header_length: int | None) -> Any:
    if header_length == 0 or not body.lstrip().startswith(b"{"):
        return None
    try:
        return orjson.loads(json_part(body, header_length))
    except orjson.JSONDecodeError:
        return None  # Triton reports it, as for any request


def _control(request: Any) -> Literal["open", "close"] | None:
    """AWS's LMI containers open and close a session with a body of its own, ``{"requestType": ...}``."""
    if not isinstance(request, dict) or "inputs" in request:
        return None
    kind = request.get("requestType")
    if kind == "NEW_SESSION":
        return "open"
    if kind == "CLOSE":
        return "close"
    return None


def names_a_session_sequence(body: RequestBody, header_length: int | None) -> bool:
    """Whether a request without a session names a sequence id of the range sessions use."""
    part = json_part(body, header_length)
    if b'"sequence_id"' not in part:
        return False
    request = _json(body, header_length)
    parameters = request.get("parameters") if isinstance(request, dict) else None
    value = parameters.get("sequence_id") if isinstance(parameters, dict) else None
    return isinstance(value, int) and value >= SESSION_SEQUENCES


# ----- the table, in the endpoint's owner ---------------------------------------------------------------
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
