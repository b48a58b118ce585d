"""A minimal HTTP/1.1 keep-alive client to Triton: prebuilt request heads, httptools response parser.

One request in flight per connection; idle connections wait in a LIFO pool.
"""

from __future__ import annotations

import asyncio

import httptools

IHCL = b"inference-header-content-length"


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[tuple[int, bytes | None, bytes]] | None = None
        self.header_length: bytes | None = None
        self.chunks: list[bytes] = []
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(exc or ConnectionError("Triton closed the connection"))

    def _fail(self, exc: BaseException) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == IHCL:
            self.header_length = value

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        chunks, self.chunks = self.chunks, []
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((self.parser.get_status_code(), self.header_length, body))


class Upstream:
    def __init__(self, host: str, port: int, model: str) -> None:
        self.host, self.port = host, port
        self._idle: list[_Connection] = []
        start = f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}:{port}\r\n".encode()
        self._json_head = start + b"Content-Type: application/json\r\nContent-Length: "
        self._binary_head = start + b"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: "

    async def _acquire(self) -> _Connection:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(_Connection, self.host, self.port)
        return conn

    async def infer(self, body: bytes, header_length: int | None) -> tuple[int, bytes | None, bytes]:
        """(status, Inference-Header-Content-Length or None, body) of Triton's answer."""
        conn = await self._acquire()
        if header_length is None:
            head = b"%s%d\r\n\r\n" % (self._json_head, len(body))
        else:
            head = b"%s%d\r\nContent-Length: %d\r\n\r\n" % (self._binary_head, header_length, len(body))
        conn.header_length = None
        conn.waiter = asyncio.get_running_loop().create_future()
        assert conn.transport is not None
        if len(body) < 65536:
            conn.transport.write(head + body)
        else:
            conn.transport.write(head)
            conn.transport.write(body)
        try:
            result = await conn.waiter
        except BaseException:
            conn.closed = True
            if conn.transport is not None:
                conn.transport.close()
            raise
        conn.waiter = None
        if conn.parser.should_keep_alive() and not conn.closed:
            self._idle.append(conn)
        else:
            conn.transport.close()
        return result
