"""SageMaker's stateful sessions on Triton sequence models (docs/contract.md §8).

SageMaker sends every request of a stateful session to one instance (``InvokeEndpoint`` with
``SessionId``); the container names the session, says when it expires and when it was closed. Here a
session is a Triton sequence: a model with ``sequence_batching`` keeps its state per sequence, and the
front gives the sequence's id to every request of the session, the start flag to its first and the end
flag to the one that closes it. The caller never sees or sends a sequence id, so it cannot reach into
another caller's sequence: session ids are 128 random bits, and the sequence ids sessions use are a
range plain requests may not name.

The table of sessions is decided once, by the endpoint's owner in the main process (whichever front
worker a request reaches: :mod:`smtriton.serve.owner.sessions`); this module is the request's side, in
a front worker: what it reads from a request, and the steps its data plane takes in the session (ask
the owner to open, use or close it; tell it how the inference went).
"""

from __future__ import annotations

import re
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from smtriton.serve import headers
from smtriton.serve.dataplane.sending.owner_link import OwnerLink
from smtriton.serve.errors import BadRequest

SESSION_HEADER = headers.SESSION
_SESSION = headers.wire(headers.SESSION)
_NEW_SESSION = headers.wire(headers.NEW_SESSION)
_CLOSED_SESSION = headers.wire(headers.CLOSED_SESSION)
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


def read_request(header: str, request: dict[str, Any] | None) -> SessionRequest:
    """The session request in a request's session ``header`` and its JSON part as the request's one
    reading read it (None: no JSON part); 400 for a malformed one."""
    value = header.split(";", 1)[0].strip()  # the whole New-Session-Id value, sent back, names its session
    if value == NEW_SESSION:
        session = None
    elif len(value) <= MAX_ID_LENGTH and _ID.fullmatch(value):
        session = value
    else:
        raise BadRequest(f"invalid {SESSION_HEADER}: {NEW_SESSION}, or a session id this endpoint gave")
    control = _control(request)
    parameters = request.get("parameters") if request is not None else None
    parameters = parameters if isinstance(parameters, dict) else {}
    if any(name in parameters for name in SEQUENCE_PARAMETERS):
        raise BadRequest(f"a request in a session may not set {', '.join(SEQUENCE_PARAMETERS)}: the session does")
    close = parameters.get(CLOSE_PARAMETER) is True
    if session is None and (control == "close" or close):
        raise BadRequest(f"{NEW_SESSION} cannot close a session: send the session's id")
    if session is not None and control == "open":
        raise BadRequest(f"a session is opened with {SESSION_HEADER}: {NEW_SESSION}")
    return SessionRequest(session, control, close)


def _control(request: dict[str, Any] | None) -> Literal["open", "close"] | None:
    """AWS's LMI containers open and close a session with a body of its own, ``{"requestType": ...}``."""
    if request is None or "inputs" in request:
        return None
    kind = request.get("requestType")
    if kind == "NEW_SESSION":
        return "open"
    if kind == "CLOSE":
        return "close"
    return None


# Why a request of its own sequence fails when Triton dies (or is down).
SEQUENCE_LOST = (
    "a request that sets its own sequence (sequence_id, sequence_start, sequence_end) is not sent again, nor held "
    "for the next Triton, which holds nothing of the sequence; start the sequence again"
)


def in_a_sequence(parameters: dict[str, Any]) -> bool:
    """Whether a request outside a session sets a sequence of its own (any of :data:`SEQUENCE_PARAMETERS`):
    then it is not stateless, for Triton keeps its sequence's state from one request to the next."""
    return any(name in parameters for name in SEQUENCE_PARAMETERS)


def names_a_session_sequence(parameters: dict[str, Any]) -> bool:
    """Whether a request's parameters, outside a session, name a sequence id of the range sessions use."""
    value = parameters.get("sequence_id")
    return type(value) is int and value >= SESSION_SEQUENCES


# ----- a request's part in its session, as the data plane runs it --------------------------------------
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

    def __init__(self, steps: SessionSteps, step: SessionStep, upstream: AsyncGenerator[dict[str, Any], None]) -> None:
        self.step = step
        self._steps = steps
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
                    await self._steps.done(self.step, True)
            yield response
        await self._report_closed()

    async def _report_closed(self) -> None:
        if self.step.closes and not self._reported:
            self._reported = True
            await self._steps.done(self.step, True)

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


class SessionSteps:
    """The steps a request takes in its session, asked of the owner through ``owner``."""

    def __init__(self, owner: OwnerLink) -> None:
        self.owner = owner

    async def step(
        self, triton_name: str, header: str, request: dict[str, Any] | None, json_body: bool, streamed: bool
    ) -> SessionStep:
        """What a request in a session (``header``: X-Amzn-SageMaker-Session-Id) asks: open or close the
        session (no inference), or an inference in its sequence (the parameters to set). ``request`` is
        its JSON part as read (None: none), ``json_body`` whether it is JSON or binary+json at all."""
        wanted = read_request(header, request)
        if wanted.control is None and not json_body:
            raise BadRequest("a request in a session is JSON or binary+json: its sequence goes in the parameters")
        if wanted.session is None:
            if wanted.control is None and streamed:
                raise BadRequest("a streamed answer cannot open a session: open it first (NEW_SESSION, or "
                                 '{"requestType": "NEW_SESSION"}), then stream in it')  # fmt: skip
            opened = await self.owner.open_session(triton_name)
            value = f"{opened['id']}; Expires={opened['expires']}".encode()
            answer_headers = [(_SESSION, value), (_NEW_SESSION, value)]
            if wanted.control == "open":
                answer = orjson.dumps({"session_id": opened["id"], "expires": opened["expires"]})
                return SessionStep(opened["id"], None, answer_headers, answer)
            start: dict[str, str | int | bool] = {"sequence_id": opened["sequence_id"], "sequence_start": True}
            return SessionStep(opened["id"], start, answer_headers, opened=True)
        session = wanted.session
        closed = [(_CLOSED_SESSION, session.encode())]
        if wanted.control == "close":
            await self.owner.close_session(session, triton_name)
            return SessionStep(session, None, closed, orjson.dumps({"closed_session_id": session}))
        used = await self.owner.use_session(session, triton_name)
        parameters: dict[str, str | int | bool] = {"sequence_id": used["sequence_id"]}
        if used["start"]:
            parameters["sequence_start"] = True
        if wanted.close:
            parameters["sequence_end"] = True
        return SessionStep(session, parameters, closed if wanted.close else [], closes=wanted.close)

    async def done(self, step: SessionStep, answered: bool) -> None:
        """After the session's inference, tell the owner how it went: a session whose first inference
        failed never began, one whose closing inference was answered is closed, and otherwise the
        sequence has started (when answered) and was used now."""
        if (step.opened and not answered) or (step.closes and answered):
            await self.owner.close_session(step.session, any_model=True)
        elif answered and step.parameters is not None and step.parameters.get("sequence_start"):
            # The sequence started: the owner must know before the caller can send the next request,
            # which another worker may take, or that one would start the sequence again.
            await self.owner.session_answered(step.session, wait=True)
        elif answered:
            await self.owner.session_answered(step.session, wait=False)

    def stream(self, step: SessionStep, responses: AsyncGenerator[dict[str, Any], None]) -> SessionStream:
        """A streamed answer in a session: its responses to iterate, and the clean-up to run once it
        ends (:meth:`SessionStream.close`), also when nothing ever iterated it."""
        return SessionStream(self, step, responses)
