"""The data routes: `GET /ping`, `POST /invocations`, `POST /models/<name>/invoke`.

:meth:`DataRoutes.reply` is the only implementation of the inference routes. The HTTP protocol's
fast path (`smtriton.serve.http.protocol`) calls it directly; :class:`DataRoutes` is also a raw ASGI app
that serves these routes for what that path leaves to ASGI, skipping FastAPI/Starlette's routing,
dependency solving and Request/Response objects (~21 % of the front's CPU per request, bench/NOTES.md).
Every other request (the multi-model control plane, execution parameters, unknown paths) goes on to
the control app.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from smtriton.serve.dataplane import codec, sessions
from smtriton.serve.dataplane.plane import DataPlane
from smtriton.serve.errors import (
    INTERNAL_ERROR,
    BadRequest,
    ModelNotFound,
    PayloadTooLarge,
    ServeError,
    error_body,
)
from smtriton.serve.http import edge
from smtriton.serve.triton.client import UpstreamResponse

log = logging.getLogger("serve.access")

PING_TYPE = b"text/plain"  # /ping answers an empty body of this type
_PLAIN_EMPTY = [(b"content-type", PING_TYPE), (b"content-length", b"0")]
_BODY_END: Message = {"type": "http.response.body", "body": b""}
ATTRIBUTES_HEADER = edge.CUSTOM_ATTRIBUTES_HEADER.lower().encode()
_TARGET = edge.TARGET_MODEL_HEADER.lower().encode()
_INFERENCE_ID = edge.INFERENCE_ID_HEADER.lower().encode()
_SESSION = sessions.SESSION_HEADER.lower().encode()
_MODELS = "/models/"
EMPTY_BODY = "the request body is empty: send the model's inputs as an inference request (JSON, or binary+json)"
PING = "/ping"
INVOCATIONS = "/invocations"
CLIENT_CLOSED = 499  # the status counted for a request whose client left before its answer (nginx's)


class Streamed:
    """A streamed answer: its chunks, and the clean-up that runs once however the stream ends — also
    when nothing ever iterates the chunks (the client left before the first one), so that the Triton
    stream is closed and an unload waiting for the invoke is not kept waiting."""

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        media_type: str,
        cleanup: Callable[[], Awaitable[None]],
        headers: Headers | None = None,
    ) -> None:
        self.media_type = media_type
        self.headers = headers or []
        self._chunks = chunks
        self._cleanup = cleanup
        self._closed = False

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._cleanup()

    async def send(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Stream the answer through ASGI's ``send`` (chunked); clean up whatever happens."""
        headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in self.headers}
        try:
            await StreamingResponse(self._chunks, media_type=self.media_type, headers=headers)(scope, receive, send)
        finally:
            await self.close()


# Response headers an answer adds: the custom attributes a model set, a session's.
Headers = list[tuple[bytes, bytes]]
# An inference answer: status, content type, body, headers, or a stream instead.
Reply = tuple[int, str, bytes, Headers, Streamed | None]
# Triton's answer as the route gives it to the caller: (status, content type, body).
AnswerOf = Callable[[UpstreamResponse], Awaitable[edge.Answer]]
_INVOKE = "/invoke"


def log_failure(method: str, path: str, status: int, inference_id: str | None) -> None:
    """One line per failed request, with SageMaker's inference id; never the body."""
    log.info("%s %s answered %d", method, path, status, extra={"status": status, "inference_id": inference_id})


def check_declared_length(content_length: bytes | None, limit: int) -> None:
    """Refuse a body whose Content-Length already says it passes ``limit`` (413), before reading it."""
    if content_length is not None:
        if not content_length.isdigit():
            raise BadRequest("invalid Content-Length")
        if int(content_length) > limit:
            raise PayloadTooLarge(limit)


