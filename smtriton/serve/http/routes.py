"""The data routes' HTTP side: which route a request is for, the request the data plane takes from its
head, and the ASGI app serving them for whatever the protocol's fast path leaves to ASGI.

The routes are `GET /ping`, `POST /invocations` and `POST /models/<name>/invoke`; each makes one call
into the data plane (:meth:`DataPlane.invoke <smtriton.serve.dataplane.plane.DataPlane.invoke>`, or its
``ping_status``). The protocol (`smtriton.serve.http.protocol`) matches each request's route once, with
:func:`route_of`, and leaves it in the ASGI scope; the fast path (`smtriton.serve.http.fastpath`) serves
the data routes at the protocol, and :class:`DataRoutes` serves them through ASGI otherwise (with no
FastAPI routing, dependency solving or Request objects: ~21 % of the front's CPU per request,
bench/NOTES.md). Every other request (the multi-model control plane, execution parameters, unknown
paths) goes on to the control app.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.responses import StreamingResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from smtriton.serve import headers
from smtriton.serve.dataplane.plane import DataPlane
from smtriton.serve.dataplane.request import Reply, Request, Streamed
from smtriton.serve.errors import error_body
from smtriton.serve.http.body import BodyReader

PING_TYPE = b"text/plain"  # /ping answers an empty body of this type
_PLAIN_EMPTY = [(b"content-type", PING_TYPE), (b"content-length", b"0")]
_BODY_END: Message = {"type": "http.response.body", "body": b""}
_ATTRIBUTES = headers.wire(headers.CUSTOM_ATTRIBUTES)
_TARGET = headers.wire(headers.TARGET_MODEL)
_INFERENCE_ID = headers.wire(headers.INFERENCE_ID)
_SESSION = headers.wire(headers.SESSION)
_MODELS = "/models/"
_INVOKE = "/invoke"
PING = "/ping"
INVOCATIONS = "/invocations"

# A request's route: "ping", "invocations", "invoke" (with the MME model's name), "wrong-method" (a data
# route's path with another method) or "other" (the control app's); matched once per request.
Route = tuple[str, str | None]
# Where the HTTP protocol leaves the route it matched, for the ASGI app (scope["extensions"]).
ROUTE_SCOPE_KEY = "smtriton.route"
DATA_ROUTES = frozenset({"ping", "invocations", "invoke"})


def invoke_name(path: str) -> str | None:
    """The model name in a multi-model invoke path, ``/models/<name>/invoke``; None for any other path."""
    if path.startswith(_MODELS) and path.endswith(_INVOKE):
        name = path[len(_MODELS) : -len(_INVOKE)]
        if name and "/" not in name:
            return name
    return None


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


def request_of(head: Iterable[tuple[bytes, bytes]], model: str | None, body: BodyReader) -> Request:
    """The data plane's request for an inference route, from the request's headers (lower-case names, as
    the HTTP parser hands them over); its body is read through ``body``."""
    request = Request(model, body.read)
    for name, value in head:
        if name == b"content-type":
            request.content_type = value.decode("latin-1")
        elif name == b"content-length":
            body.declared = value
        elif name == b"content-encoding":
            request.encoding = value.decode("latin-1")
        elif name == _ATTRIBUTES:
            request.custom_attributes = value.decode("latin-1")
        elif name == _INFERENCE_ID:
            request.inference_id = value.decode("latin-1")
        elif name == b"accept":
            request.accept = value.decode("latin-1")
        elif name == _TARGET:
            request.target_model = value.decode("latin-1")
        elif name == _SESSION:
            request.session = value.decode("latin-1")
    return request


async def send_stream(stream: Streamed, scope: Scope, receive: Receive, send: Send) -> None:
    """A streamed answer through ASGI's ``send`` (chunked); its clean-up runs whatever happens."""
    answer_headers = {name.decode("latin-1"): value.decode("latin-1") for name, value in stream.headers}
    try:
        await StreamingResponse(stream.chunks, media_type=stream.media_type, headers=answer_headers)(
            scope, receive, send
        )
    finally:
        await stream.close()


async def send_reply(reply: Reply, scope: Scope, receive: Receive, send: Send) -> None:
    """An answer through ASGI: a whole one in one body message, or a stream."""
    if reply.stream is not None:
        await send_stream(reply.stream, scope, receive, send)
        return
    head = [
        (b"content-type", reply.content_type.encode()),
        (b"content-length", b"%d" % len(reply.body)),
        *reply.headers,
    ]
    await send({"type": "http.response.start", "status": reply.status, "headers": head})
    await send({"type": "http.response.body", "body": reply.body})


class DataRoutes:
    """The data routes as an ASGI app, passing every other request to ``control``: what the fast path
    leaves to ASGI, and the whole app for in-process tests."""

    def __init__(self, control: ASGIApp, plane: DataPlane) -> None:
        self.control = control
        self.plane = plane
        self.limit = plane.settings.max_payload_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.control(scope, receive, send)
            return
        route: Route | None = scope.get("extensions", {}).get(ROUTE_SCOPE_KEY)
        if route is None:  # not through serve's protocol (an ASGI test client): matched here, once
            route = route_of(scope["method"], scope["path"])
        kind, name = route
        if kind == "ping":
            await send({"type": "http.response.start", "status": self.plane.ping_status(), "headers": _PLAIN_EMPTY})
            await send(_BODY_END)
        elif kind in ("invocations", "invoke"):
            request = request_of(scope["headers"], name, BodyReader(self.limit, pull=receive))
            await send_reply(await self.plane.invoke(request), scope, receive, send)
        elif kind == "wrong-method":
            await send_reply(Reply(405, "application/json", error_body("Method Not Allowed")), scope, receive, send)
        else:
            await self.control(scope, receive, send)
