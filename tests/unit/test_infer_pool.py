"""The inference client's edge cases (smtriton/serve/triton/infer_pool.py) against a raw HTTP server the
test scripts byte by byte: answers split anywhere, chunked, up to the close, cut mid-answer, never sent;
cancelled calls, the pool's limit, connections Triton closed while they were idle, and when a request may
go a second time (only when none of it left). Every case runs on asyncio's loop and on uvloop (serve's)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import uvloop

from smtriton.serve.errors import TritonUnavailable, UpstreamTimeout
from smtriton.serve.triton.infer_pool import InferPool, UpstreamResponse
from smtriton.serve.triton.request_body import BodyPieces

OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"


class Received:
    """One request as the server read it."""

    def __init__(self, head: bytes, body: bytes, connection: int) -> None:
        self.head = head
        self.body = body
        self.connection = connection  # which accepted connection carried it (0, 1, ...)

    @property
    def headers(self) -> dict[str, str]:
        lines = self.head.decode("latin-1").split("\r\n")[1:]
        return {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines if line)}


Script = Callable[[socket.socket, Received], None]  # answers one request on its connection


class RawTriton:
    """A blocking HTTP/1.1 server in threads: each request read whole, then answered by ``script``."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.requests: list[Received] = []
        self.connections = 0
        self.open_now = 0
        self.most_open = 0
        self.closed_by_client = 0  # connections the client closed (EOF or reset while the server read)
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stop = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                number = self.connections
                self.connections += 1
                self.open_now += 1
                self.most_open = max(self.most_open, self.open_now)
            threading.Thread(target=self._serve, args=(conn, number), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int) -> None:
        buffered = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffered:
                    data = conn.recv(65536)
                    if not data:
                        with self._lock:
                            self.closed_by_client += 1
                        return
                    buffered += data
                head, _, buffered = buffered.partition(b"\r\n\r\n")
                received = Received(head + b"\r\n\r\n", b"", number)
                length = int(received.headers.get("content-length", "0"))
                while len(buffered) < length:
                    data = conn.recv(65536)
                    if not data:
                        raise ConnectionResetError
                    buffered += data
                received.body, buffered = buffered[:length], buffered[length:]
                with self._lock:
                    self.requests.append(received)
                self.script(conn, received)
                if conn.fileno() == -1:  # the script closed it
                    return
        except OSError:
            with self._lock:
                self.closed_by_client += 1
        finally:
            with self._lock:
                self.open_now -= 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self._listener.close()


def answer(body: bytes = b"{}", extra: bytes = b"") -> Script:
    def script(conn: socket.socket, request: Received) -> None:
        conn.sendall(OK_HEAD + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body)

    return script


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """Runs a coroutine on asyncio's loop or on uvloop."""
    if request.param == "uvloop":
        return uvloop.run
    return asyncio.run


@pytest.fixture
def serving() -> Iterator[Callable[[Script], RawTriton]]:
    servers: list[RawTriton] = []

    def start(script: Script) -> RawTriton:
        servers.append(RawTriton(script))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_request_goes_as_is_and_keep_alive_reuses_one_connection(run, serving):
    triton = serving(answer(b"OUT", b"Inference-Header-Content-Length: 2\r\n"))
    image = bytes(range(256)) * 2400  # 600 KB: sent after its head, not copied behind it

    async def main() -> list[UpstreamResponse]:
        pool = InferPool("127.0.0.1", triton.port, 5.0)
        try:
            return [
                await pool.infer("m", b'{"inputs":[]}', None),
                await pool.infer("a/b", b'{"x":1}RAW', 7),
                await pool.infer("m", image, 0),
            ]
        finally:
            await pool.close()

    answers = run(main())
    assert [(a.status, a.content_type, a.header_length, a.body) for a in answers] == [
        (200, "application/json", 2, b"OUT")
    ] * 3
    json, binary, raw = triton.requests
    assert json.head.startswith(b"POST /v2/models/m/infer HTTP/1.1\r\n")
    assert (json.body, json.headers["content-type"], "inference-header-content-length" in json.headers) == (
        b'{"inputs":[]}', "application/json", False
    )  # fmt: skip
    assert binary.head.startswith(b"POST /v2/models/a%2Fb/infer HTTP/1.1\r\n")
    assert (binary.body, binary.headers["inference-header-content-length"]) == (b'{"x":1}RAW', "7")
    assert binary.headers["content-type"] == "application/octet-stream"
    assert (raw.body == image, raw.headers["inference-header-content-length"]) == (True, "0")
    assert triton.connections == 1  # one keep-alive connection carried all three


