"""The floor: the least a Python SageMaker front in front of Triton's HTTP endpoint must do, for the
interleaved benchmark to measure what serve adds above it (bench/NOTES.md Part 19).

Per request it parses the client's HTTP (httptools), writes the body to Triton on a kept-alive
connection of its own (one per client connection) with the binary+json header size carried over, parses
Triton's answer and writes it back with SageMaker's content type; on uvloop. Nothing is checked, nothing
is merged, no error is mapped, no limit is kept: a benchmark's yardstick, never a server. It starts its
own Triton (loopback HTTP) and answers ``/ping`` 200 once that Triton is ready. With ``--task`` each
request is served by an asyncio task of its own that awaits Triton's answer, as serve serves each: what
a task per request costs, beside the floor.

    python -m bench.floor_front --port P --model-repository DIR --model NAME [--task]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import cast

import httptools
import uvloop

from bench.servers import TritonSetup
from smtriton.local.serve_process import free_port

BINARY_JSON = b"application/vnd.sagemaker-triton.binary+json;json-header-size="


class _HttpSide(asyncio.Protocol):
    """A connection whose messages httptools parses, each message's body gathered in pieces."""

    def __init__(self, parser: httptools.HttpRequestParser | httptools.HttpResponseParser) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = parser
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def take_body(self) -> bytes:
        """The message's body, whole; the next message's starts empty."""
        body, self.body = b"".join(self.body), []
        return body


class _Upstream(_HttpSide):
    """One kept-alive connection to Triton, one request at a time."""

    parser: httptools.HttpResponseParser

    def __init__(self, client: _Client) -> None:
        super().__init__(httptools.HttpResponseParser(self))
        self.client = client
        self.header_length = b""

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"inference-header-content-length":
            self.header_length = value

    def on_message_complete(self) -> None:
        length, self.header_length = self.header_length, b""
        self.client.answer(self.parser.get_status_code(), self.take_body(), length)


class _Client(_HttpSide):
    """A client connection; its requests go to Triton in turn."""

    def __init__(self, triton_port: int, path: bytes, task: bool = False) -> None:
        super().__init__(httptools.HttpRequestParser(self))
        self.triton_port = triton_port
        self.path = path
        self.task = task
        self.waiter: asyncio.Future[tuple[int, bytes, bytes]] | None = None  # the task's answer to come
        self.upstream: _Upstream | None = None
        self.connecting: asyncio.Future[None] | None = None
        self.url = b""
        self.content_type = b""
        self.keep_alive = True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.close()

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.content_type = value

    def on_message_complete(self) -> None:
        assert self.transport is not None
        self.keep_alive = self.parser.should_keep_alive()
        if self.url == b"/ping":
            self._write(200, b"application/json", b"{}")
            return
        body = self.take_body()
        head = b"POST %s HTTP/1.1\r\nHost: triton\r\nContent-Length: %d\r\n" % (self.path, len(body))
        if self.content_type.startswith(BINARY_JSON):
            head += b"Inference-Header-Content-Length: %s\r\n" % self.content_type[len(BINARY_JSON) :]
        request = head + b"\r\n" + body
        if self.upstream is None:
            self.connecting = asyncio.ensure_future(self._connect_and_send(request))
        elif self.task:
            asyncio.get_running_loop().create_task(self._in_a_task(request))
        else:
            assert self.upstream.transport is not None
            self.upstream.transport.write(request)

    async def _in_a_task(self, request: bytes) -> None:
        """The request sent, its answer awaited and written, in a task of its own."""
        assert self.upstream is not None
        assert self.upstream.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.upstream.transport.write(request)
        status, body, header_length = await self.waiter
        self.answer(status, body, header_length)

    async def _connect_and_send(self, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        _, upstream = await loop.create_connection(lambda: _Upstream(self), "127.0.0.1", self.triton_port)
        self.upstream = upstream
        assert upstream.transport is not None
        upstream.transport.write(request)

    def answer(self, status: int, body: bytes, header_length: bytes) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None:  # its task writes it
            waiter.set_result((status, body, header_length))
            return
        content_type = BINARY_JSON + header_length if header_length else b"application/json"
        self._write(status, content_type, body)

    def _write(self, status: int, content_type: bytes, body: bytes) -> None:
        assert self.transport is not None
        head = b"HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n" % (status, content_type, len(body))
        self.transport.write(head + body)
        if not self.keep_alive:
            self.transport.close()


def _ready(port: int) -> bool:
    try:
        url = f"http://127.0.0.1:{port}/v2/health/ready"
        return bool(urllib.request.urlopen(url, timeout=2).status == 200)
    except OSError:
        return False


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model-repository", type=Path, required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--work", type=Path, default=Path("/tmp"))
    p.add_argument("--task", action="store_true", help="serve each request in an asyncio task of its own")
    args = p.parse_args()
    setup = TritonSetup.create(args.work)
    triton_port = free_port()
    triton = subprocess.Popen(setup.command(args.model_repository, args.model, triton_port), env=setup.env)
    signal.signal(signal.SIGTERM, lambda *_: triton.terminate())
    deadline = time.monotonic() + 180
    while not _ready(triton_port):
        if time.monotonic() > deadline or triton.poll() is not None:
            triton.terminate()
            raise SystemExit("Triton did not start")
        time.sleep(0.2)
    path = f"/v2/models/{args.model}/infer".encode()

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Client(triton_port, path, args.task), "127.0.0.1", args.port)
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        async with server:
            await stop.wait()

    try:
        uvloop.run(serve())
    finally:
        triton.terminate()
        try:
            triton.wait(20)
        except subprocess.TimeoutExpired:
            os.kill(triton.pid, signal.SIGKILL)


if __name__ == "__main__":
    main()
