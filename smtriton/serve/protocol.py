"""uvicorn's HTTP protocol with a fast path for the data routes: no ASGI messages on the hot path.

uvicorn still owns the connection: parsing (httptools), keep-alive and its timeout, pipelining, the
SIGTERM drain, and every request the fast path does not take (the control plane, wrong methods,
unusual paths), which goes to the ASGI app as before. For ``GET /ping``, ``POST /invocations`` and
``POST /models/<name>/invoke`` the protocol collects the body as the parser hands it over, without
uvicorn's 64 KiB pause/resume steps and ``bytearray`` appends (0.5 ms of front CPU less on a 600 KB
image, bench/NOTES.md), calls the routes' one implementation (:meth:`DataRoutes.reply`) and writes the whole answer
in one call. Streamed answers go through uvicorn's ASGI ``send`` as before.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from smtriton.serve.errors import ClientGone, PayloadTooLarge
from smtriton.serve.routes import (
    ATTRIBUTES_HEADER,
    INVOCATIONS,
    PING,
    PING_TYPE,
    DataRoutes,
    Invocation,
    attributes_value,
    invoke_name,
)

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_ONE_WRITE = 64 * 1024  # answers up to this size go out with their head in a single write


class FastCycle(RequestResponseCycle):
    """One data-route request: its body as the chunks the parser gave, then one answer."""

    def __init__(self, *args: Any, routes: DataRoutes, mme_name: str | None, ping: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.routes = routes
        self.mme_name = mme_name
        self.ping = ping
        self.chunks: list[bytes] = []
        self.size = 0
        self.too_large = False

    def add_body(self, chunk: bytes) -> None:
        """Called by the protocol for each piece of the body; past the limit the rest is dropped."""
        if self.too_large:
            return
        self.size += len(chunk)
        if self.size > self.routes.limit:
            self.too_large = True
            self.chunks = []
            self.message_event.set()  # answer 413 now, not after the whole body
            return
        self.chunks.append(chunk)

    async def read_body(self) -> bytes:
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
        chunks, self.chunks = self.chunks, []
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def run_asgi(self, app: Any) -> None:
        """Serve the request (the name is uvicorn's: its protocol starts every cycle through it)."""
        try:
            routes = self.routes
            if self.ping:
                await self.answer(routes.ping_status(), PING_TYPE, b"", None)
                return
            request = Invocation(self.scope["headers"])
            status, content_type, body, attributes, stream = await routes.reply(
                self.scope["path"], request, self.read_body, self.mme_name
            )
            if stream is not None:
                await stream.send(self.scope, self.receive, self.send)  # type: ignore[arg-type]
            else:
                await self.answer(status, content_type.encode(), body, attributes)
        except BaseException as exc:
            self.logger.error("Exception in the data route", exc_info=exc)
            if not self.response_started:
                await self.send_500_response()
            else:
                self.transport.close()
        finally:
            self.on_response = lambda: None

    async def answer(self, status: int, content_type: bytes, body: bytes, attributes: str | None) -> None:
        """The whole answer, head and body, in one write (two for a large body)."""
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
        if attributes is not None:
            head += ATTRIBUTES_HEADER, b": ", attributes_value(attributes), b"\r\n"
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


class DataProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, serving the data routes through :class:`FastCycle`.

    It uses the protocol's per-connection state (cycle, pipeline, flow control), stable across
    uvicorn's releases but not public API: tests/unit/test_protocol.py holds it to the locked version.
    """

    routes: DataRoutes  # set by :func:`data_protocol`

    def on_headers_complete(self) -> None:
        parser = self.parser
        method = parser.get_method()
        url = self.url
        path, _, query = url.partition(b"?")
        mme_name: str | None = None
        text = path.decode("ascii") if path.isascii() and b"%" not in path else ""
        if method == b"GET":
            take = text == PING
        elif method == b"POST":
            take = text == INVOCATIONS or (mme_name := invoke_name(text)) is not None
        else:
            take = False
        if not take or parser.should_upgrade() or self.limit_concurrency is not None:
            super().on_headers_complete()
            return
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
            mme_name=mme_name,
            ping=method == b"GET",
        )
        if existing is None or existing.response_complete:
            task = self.loop.create_task(self.cycle.run_asgi(self.app))
            task.add_done_callback(self.tasks.discard)
            self.tasks.add(task)  # the drain on shutdown waits for it
        else:  # pipelined: waits for the answers before it, as uvicorn queues its own cycles
            self.flow.pause_reading()
            self.pipeline.appendleft((self.cycle, self.app))

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if type(cycle) is not FastCycle:
            super().on_body(body)
        elif not cycle.response_complete:
            cycle.add_body(body)

    def on_message_complete(self) -> None:
        cycle = self.cycle
        if type(cycle) is not FastCycle:
            super().on_message_complete()
        elif not cycle.response_complete:
            cycle.more_body = False
            cycle.message_event.set()


def data_protocol(routes: DataRoutes) -> type[DataProtocol]:
    """The protocol class uvicorn instantiates per connection, bound to ``routes``."""
    return type("BoundDataProtocol", (DataProtocol,), {"routes": routes})
