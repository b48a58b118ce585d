"""The HTTP edge at the protocol: uvicorn's httptools protocol with the edge's rules, and a fast path
for the data routes.

The rules hold for every request, and are applied while it is parsed, before a route sees it:

- a URL longer than the header limit is answered 414, headers past it 431, as soon as they pass it
  (nothing unbounded is buffered first);
- a request's headers must arrive within ``SMTRITON_CLIENT_TIMEOUT_S`` of its first byte, its body
  may not pause longer than that, and the whole body must arrive within ``SMTRITON_BODY_TIMEOUT_S`` of
  the headers, however steadily it trickles: 408; a connection that sends nothing for that long is
  closed;
- a request that is not valid HTTP/1.1 is answered 400 only after every complete request before it on
  the connection has its answer (HTTP/1.1 answers in order), then the connection closes.

Each refusal is a JSON error body, like every other error. uvicorn still owns the rest of the
connection: parsing (httptools), keep-alive and its timeout, pipelining, the SIGTERM drain.

The fast path: for ``GET /ping``, ``POST /invocations`` and ``POST /models/<name>/invoke`` the protocol
collects the body as the parser hands it over, without uvicorn's 64 KiB pause/resume steps and
``bytearray`` appends (0.5 ms of front CPU less on a 600 KB image, bench/NOTES.md), calls the routes'
one implementation (:meth:`DataRoutes.reply`) and writes the whole answer in one call. Everything else
(the control plane, unusual paths) goes to the ASGI app, with the route it matched. The fast path
builds uvicorn's request cycle itself, from attributes of its protocol that are not public API, so
pyproject.toml allows only the uvicorn release it was tested with (:data:`TESTED_UVICORN`), and a test
fails when a release moves one of the internals it reads (:data:`UVICORN_INTERNALS`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from smtriton.serve.dataplane.codec import JSON, RequestBody
from smtriton.serve.errors import (
    INTERNAL_ERROR,
    BadRequest,
    ClientGone,
    HeadersTooLarge,
    PayloadTooLarge,
    RequestTimeout,
    ServeError,
    UriTooLong,
    error_body,
)
from smtriton.serve.http.routes import (
    PING_TYPE,
    ROUTE_SCOPE_KEY,
    BodyBuffer,
    DataRoutes,
    Headers,
    Invocation,
    Route,
    route_of,
)

log = logging.getLogger("serve")

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_ONE_WRITE = 64 * 1024  # answers up to this size go out with their head in a single write
# uvicorn releases (major.minor) the fast path was tested with; pyproject.toml allows only these.
TESTED_UVICORN = ("0.54",)
# What the fast path reads or calls of uvicorn's protocol and request cycle (not public API), beside
# ``url``, which uvicorn's own ``on_message_begin`` sets: a test fails when one goes missing.
UVICORN_INTERNALS = {
    HttpToolsProtocol: (
        "parser", "scope", "cycle", "pipeline", "flow", "transport", "server_state", "tasks", "loop",
        "app", "root_path", "limit_concurrency", "expect_100_continue", "logger", "access_logger",
        "access_log", "on_response_complete", "_start_asgi_task", "_unset_keepalive_if_required",
        "send_400_response",
    ),
    RequestResponseCycle: (
        "scope", "transport", "flow", "logger", "access_logger", "access_log", "default_headers",
        "message_event", "waiting_for_100_continue", "keep_alive", "on_response", "disconnected",
        "more_body", "response_started", "response_complete", "send", "receive",
    ),
}  # fmt: skip


class _Refused(Exception):
    """Raised from a parser callback to stop parsing a request that is refused (the reason is kept)."""


class EdgeProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the edge's rules (module docstring)."""

    routes: DataRoutes  # set by :func:`data_protocol`

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = self.routes.plane.settings
        self._limit = settings.max_header_bytes
        self._timeout = settings.client_timeout_s
        self._in_head = False  # between a request's first byte and its last header
        self._header_bytes = 0  # names and values of this request's headers
        self._head_received = 0  # bytes received while in the head (a line httptools still buffers too)
        self._owed = 0  # requests parsed whole and not yet answered
        self._why: ServeError | None = None  # what a parser callback refused
        self._refusal: ServeError | None = None  # decided; written once the answers owed are out
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._body_deadline_s = settings.body_timeout_s
        self._whole_body_timer: asyncio.TimerHandle | None = None  # the whole body's deadline

    # ----- the connection ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer = self.loop.call_later(self._timeout, self._silent_too_long)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        cycle = self.cycle
        super().connection_lost(exc)
        if isinstance(cycle, FastCycle) and not cycle.response_complete:
            cycle.client_left()

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            return  # refused: nothing more is read from this connection
        super().data_received(data)
        if self._in_head and self._refusal is None:
            self._head_received += len(data)
            if self._head_received > 3 * self._limit:  # the URL and the headers at their limits, and more
                self._refuse(HeadersTooLarge(self._limit))

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to what httptools could not parse (or a callback refused)."""
        why, self._why = self._why, None
        self._refuse(why or BadRequest("the request is not valid HTTP/1.1"))

    # ----- parser callbacks --------------------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._header_bytes = self._head_received = 0
        self._cancel_timers()
        self._head_timer = self.loop.call_later(self._timeout, self._head_too_slow)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self._limit:
            self._why = UriTooLong(self._limit)
            raise _Refused

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._header_bytes += len(name) + len(value)
        if self._header_bytes > self._limit:
            self._why = HeadersTooLarge(self._limit)
            raise _Refused

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_timers()
        self._body_timer = self.loop.call_later(self._timeout, self._body_too_slow)
        self._whole_body_timer = self.loop.call_later(self._body_deadline_s, self._body_too_long)
        before = self.cycle
        self._dispatch()
        if self.cycle is not before:
            self._owed += 1

    def _dispatch(self) -> None:
        """Hand the parsed request on: here, to the ASGI app with the route it matched."""
        path = _plain_path(self.url)
        if path is not None:
            _mark(self.scope, route_of(self.parser.get_method(), path))
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        super().on_body(body)
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = self.loop.call_later(self._timeout, self._body_too_slow)

    def on_message_complete(self) -> None:
        for timer in (self._body_timer, self._whole_body_timer):
            if timer is not None:
                timer.cancel()
        self._body_timer = self._whole_body_timer = None
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self._owed -= 1
        queued = len(self.pipeline)
        super().on_response_complete()
        if self._refusal is not None:
            self.flow.pause_reading()
            if len(self.pipeline) == queued and self._owed <= 0:  # nothing was started: all answered
                self._write_refusal()

    def awaiting_request(self) -> bool:
        """Whether a request is on its way on this connection: accepted and nothing parsed yet, or a
        request's head arriving. Closing such a connection would drop a request the client sent."""
        return (self.cycle is None or self._in_head) and not self.transport.is_closing()

    # ----- refusals ----------------------------------------------------------------------------
    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer, self._whole_body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = self._whole_body_timer = None

    def _silent_too_long(self) -> None:
        if not self._in_head and self.cycle is None and not self.transport.is_closing():
            self.transport.close()  # connected, never sent a byte

    def _head_too_slow(self) -> None:
        if self._in_head:
            self._refuse(RequestTimeout(f"request headers not received within {self._timeout:g} s"))

    def _body_too_slow(self) -> None:
        cycle = self.cycle
        if cycle is None or not cycle.more_body or cycle.response_complete:
            return
        if self.flow.read_paused:  # waiting for earlier answers or for the app to read: not the client's pause
            self._body_timer = self.loop.call_later(self._timeout, self._body_too_slow)
            return
        self._refuse(RequestTimeout(f"request body paused for more than {self._timeout:g} s"))

    def _body_too_long(self) -> None:
        """The whole body's deadline: a body that keeps trickling never trips the pause's timer."""
        cycle = self.cycle
        if cycle is None or not cycle.more_body or cycle.response_complete:
            return
        if self.flow.read_paused:  # held back by the server, not the client: look again a pause later
            self._whole_body_timer = self.loop.call_later(self._timeout, self._body_too_long)
            return
        self._refuse(RequestTimeout(f"request body not received within {self._body_deadline_s:g} s"))

    def _refuse(self, error: ServeError) -> None:
        """Answer ``error`` and close, once every complete request before the refused one has its answer.
        A refusal inside a body concerns the request that body belongs to: it is not answered."""
        if self._refusal is not None:
            return
        self._refusal = error
        self._cancel_timers()
        self.flow.pause_reading()
        cycle = self.cycle
        if not self._in_head and cycle is not None and cycle.more_body and not cycle.response_complete:
            self._owed -= 1  # the refused request itself: its cycle never answers
            queued = [entry for entry in self.pipeline if entry[0] is cycle]
            for entry in queued:
                self.pipeline.remove(entry)
            if not queued:  # it is the one running now: nothing before it is left to answer
                self._owed = 0
        log.info("refused a request: %d %s", error.status, error.message)
        if self._owed <= 0:
            self._write_refusal()

    def _write_refusal(self) -> None:
        error = self._refusal
        if error is None or self.transport.is_closing():
            return
        body = error_body(error.message)
        head = [STATUS_LINE[error.status]]
        for name, value in self.server_state.default_headers:
            head += name, b": ", value, b"\r\n"
        head += b"content-type: ", JSON.encode(), b"\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        self.transport.write(b"".join(head) + body)
        self.transport.close()