def test_a_body_held_in_pieces_goes_as_its_pieces(run, serving):
    triton = serving(answer())
    pieces = [b'{"inputs":[]}', b"\x00" * 70_000, memoryview(b"abc" * 30_000)[5:]]

    async def main() -> None:
        pool = InferPool("127.0.0.1", triton.port, 5.0)
        try:
            await pool.infer("m", BodyPieces(pieces), 13)
        finally:
            await pool.close()

    run(main())
    (received,) = triton.requests
    assert received.body == b"".join(pieces)
    assert received.headers["content-length"] == str(len(received.body))


def test_an_answer_split_anywhere_is_read_whole(run, serving):
    head = OK_HEAD + b"Inference-Header-Content-Length: 4\r\nContent-Length: 10\r\n\r\n"
    message = head + b"HEAD123456"

    def byte_by_byte(conn: socket.socket, request: Received) -> None:
        for i in range(len(message)):
            conn.sendall(message[i : i + 1])
            if i % 7 == 0:
                time.sleep(0.001)  # the client reads the pieces apart, a header name or value cut in two

    triton = serving(byte_by_byte)
    got = run(_one_answer(triton.port, b"{}"))
    assert (got.status, got.content_type, got.header_length, got.body) == (200, "application/json", 4, b"HEAD123456")


async def _one_answer(port: int, body: bytes) -> UpstreamResponse:
    """The answer to one request through a pool of its own."""
    pool = InferPool("127.0.0.1", port, 5.0)
    try:
        return await pool.infer("m", body, None)
    finally:
        await pool.close()


async def _two_answers(port: int) -> list[bytes]:
    """The bodies of two requests, one after the other, through one pool."""
    pool = InferPool("127.0.0.1", port, 5.0)
    try:
        return [(await pool.infer("m", b"{}", None)).body for _ in range(2)]
    finally:
        await pool.close()


