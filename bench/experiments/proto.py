"""No ASGI, no uvicorn: an asyncio Protocol server on httptools + uvloop, forwarding to Triton.

``python -m bench.experiments.proto --port P [--workers N]``; N processes share the port (SO_REUSEPORT).
No pipelining (a client sends its next request after the answer, as HTTP clients do).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import signal

import httptools
import uvloop

from bench.experiments.common import request_header_length, response_content_type, triton_address
from bench.experiments.upstream import Upstream

_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 500: b"Internal Server Error", 503: b"Unavailable"}
_PING = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"


class Front(asyncio.Protocol):
    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.content_type: bytes | None = None
        self.chunks: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            assert self.transport is not None
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            self.transport.close()

    def on_message_begin(self) -> None:
        self.url, self.content_type, self.chunks = b"", None, []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.content_type = value

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        assert self.transport is not None
        keep_alive = self.parser.should_keep_alive()
        if self.url == b"/ping":
            self.transport.write(_PING)
            if not keep_alive:
                self.transport.close()
            return
        chunks = self.chunks
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        asyncio.get_running_loop().create_task(self.forward(body, self.content_type, keep_alive))

    async def forward(self, body: bytes, content_type: bytes | None, keep_alive: bool) -> None:
        assert self.transport is not None
        status, header_length, payload = await self.upstream.infer(body, request_header_length(content_type))
        head = b"HTTP/1.1 %d %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n" % (
            status, _REASONS.get(status, b"-"), response_content_type(header_length), len(payload),
        )  # fmt: skip
        if len(payload) < 65536:
            self.transport.write(head + payload)
        else:
            self.transport.write(head)
            self.transport.write(payload)
        if not keep_alive:
            self.transport.close()


async def serve(host: str, port: int) -> None:
    upstream = Upstream(*triton_address())
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Front(upstream), host, port, reuse_port=True, backlog=1024)
    stop = loop.create_future()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set_result, None)
    await stop
    server.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args()
    for _ in range(args.workers - 1):
        if os.fork() == 0:
            ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the first worker
            break
    uvloop.run(serve(args.host, args.port))


if __name__ == "__main__":
    main()