class BodyBuffer:
    """A request body as it arrives, held once. Most bodies arrive in one piece, kept as it came; a body
    in several pieces goes into one buffer that grows in place (the allocator moves a large buffer's
    pages rather than copying them), never into a list of pieces joined at the end, which would hold a
    1 GiB body twice. What it returns is ``bytes`` or that ``bytearray``: both are what the rest of the
    path reads (slices, parsers, the upstream client)."""

    __slots__ = ("_first", "_grown", "size")

    def __init__(self) -> None:
        self._first = b""
        self._grown: bytearray | None = None
        self.size = 0

    def add(self, piece: bytes) -> None:
        self.size += len(piece)
        if self._grown is not None:
            self._grown += piece
        elif not self._first:
            self._first = piece
        elif piece:
            self._grown = bytearray(self._first)
            self._grown += piece
            self._first = b""

    def take(self) -> codec.RequestBody:
        """The body so far (and the buffer emptied)."""
        body: codec.RequestBody = self._grown if self._grown is not None else self._first
        self._first, self._grown, self.size = b"", None, 0
        return body


async def read_limited(receive: Receive, content_length: bytes | None, limit: int) -> codec.RequestBody:
    """The whole request body, refused with 413 as soon as it is known to pass ``limit``: from
    Content-Length before reading anything, else while a chunked body streams in."""
    check_declared_length(content_length, limit)
    body = BodyBuffer()
    more = True
    while more:
        message = await receive()
        body.add(message.get("body", b""))
        if body.size > limit:
            raise PayloadTooLarge(limit)
        more = bool(message.get("more_body"))
    return body.take()


class Invocation:
    """What the data routes read from one request's headers."""

    def __init__(self, headers: Iterable[tuple[bytes, bytes]]) -> None:
        self.content_type = self.content_length = self.encoding = self.attributes = None
        self.inference_id = self.accept = self.session = None
        target: str | None = None
        for name, value in headers:
            if name == b"content-type":
                self.content_type = value.decode("latin-1")
            elif name == b"content-length":
                self.content_length = value
            elif name == b"content-encoding":
                self.encoding = value.decode("latin-1")
            elif name == ATTRIBUTES_HEADER:
                self.attributes = value.decode("latin-1")
            elif name == _INFERENCE_ID:
                self.inference_id = value.decode("latin-1")
            elif name == b"accept":
                self.accept = value.decode("latin-1")
            elif name == _TARGET:
                target = value.decode("latin-1")
            elif name == _SESSION:
                self.session = value.decode("latin-1")
        self.target_model = target

    content_type: str | None
    content_length: bytes | None
    encoding: str | None
    attributes: str | None
    inference_id: str | None
    accept: str | None
    session: str | None
    target_model: str | None


def attributes_value(attributes: str) -> bytes:
    """The custom attributes header's value as it goes on the wire (latin-1, as HTTP headers are)."""
    return attributes.encode("latin-1", errors="replace")


def invoke_name(path: str) -> str | None:
    """The model name in a multi-model invoke path, ``/models/<name>/invoke``; None for any other path."""
    if path.startswith(_MODELS) and path.endswith(_INVOKE):
        name = path[len(_MODELS) : -len(_INVOKE)]
        if name and "/" not in name:
            return name
    return None


# A request's route: "ping", "invocations", "invoke" (with the MME model's name), "wrong-method" (a data
# route's path with another method) or "other" (the control app's); matched once per request.
Route = tuple[str, str | None]
# Where the HTTP protocol leaves the route it matched, for the ASGI app (scope["extensions"]).
ROUTE_SCOPE_KEY = "smtriton.route"


def route_of(method: bytes | str, path: str) -> Route:
    """Which of the data routes a request is for, if any."""
    get, post = method in (b"GET", "GET"), method in (b"POST", "POST")
    if path == PING:
        return ("ping", None) if get else ("wrong-method", None)
    if path == INVOCATIONS:
        return ("invocations", None) if post else ("wrong-method", None)
    if post and (name := invoke_name(path)) is not None:
        return "invoke", name
    return "other", None