class FastCycle(RequestResponseCycle):
    """One data-route request: its body held once as the parser gives it, then one answer. If the
    client goes away before the answer, the request is cancelled, the call to Triton with it."""

    def __init__(self, *args: Any, routes: DataRoutes, route: Route, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.routes = routes
        self.route = route
        self.received = BodyBuffer()
        self.too_large = False
        self.task: asyncio.Task[None] | None = None

    def add_body(self, chunk: bytes) -> None:
        """Called by the protocol for each piece of the body; past the limit the rest is dropped."""
        if self.too_large:
            return
        self.received.add(chunk)
        if self.received.size > self.routes.limit:
            self.too_large = True
            self.received.take()
            self.message_event.set()  # answer 413 now, not after the whole body

    async def read_body(self) -> RequestBody:
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(_CONTINUE)
            self.waiting_for_100_continue = False
        if self.more_body and not self.too_large and not self.disconnected:
            self.flow.resume_reading()
            await self.message_event.wait()
        self.message_event.clear()
        if self.too_large:
            raise PayloadTooLarge(self.routes.limit)
        if self.disconnected:
            raise ClientGone()
        return self.received.take()

    def client_left(self) -> None:
        """The connection was lost before the answer: stop the request (and its call to Triton)."""
        if self.task is not None and not self.task.done():
            self.task.cancel()

    async def run_asgi(self, app: Any) -> None:
        """Serve the request (the name is uvicorn's: its protocol starts every cycle through it)."""
        self.task = asyncio.current_task()
        try:
            routes, (kind, name) = self.routes, self.route
            if kind == "ping":
                await self.answer(routes.ping_status(), PING_TYPE, b"", [])
                return
            request = Invocation(self.scope["headers"])
            status, content_type, body, headers, stream = await routes.reply(
                self.scope["path"], request, self.read_body, name
            )
            if stream is not None:
                await stream.send(self.scope, self.receive, self.send)  # type: ignore[arg-type]
            else:
                await self.answer(status, content_type.encode(), body, headers)
        except asyncio.CancelledError:
            if not self.disconnected:  # not the client leaving: the server is cancelling its tasks
                raise
        except BaseException as exc:
            self.logger.error("Exception in the data route", exc_info=exc)
            if not self.response_started:
                self.keep_alive = False
                await self.answer(500, JSON.encode(), error_body(INTERNAL_ERROR), [])
            else:
                self.transport.close()
        finally:
            self.on_response = lambda: None

    async def answer(self, status: int, content_type: bytes, body: bytes, headers: Headers) -> None:
        """The whole answer, head and body, with the route's ``headers``, in one write (two for a large body)."""
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        self.response_started = True
        self.waiting_for_100_continue = False
        head = [STATUS_LINE[status]]
        for name, value in self.default_headers:
            head += name, b": ", value, b"\r\n"
        head += b"content-type: ", content_type, b"\r\ncontent-length: %d\r\n" % len(body)
        for name, value in headers:
            head += name, b": ", value, b"\r\n"
        if not self.keep_alive:
            head.append(b"connection: close\r\n")
        head.append(b"\r\n")
        if len(body) <= _ONE_WRITE:
            head.append(body)
            self.transport.write(b"".join(head))
        else:
            self.transport.write(b"".join(head))
            self.transport.write(body)
        if self.access_log:
            scope = self.scope
            self.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(scope),
                scope["method"],
                get_path_with_query_string(scope),
                scope["http_version"],
                status,
            )
        self.response_complete = True
        self.message_event.set()
        if not self.keep_alive:
            self.transport.close()
        self.on_response()


