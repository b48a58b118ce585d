"""SageMaker's stateful sessions on Triton sequence models (docs/contract.md §8).

SageMaker sends every request of a stateful session to one instance (``InvokeEndpoint`` with
``SessionId``); the container names the session, says when it expires and when it was closed. Here a
session is a Triton sequence: a model with ``sequence_batching`` keeps its state per sequence, and the
front gives the sequence's id to every request of the session, the start flag to its first and the end
flag to the one that closes it. The caller never sees or sends a sequence id, so it cannot reach into
another caller's sequence: session ids are 128 random bits, and the sequence ids sessions use are a
range plain requests may not name.

The table of sessions is decided once, by the endpoint's owner in the main process (whichever front
worker a request reaches: :mod:`smtriton.serve.owner.sessions`); this module holds what a worker reads
from a request, and what a session step of its data plane is.
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import orjson

from smtriton.serve.dataplane.codec import RequestBody, json_part
from smtriton.serve.errors import BadRequest

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


# ----- a request's part in its session, as the data plane runs it --------------------------------------
class SessionsOf(Protocol):
    """Whom a streamed answer in a session reports to: the data plane that asked the owner for it."""

    async def session_done(self, step: SessionStep, answered: bool) -> None: ...


@dataclass(frozen=True)
class SessionStep:
    """A request's part in its session. ``parameters``: the sequence to set in its inference (None: it
    only opened or closed the session, and ``body`` is the answer); ``headers``: what the answer adds
    (for an inference, once it succeeded); ``opened``, ``closes``: the inference opens, or closes, it."""

    session: str
    parameters: dict[str, str | int | bool] | None
    headers: list[tuple[bytes, bytes]]
    body: bytes = b""
    opened: bool = False
    closes: bool = False


class SessionStream:
    """A streamed answer in a session: ``responses``, Triton's as they come, and :meth:`close`, the
    clean-up to run once however the stream ended, also when nothing ever iterated ``responses`` (an
    async generator never started never runs its ``finally``: the client left before the answer began).

    The owner hears that the sequence was answered once Triton's first response that is not an error
    came; a closing step closes the session however the stream ends (its answer's headers already said
    so), once: when Triton's stream ended, before the answer's last chunk goes out, else on :meth:`close`."""

    def __init__(self, plane: SessionsOf, step: SessionStep, upstream: AsyncGenerator[dict[str, Any], None]) -> None:
        self.step = step
        self._plane = plane
        self._upstream = upstream
        self._closed = False
        self._reported = False
        self.responses = self._responses()

    async def _responses(self) -> AsyncGenerator[dict[str, Any], None]:
        answered = False
        async for response in self._upstream:
            if not answered and "error" not in response:
                answered = True
                if not self.step.closes:
                    await self._plane.session_done(self.step, True)
            yield response
        await self._report_closed()

    async def _report_closed(self) -> None:
        if self.step.closes and not self._reported:
            self._reported = True
            await self._plane.session_done(self.step, True)

    async def close(self) -> None:
        """End the stream: Triton's is closed (cancelled, if it still runs), and a closing step's
        session reported closed; only the first call does anything."""
        if self._closed:
            return
        self._closed = True
        try:
            try:
                await self.responses.aclose()
            finally:
                await self._upstream.aclose()
        finally:
            await self._report_closed()