class DataRoutes:
    """The data routes' one implementation (:meth:`reply`), and an ASGI app serving them that passes
    every other request to ``control``. The HTTP server's own fast path (`smtriton.serve.http.protocol`)
    calls :meth:`reply` too; this ASGI app serves what that path leaves to it."""

    def __init__(self, control: ASGIApp, plane: DataPlane) -> None:
        self.control = control
        self.plane = plane
        settings = plane.settings
        self.limit = settings.max_payload_bytes
        self.inference_type = settings.inference_type

    def ping_status(self) -> int:
        return 200 if self.plane.healthy else 503

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.control(scope, receive, send)
            return
        route: Route | None = scope.get("extensions", {}).get(ROUTE_SCOPE_KEY)
        if route is None:  # the protocol could not match it (an escaped path): match the decoded one
            route = route_of(scope["method"], scope["path"])
        kind, name = route
        if kind == "ping":
            await send({"type": "http.response.start", "status": self.ping_status(), "headers": _PLAIN_EMPTY})
            await send(_BODY_END)
        elif kind == "invocations" or kind == "invoke":
            await self._serve(scope, receive, send, name)
        elif kind == "wrong-method":
            await _answer(send, 405, error_body("Method Not Allowed"))
        else:
            await self.control(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, mme_name: str | None) -> None:
        request = Invocation(scope["headers"])

        def body() -> Awaitable[codec.RequestBody]:
            return read_limited(receive, None, self.limit)

        status, response_type, payload, headers, stream = await self.reply(scope["path"], request, body, mme_name)
        if stream is not None:
            await stream.send(scope, receive, send)
        else:
            await _answer(send, status, payload, response_type, headers)

    async def reply(
        self, path: str, request: Invocation, body: Callable[[], Awaitable[codec.RequestBody]], mme_name: str | None
    ) -> Reply:
        """One inference request: SME ``/invocations`` when ``mme_name`` is None, else an MME invoke.
        ``body`` reads the request body, refusing one that passes the payload limit while it arrives;
        errors become their JSON answers here, and failures are logged and counted."""
        plane = self.plane
        route = "invocations" if mme_name is None else "invoke"
        metrics = plane.metrics
        started = metrics.begin(route)
        model = mme_name or plane.default_model or ""
        status = 500
        try:
            if mme_name is None:
                model = plane.sme_model()
            elif not plane.multi_model:
                raise ModelNotFound(mme_name)
            check_declared_length(request.content_length, self.limit)
            payload = await body()
            if request.encoding is not None:
                payload = codec.decompress(payload, request.encoding, self.limit)
            if mme_name is None:
                answer = await self._sme(model, payload, request)
            else:
                answer = await self._mme(model, payload, request)
            status = answer[0]
            if status == 400 and (not payload or payload.isspace()):  # Triton says nothing of an empty body
                answer = 400, codec.JSON, error_body(EMPTY_BODY), [], None
        except ServeError as exc:
            status = exc.status
            answer = status, codec.JSON, error_body(exc.message), [], None
        except asyncio.CancelledError:  # the client went away: its request upstream was cancelled
            status = CLIENT_CLOSED
            raise
        except Exception:  # a bug, not the client's fault: logged with its traceback, answered in JSON
            log.exception("POST %s failed inside serve", path)
            answer = 500, codec.JSON, error_body(INTERNAL_ERROR), [], None
        finally:
            metrics.end(route, model, status, started)
        if status != 200:
            log_failure("POST", path, status, request.inference_id)
        return answer

    async def _sme(self, model: str, body: codec.RequestBody, request: Invocation) -> Reply:
        plane = self.plane
        if self.inference_type == "infer":

            async def answer(upstream: UpstreamResponse) -> edge.Answer:
                return edge.to_sagemaker(upstream)

            return await self._infer(model, body, request, plane.decoupled, answer)
        if request.session is not None:
            raise BadRequest("stateful sessions need SAGEMAKER_TRITON_INFERENCE_TYPE=infer")
        if self.inference_type == "generate":
            return (*edge.to_sagemaker(await plane.generate(model, body)), [], None)
        return await self._generate_stream(model, body)

    async def _infer(
        self,
        triton_name: str,
        body: codec.RequestBody,
        request: Invocation,
        decoupled: bool,
        answer: AnswerOf,
        on_done: Callable[[], None] | None = None,
    ) -> Reply:
        """An inference (streamed for a decoupled model), in its session if the request names one."""
        plane = self.plane
        step = None
        if request.session is not None:
            step = await plane.session_step(triton_name, request.session, body, request.content_type, decoupled)
            if step.parameters is None:  # opened or closed the session: nothing to infer
                return 200, codec.JSON, step.body, step.headers, None
        parameters = step.parameters if step is not None else None
        if decoupled:
            responses = plane.stream(triton_name, body, request.content_type, request.attributes, parameters)
            media_type = edge.stream_media_type(request.accept)
            if step is None:
                return 200, "", b"", [], _streamed(responses, media_type, on_done)
            session = plane.stream_in_session(step, responses)
            return 200, "", b"", [], _streamed(session.responses, media_type, on_done, step.headers, session.close)
        try:
            upstream = await plane.infer(triton_name, body, request.content_type, request.attributes, parameters)
        except BaseException:
            if step is not None:
                await plane.session_done(step, False)
            raise
        status, content_type, payload = await answer(upstream)
        headers = _attributes(upstream)
        if step is not None:
            await plane.session_done(step, status == 200)
            if status == 200:
                headers += step.headers
        return status, content_type, payload, headers, None

    async def _generate_stream(self, model: str, body: codec.RequestBody) -> Reply:
        """Triton's server-sent events, passed on as they arrive (chunked); a client that goes away
        closes the upstream request too."""
        context = self.plane.generate_stream(model, body)
        failure, events = await context.__aenter__()

        async def close_upstream() -> None:
            await context.__aexit__(None, None, None)

        if events is None:
            await close_upstream()
            assert failure is not None
            return (*edge.to_sagemaker(failure), [], None)
        return 200, "", b"", [], Streamed(events, edge.SSE, close_upstream)

    async def _mme(self, name: str, body: codec.RequestBody, request: Invocation) -> Reply:
        plane = self.plane
        invoke = plane.begin_invoke(name, request.target_model)
        record = invoke.model.record
        ended = False

        def end() -> None:  # the invoke is no longer in flight: once, streamed or not
            nonlocal ended
            if not ended:
                ended = True
                plane.end_invoke(invoke)

        async def answer(upstream: UpstreamResponse) -> edge.Answer:
            end()
            oom = edge.may_be_out_of_memory(upstream) and await plane.invoke_out_of_memory(
                invoke, edge.failure_message(upstream), upstream.status
            )
            return edge.to_mme_response(record, upstream, oom)

        try:
            reply = await self._infer(record.triton_name, body, request, record.decoupled, answer, end)
        except BaseException:
            end()
            raise
        if reply[4] is None:
            end()
        return reply