class DataProtocol(EdgeProtocol):
    """The edge's protocol, serving the data routes through :class:`FastCycle`."""

    def _dispatch(self) -> None:
        parser = self.parser
        method = parser.get_method()
        path, _, query = self.url.partition(b"?")
        text = _plain_path(self.url)
        route = route_of(method, text) if text is not None else ("other", None)
        fast = route[0] in ("ping", "invocations", "invoke")
        if not fast or parser.should_upgrade() or self.limit_concurrency is not None:
            if text is not None:
                _mark(self.scope, route)
            HttpToolsProtocol.on_headers_complete(self)
            return
        assert text is not None
        http_version = parser.get_http_version()
        scope = self.scope
        scope["method"] = method.decode("ascii")
        if http_version != "1.1":
            scope["http_version"] = http_version
        scope["path"] = self.root_path + text
        scope["raw_path"] = self.root_path.encode("ascii") + path
        scope["query_string"] = query
        existing = self.cycle
        self.cycle = FastCycle(
            scope=scope,
            transport=self.transport,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=self.expect_100_continue,
            keep_alive=http_version != "1.0" and parser.should_keep_alive(),
            on_response=self.on_response_complete,
            routes=self.routes,
            route=route,
        )
        if existing is None or existing.response_complete:
            self._start_asgi_task(self.cycle, self.app)  # uvicorn's own start (its context handling too)
        else:  # pipelined: waits for the answers before it, as uvicorn queues its own cycles
            self.flow.pause_reading()
            self.pipeline.appendleft((self.cycle, self.app))

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if type(cycle) is not FastCycle:
            super().on_body(body)
            return
        if not cycle.response_complete:
            cycle.add_body(body)
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = self.loop.call_later(self._timeout, self._body_too_slow)

    def on_message_complete(self) -> None:
        cycle = self.cycle
        if type(cycle) is not FastCycle:
            super().on_message_complete()
            return
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        if not cycle.response_complete:
            cycle.more_body = False
            cycle.message_event.set()


def _mark(scope: Any, route: Route) -> None:
    """Leave the route matched here to the ASGI app (routes are matched once)."""
    scope.setdefault("extensions", {})[ROUTE_SCOPE_KEY] = route


def _plain_path(url: bytes) -> str | None:
    """The path of a request's URL when it is plain ASCII without escapes (None: leave it to uvicorn)."""
    path = url.partition(b"?")[0]
    return path.decode("ascii") if path.isascii() and b"%" not in path else None


def data_protocol(routes: DataRoutes) -> type[DataProtocol]:
    """The protocol uvicorn instantiates per connection, bound to ``routes``."""
    return type("BoundDataProtocol", (DataProtocol,), {"routes": routes})
