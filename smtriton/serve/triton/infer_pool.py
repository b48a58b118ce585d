"""The inference path's own HTTP/1.1 client to Triton: keep-alive connections on asyncio protocols.

aiohttp cost about a quarter of a millisecond of front CPU on a 600 KB request (bench/NOTES.md Parts 5
and 12); the inference call is one request shape, ``POST /v2/models/<m>/infer``, to one loopback address,
so it gets a client that does only that. aiohttp keeps everything else (control calls, generate).

- One request at a time on a connection (no pipelining); idle connections wait in a LIFO pool; at most
  ``limit`` connections are open at once, and a call past that waits for one.
- The request goes out as it is: its head and a small body in one write, a large body after its head
  without being copied (``writelines``: one ``writev`` on uvloop, one ``sendmsg`` on Python 3.12's loop),
  a body held in pieces (:class:`BodyPieces`) as its pieces.
- The answer: Content-Length, chunked, or up to the close (httptools parses it).
- Failures map as the rest of the client maps them: Triton unreachable, or the connection lost before
  the whole answer came, is :class:`TritonUnavailable` (503: Triton is restarting or dead); the call's
  time (``timeout_s`` from the call to the answer, waiting for a connection included) is its own error,
  :class:`UpstreamTimeout`. A connection keeps one deadline timer across its requests, moved rather
  than made again for each (a timer made and cancelled costs some 4 µs). A call cancelled (its client
  left) aborts its connection, which is never used again, so Triton sees the request go.
- An inference is never sent twice without proof that Triton did not get it the first time. A pooled
  connection found closed before use (Triton's close seen by the loop, or pending on the socket) is
  dropped and the request takes another. If the request's first write fails at once (the kernel took
  none of its bytes), it goes once more on a fresh connection. A connection lost after any byte left is
  503, as an HTTP client must treat a POST whose fate it does not know.
"""

from __future__ import annotations

import asyncio
import collections
import select
from dataclasses import dataclass
from typing import Final, cast
from urllib.parse import quote

import httptools

from smtriton.serve.errors import TritonUnavailable, UpstreamTimeout
from smtriton.serve.eventloop import LoopOfFirstUse
from smtriton.serve.triton.request_body import BodyPieces, HeldBody

_ONE_WRITE: Final = 16 * 1024  # bodies up to this size are copied behind their head: one small write
_HEADER_LENGTH: Final = b"inference-header-content-length"
_CONTENT_TYPE: Final = b"content-type"
_BODY_FRAMING: Final = (b"content-length", b"transfer-encoding")  # headers that say where an answer ends
_JSON_HEAD: Final = b"Content-Type: application/json\r\nContent-Length: "
_BINARY_HEAD: Final = b"Content-Type: application/octet-stream\r\nInference-Header-Content-Length: "
_MAX_HEADS: Final = 1024  # request heads kept, one per model name


@dataclass(frozen=True)
class UpstreamResponse:
    status: int
    content_type: str
    header_length: int | None
    body: bytes


class _Lost(Exception):
    """The connection closed before the whole answer came; ``unsent``: none of the request left."""

    def __init__(self, cause: str, unsent: bool = False) -> None:
        super().__init__(cause)
        self.cause = cause
        self.unsent = unsent