def test_a_chunked_answer_is_joined_and_the_connection_kept(run, serving):
    def chunked(conn: socket.socket, request: Received) -> None:
        conn.sendall(OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        time.sleep(0.01)
        conn.sendall(b"1;ext=1\r\n \r\n6\r\nworld!\r\n0\r\n\r\n")

    triton = serving(chunked)

    assert run(_two_answers(triton.port)) == [b"hello world!"] * 2
    assert triton.connections == 1


def test_an_answer_without_a_length_ends_at_the_close_and_its_connection_is_not_reused(run, serving):
    def until_close(conn: socket.socket, request: Received) -> None:
        conn.sendall(OK_HEAD + b"\r\nall of")
        conn.sendall(b" it")
        conn.shutdown(socket.SHUT_WR)
        conn.close()

    triton = serving(until_close)

    assert run(_two_answers(triton.port)) == [b"all of it"] * 2
    assert triton.connections == 2


def test_a_connection_closed_mid_answer_is_503_and_the_request_is_not_sent_again(run, serving):
    def cut(conn: socket.socket, request: Received) -> None:
        if request.body == b'{"cut":1}':
            conn.sendall(OK_HEAD + b"Content-Length: 100\r\n\r\npart of it")
            conn.close()
        elif request.body == b'{"silent":1}':
            conn.close()  # read the request, then went away without a word (Triton died)
        else:
            answer()(conn, request)

    triton = serving(cut)

    async def main() -> None:
        pool = InferPool("127.0.0.1", triton.port, 5.0)
        try:
            with pytest.raises(TritonUnavailable, match="Triton is not reachable"):
                await pool.infer("m", b'{"cut":1}', None)
            await pool.infer("m", b"{}", None)  # a warm connection in the pool
            with pytest.raises(TritonUnavailable, match="Triton is not reachable") as silent:
                await pool.infer("m", b'{"silent":1}', None)
            assert silent.value.sent  # Triton may have it
            assert (await pool.infer("m", b"{}", None)).status == 200  # and the pool goes on
        finally:
            await pool.close()

    run(main())
    bodies = [received.body for received in triton.requests]
    assert bodies.count(b'{"silent":1}') == 1  # Triton may have got it: never sent twice
    assert bodies.count(b'{"cut":1}') == 1


def test_an_invalid_answer_is_503(run, serving):
    triton = serving(lambda conn, request: conn.sendall(b"NOT HTTP AT ALL\r\n\r\n"))

    async def main() -> None:
        pool = InferPool("127.0.0.1", triton.port, 5.0)
        try:
            with pytest.raises(TritonUnavailable, match="invalid HTTP answer"):
                await pool.infer("m", b"{}", None)
        finally:
            await pool.close()

    run(main())


def test_an_answer_past_the_timeout_is_the_calls_error_and_its_connection_is_dropped(run, serving):
    triton = serving(lambda conn, request: time.sleep(1.0))

    async def main() -> float:
        pool = InferPool("127.0.0.1", triton.port, 0.3)
        started = time.monotonic()
        try:
            with pytest.raises(UpstreamTimeout, match="inference on model 'm' did not finish in time"):
                await pool.infer("m", b"{}", None)
            return time.monotonic() - started
        finally:
            await pool.close()

    took = run(main())
    assert 0.25 < took < 0.9
    wait_until(lambda: triton.closed_by_client == 1, "the timed-out connection was not closed")


def test_a_kept_connection_times_out_each_call_at_its_own_deadline(run, serving):
    """The deadline timer armed for a first call is moved, not made again, for the next one on the same
    connection: a later call is not cut at the first call's deadline, and is cut at its own."""
    delays = iter([0.0, 0.5, 1.0])

    def script(conn: socket.socket, request: Received) -> None:
        time.sleep(next(delays))
        answer()(conn, request)

    triton = serving(script)

    async def main() -> tuple[float, float]:
        pool = InferPool("127.0.0.1", triton.port, 0.7)
        try:
            assert (await pool.infer("m", b"{}", None)).status == 200  # arms the timer at about 0.7 s
            await asyncio.sleep(0.4)
            started = time.monotonic()
            assert (await pool.infer("m", b"{}", None)).status == 200  # ends past the first deadline
            second = time.monotonic() - started
            started = time.monotonic()
            with pytest.raises(UpstreamTimeout):
                await pool.infer("m", b"{}", None)
            return second, time.monotonic() - started
        finally:
            await pool.close()

    second, third = run(main())
    assert 0.45 < second < 0.7
    assert 0.65 < third < 0.95
    assert triton.connections == 1  # the first two on one connection; the third cut on it


def test_a_cancelled_call_closes_its_connection_and_frees_its_place(run, serving):
    slow = threading.Event()

    def script(conn: socket.socket, request: Received) -> None:
        if request.body == b'{"slow":1}':
            slow.wait(5)  # the answer never comes while the test runs
        else:
            answer()(conn, request)

    triton = serving(script)

    async def main() -> None:
        pool = InferPool("127.0.0.1", triton.port, 5.0, limit=1)
        try:
            call = asyncio.ensure_future(pool.infer("m", b'{"slow":1}', None))
            await asyncio.to_thread(wait_until, lambda: len(triton.requests) == 1, "the request did not arrive")
            call.cancel()  # the front's client went away
            with pytest.raises(asyncio.CancelledError):
                await call
            assert pool.open_connections == 0  # closed, not back in the pool
            assert (await pool.infer("m", b"{}", None)).status == 200  # its place (limit 1) is free again
        finally:
            slow.set()
            await pool.close()

    run(main())
    assert triton.connections == 2
    wait_until(lambda: triton.closed_by_client >= 1, "the cancelled call's connection stayed open")


def test_at_most_limit_connections_are_open_and_a_call_waits_for_one(run, serving):
    held = threading.Event()

    def script(conn: socket.socket, request: Received) -> None:
        if request.body == b"held":
            held.wait(5)
        else:
            time.sleep(0.05)
        answer(request.body)(conn, request)

    triton = serving(script)

    async def main() -> list[bytes]:
        pool = InferPool("127.0.0.1", triton.port, 5.0, limit=2)
        try:
            answers = await asyncio.gather(*(pool.infer("m", b"%d" % i, None) for i in range(6)))
            holder = asyncio.ensure_future(pool.infer("m", b"held", None))
            other = asyncio.ensure_future(pool.infer("m", b"held", None))
            await asyncio.to_thread(wait_until, lambda: len(triton.requests) == 8, "the held calls did not arrive")
            with pytest.raises(asyncio.TimeoutError):  # its client gave up while it waited for a connection
                await asyncio.wait_for(pool.infer("m", b"gave up", None), 0.1)
            held.set()
            await asyncio.gather(holder, other)
            assert (await pool.infer("m", b"after", None)).body == b"after"  # no place was lost on the way
            full = InferPool("127.0.0.1", triton.port, 0.2, limit=0)  # never a place: waits past its time
            with pytest.raises(UpstreamTimeout, match="did not finish in time"):
                await full.infer("m", b"never", None)
            return [a.body for a in answers]
        finally:
            held.set()
            await pool.close()

    assert run(main()) == [b"%d" % i for i in range(6)]  # every call answered, each its own answer
    assert triton.most_open <= 2
    bodies = [received.body for received in triton.requests]
    assert b"gave up" not in bodies  # it never got a connection
    assert b"never" not in bodies


def test_an_idle_connection_triton_closed_is_not_used(run, serving):
    def answer_then_close(conn: socket.socket, request: Received) -> None:
        answer()(conn, request)
        conn.close()  # an idle keep-alive connection closed by Triton (without saying so in the answer)

    triton = serving(answer_then_close)

    async def main() -> None:
        pool = InferPool("127.0.0.1", triton.port, 5.0)
        try:
            await pool.infer("m", b'{"n":1}', None)
            wait_until(lambda: triton.open_now == 0, "the server did not close")
            # The loop has not run since the server closed: the close may still be pending on the socket.
            assert (await pool.infer("m", b'{"n":2}', None)).status == 200
            await asyncio.sleep(0.05)  # now the loop has seen it
            assert (await pool.infer("m", b'{"n":3}', None)).status == 200
        finally:
            await pool.close()

    run(main())
    assert [received.body for received in triton.requests] == [b'{"n":1}', b'{"n":2}', b'{"n":3}']
    assert triton.connections == 3


def test_a_request_whose_first_write_fails_goes_once_more_on_a_fresh_connection(run, serving, monkeypatch):
    """Closed by a reset that neither the loop nor the check before use saw (a race of microseconds,
    forced here): none of the request left, so it is sent again, once."""
    from smtriton.serve.triton import infer_pool

    def answer_then_reset(conn: socket.socket, request: Received) -> None:
        answer()(conn, request)
        if request.body == b'{"n":1}':
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            conn.close()  # a reset: the client's next send on it fails at once

    triton = serving(answer_then_reset)
    monkeypatch.setattr(infer_pool._Connection, "usable", lambda self: not self.closed)

    async def main() -> None:
        pool = InferPool("127.0.0.1", triton.port, 5.0)
        try:
            await pool.infer("m", b'{"n":1}', None)
            wait_until(lambda: triton.open_now == 0, "the server did not reset the connection")
            assert (await pool.infer("m", b'{"n":2}', None)).status == 200
        finally:
            await pool.close()

    run(main())
    assert [received.body for received in triton.requests] == [b'{"n":1}', b'{"n":2}']
    assert triton.connections == 2


def test_a_fresh_connection_closed_before_its_request_is_written_sends_it_on_another(run, serving, monkeypatch):
    """Triton dying just after it accepted: the connection made for a request is closed (and the loop has
    seen it) before the request is written. Nothing of it left, so it goes once more on a fresh
    connection; uvloop refuses a write to a closed transport, which must not reach the caller."""
    triton = serving(answer())
    made = InferPool._connect
    closed_first: list[bool] = []

    async def connect_then_lose(self: InferPool, loop: asyncio.AbstractEventLoop, deadline: float) -> Any:
        connection = await made(self, loop, deadline)
        if not closed_first:
            closed_first.append(True)
            connection.abort()
            for _ in range(3):  # the loop closes the transport and tells the connection
                await asyncio.sleep(0)
            assert connection.closed
        return connection

    monkeypatch.setattr(InferPool, "_connect", connect_then_lose)
    assert run(_one_answer(triton.port, b'{"n":1}')).status == 200
    assert [received.body for received in triton.requests] == [b'{"n":1}']


def test_unreachable_is_503_and_closing_the_pool_fails_the_calls_in_flight(run, serving):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        nobody = probe.getsockname()[1]
    waiting = threading.Event()
    triton = serving(lambda conn, request: waiting.wait(5))

    async def main() -> None:
        gone = InferPool("127.0.0.1", nobody, 5.0)
        with pytest.raises(TritonUnavailable, match="Triton is not reachable: ConnectionRefusedError") as refused:
            await gone.infer("m", b"{}", None)
        assert refused.value.sent is False  # nothing reached Triton: it may be sent again
        pool = InferPool("127.0.0.1", triton.port, 5.0)
        call = asyncio.ensure_future(pool.infer("m", b"{}", None))
        await asyncio.to_thread(wait_until, lambda: len(triton.requests) == 1, "the request did not arrive")
        await pool.close()  # Triton moved to new ports: the old client goes
        with pytest.raises(TritonUnavailable):
            await call
        with pytest.raises(TritonUnavailable):
            await pool.infer("m", b"{}", None)

    try:
        run(main())
    finally:
        waiting.set()