def _attributes(upstream: UpstreamResponse) -> Headers:
    """The custom attributes header of an answer, when the model set them."""
    value = edge.custom_attributes(upstream)
    return [] if value is None else [(ATTRIBUTES_HEADER, attributes_value(value))]


async def _answer(
    send: Send, status: int, payload: bytes, content_type: str = codec.JSON, extra: Headers | None = None
) -> None:
    """A whole answer in one body message, with the ``extra`` headers the route added."""
    headers = [(b"content-type", content_type.encode()), (b"content-length", b"%d" % len(payload)), *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def _streamed(
    responses: AsyncGenerator[dict[str, Any], None],
    media_type: str,
    on_done: Callable[[], None] | None = None,
    headers: Headers | None = None,
    close_responses: Callable[[], Awaitable[None]] | None = None,
) -> Streamed:
    """A decoupled model's answer, streamed; when it ends, however it ends, the Triton stream is
    closed (cancelled, if it still runs) and ``on_done`` runs. ``close_responses`` closes ``responses``
    (by default their ``aclose``; a session's stream also tells the owner how it ended)."""
    chunks = edge.framed(responses, media_type)
    end = responses.aclose if close_responses is None else close_responses

    async def close() -> None:
        try:
            try:
                await chunks.aclose()
            finally:
                await end()
        finally:
            if on_done is not None:
                on_done()

    return Streamed(chunks, media_type, close, headers)