class _Connection(asyncio.Protocol):
    """One keep-alive connection to Triton: a request written, its answer parsed as it arrives."""

    def __init__(self, pool: InferPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.poller: select.poll | None = None  # on the socket: whether Triton closed it while idle
        self.closed = False  # lost, closed by Triton, or closed here: never used again
        self.waiter: asyncio.Future[UpstreamResponse] | None = None
        self.deadline = 0.0  # the waiting request's, on the loop's clock
        self._timer: asyncio.TimerHandle | None = None  # armed at or before ``deadline`` while a request waits
        self._timer_at = 0.0
        self._until_close = False  # an answer with neither Content-Length nor chunks: it ends at the close
        self._keep_alive = False
        self._content_type = b""
        self._header_length: bytes | None = None
        self._body: list[bytes] = []

    # ----- asyncio's callbacks -----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass of asyncio's
        sock = transport.get_extra_info("socket")
        if sock is not None:
            self.poller = select.poll()
            self.poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)

    def data_received(self, data: bytes) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():  # Triton does not speak unasked: a connection in an unknown state
            self.abort()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(_Lost(f"invalid HTTP answer ({exc})"))
            self.abort()

    def eof_received(self) -> bool:
        if self._until_close and self.waiter is not None:
            self._until_close = False
            self._complete()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        self.pool.forget(self)
        if self._until_close and self.waiter is not None:
            self._until_close = False
            self._complete()
        self._fail(_Lost(exc.__class__.__name__ if exc is not None else "the connection closed"))

    # ----- httptools' callbacks ----------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == _HEADER_LENGTH:
            self._header_length = value
        elif name == _CONTENT_TYPE:
            self._content_type = value
        elif name in _BODY_FRAMING:
            self._until_close = False

    def on_message_begin(self) -> None:
        self._until_close = True  # until a header says how the body ends

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        self._until_close = False
        self._keep_alive = self.parser.should_keep_alive()  # asked now: the parser forgets once it returns
        self._complete()

    # ----- a request -----------------------------------------------------------------------------------
    def usable(self) -> bool:
        """Open, and nothing arrived while it was idle (what arrives then is Triton's close)."""
        if self.closed or self.transport is None or self.transport.is_closing():
            return False
        return self.poller is None or not self.poller.poll(0)

    def send(
        self, waiter: asyncio.Future[UpstreamResponse], head: bytes, body: HeldBody
    ) -> asyncio.Future[UpstreamResponse]:
        """Write the request; ``waiter`` gets its answer, or :class:`_Lost` (with ``unsent`` when the write
        failed before the kernel took any of it: the connection was found closed)."""
        transport = self.transport
        assert transport is not None
        self.waiter = waiter
        if self.closed or transport.is_closing():
            # Closed since it was made (Triton died just after accepting it): nothing is written, and
            # uvloop would refuse the write with a RuntimeError rather than drop it.
            self._fail(_Lost("the connection was closed", unsent=True))
            return waiter
        self._keep_alive = False
        self._content_type = b""
        self._header_length = None
        if isinstance(body, BodyPieces):
            transport.writelines([head, *body.pieces])
        elif len(body) <= _ONE_WRITE:
            transport.write(head + body)
        else:
            transport.writelines((head, body))
        if transport.is_closing() and not waiter.done():
            # Open before this write and closed by it: the write's one system call failed, so none of
            # the request's bytes left (asyncio's and uvloop's transports try one send in a write).
            self._fail(_Lost("the connection was closed", unsent=True))
        return waiter

    def _complete(self) -> None:
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        body = self._body
        self._body = []
        payload = body[0] if len(body) == 1 else b"".join(body)
        header_length = self._header_length
        try:
            length = int(header_length) if header_length is not None else None
        except ValueError:
            self._fail(_Lost("an invalid Inference-Header-Content-Length"))
            return
        waiter.set_result(
            UpstreamResponse(self.parser.get_status_code(), self._content_type.decode("latin-1"), length, payload)
        )

    def _fail(self, exc: BaseException) -> None:
        self._body = []
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def reusable(self) -> bool:
        """Whether the connection may carry another request once its answer came."""
        return not self.closed and self._keep_alive

    def watch(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        """The waiting request times out at ``deadline``: the timer armed for an earlier request stays
        when it fires no later than that (it looks again when it fires), else it is armed anew."""
        self.deadline = deadline
        if self._timer is None or self._timer_at > deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = deadline
            self._timer = loop.call_at(deadline, self._deadline_passed, loop)

    def _deadline_passed(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        waiter = self.waiter
        if waiter is None or waiter.done():
            return  # idle: the next request arms it again
        if self.deadline - loop.time() > 0.001:  # a later request's deadline: look again then
            self._timer_at = self.deadline
            self._timer = loop.call_at(self.deadline, self._deadline_passed, loop)
            return
        waiter.set_exception(asyncio.TimeoutError())

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def abort(self) -> None:
        """Closed at once and never used again (the answer, if one comes, is not read)."""
        self.closed = True
        self._stop_timer()
        if self.transport is not None:
            self.transport.abort()


class InferPool:
    """Keep-alive connections to one Triton HTTP endpoint, for its inference calls only, on the event loop
    of its first call (its connections belong to that loop); close at shutdown."""

    def __init__(self, host: str, port: int, timeout_s: float, limit: int = 256) -> None:
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self.limit = limit
        self._idle: list[_Connection] = []  # LIFO: the warmest connection goes first
        self._open: set[_Connection] = set()
        self._in_use = 0  # connections lent to calls (or being opened for one)
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._heads: dict[str, tuple[bytes, bytes]] = {}  # model -> the start of its JSON and binary heads
        self._closed = False
        self._loop = LoopOfFirstUse()

    async def infer(self, model: str, body: HeldBody, header_length: int | None) -> UpstreamResponse:
        """POST ``body`` to ``/v2/models/<model>/infer`` as is; ``header_length`` None means pure JSON."""
        loop = self._loop.get()
        deadline = loop.time() + self.timeout_s
        try:
            return await self._call(loop, model, body, header_length, deadline)
        except asyncio.TimeoutError:
            raise UpstreamTimeout(f"inference on model '{model}' did not finish in time") from None
        except _Lost as exc:
            raise TritonUnavailable(f"Triton is not reachable: {exc.cause}", sent=not exc.unsent) from None
        except OSError as exc:  # no connection made: nothing reached Triton
            raise TritonUnavailable(f"Triton is not reachable: {exc.__class__.__name__}", sent=False) from None

    async def _call(
        self,
        loop: asyncio.AbstractEventLoop,
        model: str,
        body: HeldBody,
        header_length: int | None,
        deadline: float,
    ) -> UpstreamResponse:
        head = self._head(model, len(body), header_length)
        await self._take_slot(loop, deadline)
        connection: _Connection | None = None
        try:
            for attempt in range(2):
                connection = self._idle_connection() if attempt == 0 else None
                if connection is None:
                    connection = await self._connect(loop, deadline)
                try:
                    answer = await self._exchange(loop, connection, head, body, deadline)
                except _Lost as exc:
                    if exc.unsent and attempt == 0:
                        connection.abort()
                        connection = None
                        continue  # nothing of it left: once more, on a fresh connection
                    raise
                if connection.reusable() and not self._closed:
                    connection.waiter = None
                    self._idle.append(connection)
                else:
                    connection.abort()
                connection = None
                return answer
            raise AssertionError("unreachable")  # pragma: no cover
        finally:
            if connection is not None:  # failed, timed out or cancelled: the connection goes with it
                connection.abort()
            self._give_slot()

    @staticmethod
    async def _exchange(
        loop: asyncio.AbstractEventLoop,
        connection: _Connection,
        head: bytes,
        body: HeldBody,
        deadline: float,
    ) -> UpstreamResponse:
        waiter = connection.send(loop.create_future(), head, body)
        connection.watch(loop, deadline)
        return await waiter

    # ----- connections ---------------------------------------------------------------------------------
    def _idle_connection(self) -> _Connection | None:
        """The warmest idle connection still open (those Triton closed are dropped)."""
        while self._idle:
            connection = self._idle.pop()
            if connection.usable():
                return connection
            connection.abort()
        return None

    async def _connect(self, loop: asyncio.AbstractEventLoop, deadline: float) -> _Connection:
        if self._closed:
            raise _Lost("the client is closed", unsent=True)
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise asyncio.TimeoutError()
        _, connection = await asyncio.wait_for(
            loop.create_connection(lambda: _Connection(self), self.host, self.port), remaining
        )
        if self._closed:  # closed while this one was being opened
            connection.abort()
            raise _Lost("the client is closed", unsent=True)
        self._open.add(connection)
        return connection

    def forget(self, connection: _Connection) -> None:
        self._open.discard(connection)

    async def _take_slot(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        """One of the ``limit`` connections for this call; waits (until ``deadline``) when all are lent."""
        while self._in_use >= self.limit:
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiting.append(waiter)
            timer = loop.call_at(deadline, _expire, waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    self._wake_one()  # woken and cancelled at once: the next one gets the slot
                raise
            finally:
                timer.cancel()
                if waiter in self._waiting:
                    self._waiting.remove(waiter)
        self._in_use += 1

    def _give_slot(self) -> None:
        self._in_use -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _head(self, model: str, length: int, header_length: int | None) -> bytes:
        starts = self._heads.get(model)
        if starts is None:
            if len(self._heads) >= _MAX_HEADS:
                self._heads.clear()
            line = f"POST /v2/models/{quote(model, safe='')}/infer HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            start = line.encode("ascii")
            starts = self._heads[model] = (start + _JSON_HEAD, start + _BINARY_HEAD)
        if header_length is None:
            return b"%s%d\r\n\r\n" % (starts[0], length)
        return b"%s%d\r\nContent-Length: %d\r\n\r\n" % (starts[1], header_length, length)

    @property
    def open_connections(self) -> int:
        return len(self._open)

    async def close(self) -> None:
        """Close every connection; calls still waiting for an answer fail with 503."""
        self._closed = True
        self._idle.clear()
        for connection in list(self._open):
            connection.abort()
        self._open.clear()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(asyncio.TimeoutError())
