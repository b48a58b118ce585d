"""The data routes served at the protocol: the fast path.

For ``GET /ping``, ``POST /invocations`` and ``POST /models/<name>/invoke`` the protocol collects the
body as the parser hands it over (into the request's :class:`~smtriton.serve.http.body.BodyReader`),
without uvicorn's 64 KiB pause/resume steps and ``bytearray`` appends (0.5 ms of front CPU less on a
600 KB image, bench/NOTES.md), makes the route's one call into the data plane and writes the whole
answer in one call. Everything else (the control plane, escaped paths) goes to the ASGI app, with the
route the protocol matched. The fast path builds uvicorn's request cycle itself, from attributes of its
protocol that are not public API, so pyproject.toml allows only the uvicorn release it was tested with
(:data:`TESTED_UVICORN`), and a test fails when a release moves one of the internals it reads
(:data:`UVICORN_INTERNALS`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from smtriton.serve.dataplane.plane import DataPlane
from smtriton.serve.dataplane.request import Headers
from smtriton.serve.errors import INTERNAL_ERROR, error_body
from smtriton.serve.http.body import BodyReader
from smtriton.serve.http.protocol import EdgeProtocol
from smtriton.serve.http.routes import DATA_ROUTES, PING_TYPE, Route, request_of, send_stream

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_ONE_WRITE = 64 * 1024  # answers up to this size go out with their head in a single write
_JSON = b"application/json"

# uvicorn releases (major.minor) the fast path was tested with; pyproject.toml allows only these.
TESTED_UVICORN = ("0.54",)
# What the fast path and the edge protocol read or call of uvicorn's protocol and request cycle (not
# public API), beside ``url``, which uvicorn's own ``on_message_begin`` sets: a test fails when one goes
# missing.
UVICORN_INTERNALS = {
    HttpToolsProtocol: (
        "parser", "scope", "cycle", "pipeline", "flow", "transport", "server_state", "tasks", "loop",
        "app", "root_path", "limit_concurrency", "expect_100_continue", "logger", "access_logger",
        "access_log", "on_response_complete", "_start_asgi_task", "_unset_keepalive_if_required",
        "send_400_response", "timeout_keep_alive", "timeout_keep_alive_task", "timeout_keep_alive_handler",
    ),
    RequestResponseCycle: (
        "scope", "transport", "flow", "logger", "access_logger", "access_log", "default_headers",
        "message_event", "waiting_for_100_continue", "keep_alive", "on_response", "disconnected",
        "more_body", "response_started", "response_complete", "send", "receive",
    ),
}  # fmt: skip


class FastCycle(RequestResponseCycle):
    """One data-route request: its body held once as the parser gives it, then one answer. If the
    client goes away before the answer, the request is cancelled, the call to Triton with it."""

    def __init__(
        self, *args: Any, plane: DataPlane, route: Route, loop: asyncio.AbstractEventLoop, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.plane = plane
        self.route = route
        self.loop = loop  # the protocol's, named so that finding the current task asks no system call
        self.reader = BodyReader(plane.settings.max_payload_bytes, before_wait=self._ready_for_body)
        self.task: asyncio.Task[None] | None = None

    def _ready_for_body(self) -> None:
        """The route reads the body: a client that asked is told to send it, and reading goes on."""
        if self.waiting_for_100_continue and not self.transport.is_closing():
            self.transport.write(_CONTINUE)
            self.waiting_for_100_continue = False
        self.flow.resume_reading()

    def client_left(self) -> None:
        """The connection was lost before the answer: stop the request (and its call to Triton)."""
        self.reader.lost()
        if self.task is not None and not self.task.done():
            self.task.cancel()

    async def run_asgi(self, app: Any) -> None:
        """Serve the request (the name is uvicorn's: its protocol starts every cycle through it)."""
        self.task = asyncio.current_task(self.loop)
        try:
            kind, name = self.route
            if kind == "ping":
                await self.answer(self.plane.ping_status(), PING_TYPE, b"", [])
                return
            reply = await self.plane.invoke(request_of(self.scope["headers"], name, self.reader))
            if reply.stream is not None:
                await send_stream(reply.stream, self.scope, self.receive, self.send)  # type: ignore[arg-type]
            else:
                await self.answer(reply.status, reply.content_type.encode(), reply.body, reply.headers)
        except asyncio.CancelledError:
            if not self.disconnected:  # not the client leaving: the server is cancelling its tasks
                raise
        except BaseException as exc:
            self.logger.error("Exception in the data route", exc_info=exc)
            if not self.response_started:
                self.keep_alive = False
                await self.answer(500, _JSON, error_body(INTERNAL_ERROR), [])
            else:
                self.transport.close()
        finally:
            self.on_response = lambda: None
            self.reader.answered()

    async def answer(self, status: int, content_type: bytes, body: bytes | bytearray, headers: Headers) -> None:
        """The whole answer, head and body, with the route's ``headers``, in one write (two for a large body)."""
        if self.flow.write_paused and not self.disconnected:
            await self.flow.drain()
        if self.disconnected:
            return
        self.response_started = True
        self.waiting_for_100_continue = False
        head: list[bytes | bytearray] = [STATUS_LINE[status]]
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
    """The front's protocol, serving the data routes through :class:`FastCycle`."""

    plane: DataPlane  # set by :func:`data_protocol`

    def connection_lost(self, exc: Exception | None) -> None:
        cycle = self.cycle
        super().connection_lost(exc)
        if type(cycle) is FastCycle and not cycle.response_complete:
            cycle.client_left()

    def _dispatch(self, route: Route | None) -> None:
        parser = self.parser
        path, _, query = self.url.partition(b"?")
        plain = path.isascii() and b"%" not in path
        if (
            route is None
            or route[0] not in DATA_ROUTES
            or not plain
            or parser.should_upgrade()
            or self.limit_concurrency is not None
        ):
            super()._dispatch(route)
            return
        http_version = parser.get_http_version()
        scope = self.scope
        scope["method"] = parser.get_method().decode("ascii")
        if http_version != "1.1":
            scope["http_version"] = http_version
        scope["path"] = self.root_path + path.decode("ascii")
        scope["raw_path"] = self.root_path.encode("ascii") + path
        scope["query_string"] = query
        existing = self.cycle
        self.cycle = FastCycle(
            scope=scope,
            transport=self._answers,
            flow=self.flow,
            logger=self.logger,
            access_logger=self.access_logger,
            access_log=self.access_log,
            default_headers=self.server_state.default_headers,
            message_event=asyncio.Event(),
            expect_100_continue=self.expect_100_continue,
            keep_alive=http_version != "1.0" and parser.should_keep_alive(),
            on_response=self.on_response_complete,
            plane=self.plane,
            route=route,
            loop=self.loop,
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
            cycle.reader.feed(body)
        self._body_arrived(body)

    def on_message_complete(self) -> None:
        cycle = self.cycle
        if type(cycle) is not FastCycle:
            super().on_message_complete()
            return
        self._body_done()
        if not cycle.response_complete:
            cycle.more_body = False
            cycle.message_event.set()
            cycle.reader.finish()


def data_protocol(plane: DataPlane) -> type[DataProtocol]:
    """The protocol uvicorn instantiates per connection, bound to ``plane``."""
    return type("BoundDataProtocol", (DataProtocol,), {"plane": plane, "settings": plane.settings})
