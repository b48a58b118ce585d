"""The HTTP protocol and its fast path (smtriton/serve/http/protocol.py, fastpath.py), over real sockets.

uvicorn runs with `serve`'s protocol, the real ASGI app and the real data plane on an ephemeral
loopback port in a thread, in front of a stand-in speaking Triton's HTTP API (another thread). The
tests speak raw HTTP/1.1 so that keep-alive, pipelining, 100-continue, chunked bodies, limits, slow
clients and malformed requests are what a client really sends; the differential test holds the fast
path to the ASGI app's answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import json
import logging
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from smtriton.serve.dataplane.plane import DataPlane
from smtriton.serve.http import protocol
from smtriton.serve.http.app import create_app
from smtriton.serve.http.fastpath import (
    TESTED_UVICORN,
    UVICORN_INTERNALS,
    DataProtocol,
    FastCycle,
    data_protocol,
)
from smtriton.serve.http.server import http_server
from smtriton.serve.ipc.messages import EndpointState
from smtriton.serve.metrics import Metrics
from smtriton.serve.settings import Settings
from tests.unit.triton_stand_in import TEST_SETTINGS, TritonStandIn, call, stand_in_thread

Response = tuple[int, dict[str, str], bytes]
TIMEOUT_S = 1.0  # the client timeout of the servers here
SETTINGS = TEST_SETTINGS.model_copy(update={"client_timeout_s": TIMEOUT_S})


class Server:
    """uvicorn with serve's protocol, app and data plane, in a thread, in front of ``triton``."""

    def __init__(self, triton: TritonStandIn, settings: Settings = SETTINGS, keep_alive_s: float = 5) -> None:
        self.triton = triton
        self.plane = DataPlane(settings, Metrics(enabled=False), "m")
        app = create_app(self.plane)
        self.asgi_paths: list[str] = []  # what reached the ASGI app rather than the fast path
        self.protocol = data_protocol(self.plane)

        async def asgi(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":  # the plane's clients belong to this server's loop
                await receive()
                self.plane.apply(EndpointState(True, True, "", triton.port, 9))
                await send({"type": "lifespan.startup.complete"})
                await receive()
                await self.plane.close()
                await send({"type": "lifespan.shutdown.complete"})
                return
            self.asgi_paths.append(scope["path"])
            await app(scope, receive, send)

        config = uvicorn.Config(
            asgi, http=self.protocol, lifespan="on", log_config=None, timeout_keep_alive=keep_alive_s
        )
        self.server = uvicorn.Server(config)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()

    def connect(self) -> Connection:
        return Connection(socket.create_connection(("127.0.0.1", self.port), timeout=5))

    @property
    def bodies(self) -> list[bytes]:
        """What reached Triton's infer, in order."""
        return [body for path, body, _ in self.triton.requests if path.endswith("/infer")]


class Connection:
    """One client connection; reads answers one after the other from a single buffered stream."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.stream = sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_line(self) -> bytes:
        return self.stream.readline().rstrip(b"\r\n")

    def read(self) -> Response:
        status_line = self.read_line()
        assert status_line.startswith(b"HTTP/1.1 "), status_line
        headers: dict[str, str] = {}
        while line := self.read_line():
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.lower()] = value.strip()
        if "content-length" in headers:
            body = self.stream.read(int(headers["content-length"]))
        elif headers.get("transfer-encoding") == "chunked":
            parts = []
            while size := int(self.read_line(), 16):
                parts.append(self.stream.read(size))
                self.read_line()
            self.read_line()
            body = b"".join(parts)
        else:
            body = b""
        return int(status_line.split()[1]), headers, body

    def closed_by_server(self) -> bool:
        return self.stream.read(1) == b""

    def close(self) -> None:
        self.stream.close()
        self.sock.close()


def answered(client: Connection) -> bool:
    """Whether something came back on ``client`` (its answer or the server's close), without waiting."""
    return bool(select.select([client.sock], [], [], 0)[0])


@pytest.fixture
def triton() -> Iterator[TritonStandIn]:
    with stand_in_thread() as running:
        yield running


@pytest.fixture
def server(triton: TritonStandIn) -> Iterator[Server]:
    with Server(triton) as running:
        yield running


@pytest.fixture
def connection(server: Server) -> Iterator[Connection]:
    client = server.connect()
    yield client
    client.close()


def post(path: str, body: bytes, *headers: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: t", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def get(path: str, *headers: str) -> bytes:
    return ("\r\n".join([f"GET {path} HTTP/1.1", "Host: t", *headers]) + "\r\n\r\n").encode()


def json_of(response: Response) -> Any:
    return json.loads(response[2])


def refused(response: Response, status: int) -> Any:
    """The error of a refusal: its status, a JSON body, and the connection closing after it."""
    assert response[0] == status, response
    assert response[1]["content-type"] == "application/json"
    assert response[1]["connection"] == "close"
    return json_of(response)["error"]


# ----- the fast path, against the ASGI app --------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path", "body", "headers"),
    [
        ("GET", "/ping", b"", []),
        ("POST", "/invocations", b'{"inputs":[]}', [(b"content-type", b"application/json")]),
        ("POST", "/invocations", b"x" * 1025, []),
        ("POST", "/invocations", gzip.compress(b"{}"), [(b"content-encoding", b"gzip")]),
        ("POST", "/invocations", b"{}", [(b"content-encoding", b"br")]),
        ("POST", "/models/m/invoke", b"{}", []),
        ("PUT", "/invocations", b"", []),
        ("POST", "/ping", b"", []),
    ],
)
def test_the_fast_path_answers_as_the_asgi_app_does(connection, method, path, body, headers):
    expected = call(method, path, body, headers)
    head = [f"{method} {path} HTTP/1.1", "Host: t", f"Content-Length: {len(body)}"]
    head += [f"{name.decode()}: {value.decode()}" for name, value in headers]
    connection.send(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    status, response_headers, response_body = connection.read()
    assert (status, response_body) == (expected.status, expected.body)
    for name, value in expected.headers.items():
        assert response_headers[name.decode()] == value.decode()


def test_each_request_is_matched_to_its_route_once_on_either_path(monkeypatch, server, connection):
    """The protocol matches a request's route once and hands the match on; the ASGI app reads it rather
    than matching again (it matches only a path the protocol could not read: an escaped one)."""
    from smtriton.serve.http import routes

    matched: list[str] = []
    match = routes.route_of

    def counting(method: bytes | str, path: str) -> routes.Route:
        matched.append(path)
        return match(method, path)

    monkeypatch.setattr(protocol, "route_of", counting)
    monkeypatch.setattr(routes, "route_of", counting)
    sent = [
        get("/ping"),  # the fast path
        post("/invocations", b'{"inputs":[]}', "Content-Type: application/json"),  # the fast path
        post("/models/m/invoke", b"{}"),  # the fast path
        (b"PUT /invocations HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n"),  # the app: 405
        get("/execution-parameters"),  # the control app
        post("/invo%63ations", b'{"inputs":[]}', "Content-Type: application/json"),  # escaped: the app matches
    ]
    for request in sent:
        connection.send(request)
        connection.read()
    assert matched == [
        "/ping",
        "/invocations",
        "/models/m/invoke",
        "/invocations",
        "/execution-parameters",
        "/invocations",
    ]
    assert server.asgi_paths == ["/invocations", "/execution-parameters", "/invocations"]


def test_keep_alive_serves_many_requests_on_one_connection(server, connection):
    for i in range(3):
        connection.send(post("/invocations", b'{"i":%d}' % i, "Content-Type: application/json"))
        status, headers, _ = connection.read()
        assert (status, headers.get("connection")) == (200, None)
    connection.send(get("/ping"))
    assert connection.read()[:1] == (200,)
    assert server.bodies == [b'{"i":0}', b'{"i":1}', b'{"i":2}']
    assert server.asgi_paths == []  # all served by the fast path


def test_a_served_request_is_freed_with_its_answer_not_by_the_garbage_collector(server, connection):
    """A request's cycle, reader, task and scope are freed when the answer is out: none of them is left in
    a reference cycle for the collector's passes, which cost a worker some 3.5 µs a request."""
    body = b'{"inputs":[]}'
    gc.collect()
    gc.disable()  # what is left from now on stays until counted
    try:
        for _ in range(10):
            connection.send(post("/invocations", body, "Content-Type: application/json"))  # one read
            assert connection.read()[0] == 200
            connection.send(get("/ping"))  # its body never read
            assert connection.read()[0] == 200
            head = post("/invocations", b"", "Expect: 100-continue")  # the body waited for
            connection.send(head.replace(b"Content-Length: 0", b"Content-Length: %d" % len(body)))
            assert connection.read()[0] == 100
            connection.send(body)
            assert connection.read()[0] == 200
        alive = [obj for obj in gc.get_objects() if type(obj) is FastCycle]
    finally:
        gc.enable()
    assert len(alive) <= 1  # the connection's current cycle (ended or not), kept until its next request


def test_a_connection_is_closed_once_idle_for_the_keep_alive_timeout_and_not_while_in_use(triton):
    """One keep-alive timer lives across a connection's requests: requests closer together than the
    timeout keep the connection, and it closes a timeout after the last answer."""
    with Server(triton, keep_alive_s=TIMEOUT_S) as server:
        client = server.connect()
        started = time.monotonic()
        while time.monotonic() - started < 2.5 * TIMEOUT_S:
            client.send(post("/invocations", b"{}"))
            assert client.read()[0] == 200
            time.sleep(0.3 * TIMEOUT_S)
        idle_from = time.monotonic() - 0.3 * TIMEOUT_S
        assert client.closed_by_server()
        assert TIMEOUT_S - 0.05 <= time.monotonic() - idle_from < TIMEOUT_S + 1  # libuv timers: ms granularity
        client.close()
        assert len(server.bodies) >= 6


def test_pipelined_requests_are_answered_in_order_across_both_paths(server, connection):
    connection.send(
        post("/invocations", b'{"n":1}')
        + get("/models")  # the control plane (FastAPI), between two fast-path requests
        + post("/invocations", b'{"n":2}', "X-Amzn-SageMaker-Custom-Attributes: a=1")
        + get("/execution-parameters")
        + get("/ping")
    )
    answers = [connection.read() for _ in range(5)]
    assert [a[0] for a in answers] == [200, 200, 200, 200, 200]
    assert json_of(answers[1]) == {"models": []}
    assert "MaxConcurrentTransforms" in json_of(answers[3])
    assert answers[4][2] == b""
    first, second = server.bodies
    assert first == b'{"n":1}'
    assert orjson.loads(second) == {"n": 2, "parameters": {"sagemaker_custom_attributes": "a=1"}}
    assert server.asgi_paths == ["/models", "/execution-parameters"]


def test_100_continue_is_sent_before_the_body_is_read(server, connection):
    connection.send(
        post("/invocations", b"", "Expect: 100-continue").replace(b"Content-Length: 0", b"Content-Length: 7")
    )
    assert connection.read_line() == b"HTTP/1.1 100 Continue"
    assert connection.read_line() == b""
    connection.send(b'{"c":1}')
    assert connection.read()[0] == 200
    assert server.bodies == [b'{"c":1}']


def test_a_declared_body_over_the_limit_is_413_without_100_continue(server, connection):
    connection.send(
        post("/invocations", b"", "Expect: 100-continue").replace(b"Content-Length: 0", b"Content-Length: 5000")
    )
    status, _, body = connection.read()
    assert (status, json_of((status, {}, body))) == (
        413,
        {"error": "request body is larger than the limit of 1024 bytes"},
    )
    assert server.bodies == []


def test_a_chunked_body_is_delivered_whole(server, connection):
    connection.send(b"POST /invocations HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
    for piece in (b'{"a"', b":", b"[1,2,3]}"):
        connection.send(b"%x\r\n%s\r\n" % (len(piece), piece))
        time.sleep(0.01)
    connection.send(b"0\r\n\r\n")
    assert connection.read()[0] == 200
    assert server.bodies == [b'{"a":[1,2,3]}']


def test_a_chunked_body_over_the_limit_is_413_before_it_ends(server, connection):
    connection.send(b"POST /invocations HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
    connection.send(b"%x\r\n%s\r\n" % (600, b"x" * 600) * 2)  # 1,200 bytes, the stream not ended
    assert connection.read()[0] == 413
    assert server.bodies == []


def test_http_1_0_and_connection_close_get_one_answer_then_the_connection_closes(server):
    for request in (
        b"POST /invocations HTTP/1.0\r\nContent-Length: 2\r\n\r\n{}",
        post("/invocations", b"{}", "Connection: close"),
        b"GET /ping HTTP/1.0\r\n\r\n",
    ):
        client = server.connect()
        client.send(request)
        status, headers, _ = client.read()
        assert (status, headers["connection"]) == (200, "close")
        assert client.closed_by_server()
        client.close()


def test_a_client_that_leaves_mid_body_is_not_served_and_the_server_stays_healthy(server):
    client = server.connect()
    client.send(b"POST /invocations HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{")
    client.close()
    other = server.connect()
    other.send(get("/ping") + post("/invocations", b"{}"))
    assert [other.read()[0], other.read()[0]] == [200, 200]
    other.close()
    assert server.bodies == [b"{}"]


def test_query_strings_and_escaped_paths_reach_the_same_routes(server, connection):
    connection.send(post("/invocations?x=1", b"{}") + post("/models/a%20b/invoke", b"{}") + get("/ping?probe=1"))
    assert connection.read()[0] == 200
    status, _, body = connection.read()
    assert (status, json.loads(body)) == (404, {"error": "model 'a b' is not loaded"})
    assert connection.read()[:1] == (200,)
    assert server.asgi_paths == ["/models/a b/invoke"]  # escaped paths are left to the ASGI app


def test_a_model_s_custom_attributes_with_a_line_break_never_reach_the_header(server, connection):
    server.triton.answer = (200, b'{"parameters":{"sagemaker_custom_attributes":"a\\r\\nx-evil: 1"},"outputs":[]}')
    connection.send(post("/invocations", b"{}"))
    status, headers, _ = connection.read()
    assert status == 200
    assert "x-evil" not in headers
    assert "x-amzn-sagemaker-custom-attributes" not in headers


# ----- a malformed request after valid ones: answers in order, then the 400 ----------------------
GARBAGE = [
    b"GARBAGE\r\n\r\n",
    b"POST /invocations HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n",
    b"GET /ping HTTP/9.9\r\nHost: t\r\n\r\n",
]
VALID = {"fast": post("/invocations", b'{"v":1}'), "asgi": get("/models")}


@pytest.mark.parametrize("garbage", GARBAGE, ids=["request-line", "content-length", "version"])
@pytest.mark.parametrize("path", ["fast", "asgi"])
@pytest.mark.parametrize("writes", ["one write", "separate writes"])
def test_a_malformed_request_is_answered_400_after_every_valid_one_before_it(server, garbage, path, writes):
    server.triton.infer_delay_s = 0.3  # the valid request is still being answered when the garbage comes
    client = server.connect()
    if writes == "one write":
        client.send(VALID[path] + VALID[path] + garbage)
    else:
        client.send(VALID[path])
        client.send(VALID[path])
        time.sleep(0.05)
        client.send(garbage)
    first, second = client.read(), client.read()
    assert (first[0], second[0]) == (200, 200)
    assert refused(client.read(), 400) == "the request is not valid HTTP/1.1"
    assert client.closed_by_server()
    client.close()


def test_a_malformed_body_refuses_its_own_request_only_after_the_ones_before(server):
    server.triton.infer_delay_s = 0.3
    client = server.connect()
    chunked = b"POST /invocations HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"  # no hex size
    client.send(post("/invocations", b'{"v":1}') + chunked)
    assert client.read()[0] == 200
    assert refused(client.read(), 400) == "the request is not valid HTTP/1.1"
    assert client.closed_by_server()
    client.close()
    assert server.bodies == [b'{"v":1}']


# ----- request smuggling and sizes ----------------------------------------------------------------
@pytest.mark.parametrize(
    "head",
    [
        "Content-Length: 2\r\nTransfer-Encoding: chunked",
        "Content-Length: 2\r\nContent-Length: 3",
        "Transfer-Encoding: chunked, identity",
        "Transfer-Encoding : chunked",
        "Transfer-Encoding: xchunked",
    ],
    ids=["cl-and-te", "two-cl", "te-list", "te-space", "te-prefix"],
)
def test_ambiguous_framing_is_refused_before_anything_is_forwarded(server, connection, head):
    connection.send(f"POST /invocations HTTP/1.1\r\nHost: t\r\n{head}\r\n\r\n{{}}\r\n0\r\n\r\n".encode())
    assert refused(connection.read(), 400)
    assert connection.closed_by_server()
    assert server.bodies == []


def test_oversized_headers_are_431_as_soon_as_they_pass_the_limit(server):
    for head in (
        b"POST /invocations HTTP/1.1\r\nHost: t\r\n" + b"X-Many: y\r\n" * 300,  # many headers, no end sent
        b"POST /invocations HTTP/1.1\r\nHost: t\r\nX-Big: " + b"y" * 8000,  # one header line, never ended
    ):
        client = server.connect()
        client.send(head)
        assert refused(client.read(), 431) == "request headers are larger than the limit of 2048 bytes"
        assert client.closed_by_server()
        client.close()
    assert server.bodies == []


def test_a_huge_url_is_414_before_it_ends(server, connection):
    connection.send(b"GET /" + b"a" * 5000)
    assert refused(connection.read(), 414) == "request URL is longer than the limit of 2048 bytes"
    assert connection.closed_by_server()


# ----- slow clients ----------------------------------------------------------------------------
def test_slow_headers_are_408_and_do_not_hold_up_others(server):
    slow = server.connect()
    slow.send(b"POST /invocations HTTP/1.1\r\nHost: t\r\n")  # and nothing more
    started = time.monotonic()
    other = server.connect()
    other.send(post("/invocations", b"{}"))
    assert other.read()[0] == 200  # served meanwhile
    other.close()
    assert refused(slow.read(), 408) == f"request headers not received within {TIMEOUT_S:g} s"
    assert TIMEOUT_S - 0.05 <= time.monotonic() - started < TIMEOUT_S + 2  # libuv timers: ms granularity
    slow.close()


def test_a_body_paused_too_long_is_408_and_does_not_hold_up_others(server):
    slow = server.connect()
    slow.send(b"POST /invocations HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{")
    other = server.connect()
    other.send(post("/invocations", b"{}"))
    assert other.read()[0] == 200
    other.close()
    assert refused(slow.read(), 408) == f"request body paused for more than {TIMEOUT_S:g} s"
    assert server.bodies == [b"{}"]
    slow.close()


def test_a_body_pause_counts_from_its_last_piece(server):
    slow = server.connect()
    slow.send(b"POST /invocations HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{")
    for _ in range(3):
        time.sleep(0.6 * TIMEOUT_S)  # each pause shorter than the limit; together longer
        slow.send(b" ")
    last_piece = time.monotonic()
    assert refused(slow.read(), 408) == f"request body paused for more than {TIMEOUT_S:g} s"
    assert TIMEOUT_S - 0.05 <= time.monotonic() - last_piece < TIMEOUT_S + 1
    assert server.bodies == []
    slow.close()


def test_a_slowly_trickled_head_is_still_408_at_its_deadline(server):
    """A byte every half timeout keeps a connection busy but never resets the headers' deadline."""
    slow = server.connect()
    started = time.monotonic()
    slow.send(b"POST /invocations HTTP/1.1\r\nHost: t\r\n")
    slow.sock.settimeout(TIMEOUT_S / 4)
    for _ in range(3):
        try:
            slow.send(b"X")
        except OSError:
            break
        time.sleep(TIMEOUT_S / 2)
    slow.sock.settimeout(5)
    assert refused(slow.read(), 408)
    assert time.monotonic() - started < TIMEOUT_S + 1.5
    slow.close()


def test_a_body_that_trickles_is_408_at_the_whole_bodys_deadline(triton):
    """A byte every half pause never trips the pause's timer; the whole body's deadline still ends it,
    and the connections beside it are served meanwhile."""
    body_timeout = 2.5 * TIMEOUT_S
    with Server(triton, SETTINGS.model_copy(update={"body_timeout_s": body_timeout})) as server:
        slow = server.connect()
        slow.send(b"POST /invocations HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n")
        started = time.monotonic()
        slow.sock.settimeout(TIMEOUT_S / 4)
        while time.monotonic() - started < body_timeout + 2 and not answered(slow):
            try:
                slow.send(b" ")
            except OSError:
                break  # refused and closed
            time.sleep(TIMEOUT_S / 2)
        assert time.monotonic() - started < body_timeout + 1.5
        slow.sock.settimeout(5)
        assert refused(slow.read(), 408) == f"request body not received within {body_timeout:g} s"
        other = server.connect()
        other.send(post("/invocations", b"{}"))
        assert other.read()[0] == 200
        other.close()
        assert server.bodies == [b"{}"]
        slow.close()


def test_the_whole_bodys_deadline_is_sized_from_the_body_limit():
    assert Settings(max_payload_bytes=1 << 30, client_timeout_s=30).body_timeout_s == 30 + 256
    assert Settings(max_payload_bytes=6 << 20, client_timeout_s=30).body_timeout_s == 31.5
    assert Settings.from_env({"SMTRITON_BODY_TIMEOUT_S": "9"}).body_timeout_s == 9


def test_a_connection_that_never_sends_a_byte_is_closed(server):
    silent = server.connect()
    started = time.monotonic()
    assert silent.closed_by_server()
    assert TIMEOUT_S - 0.05 <= time.monotonic() - started < TIMEOUT_S + 2  # libuv timers: ms granularity
    silent.close()


# ----- answers before the body's end ------------------------------------------------------------
MORE = b" " * (8 << 20)  # what a client still sends after its answer: more than the socket buffers hold


def head(path: str = "/invocations", *headers: str, method: str = "POST") -> bytes:
    return ("\r\n".join([f"{method} {path} HTTP/1.1", "Host: t", *headers]) + "\r\n\r\n").encode()


def sends_to_its_end(client: Connection, more: bytes) -> bool:
    """The client writes ``more`` whole and closes its side, as a plain client writes its whole body
    before it reads the answer: False when the server reset the connection meanwhile."""
    try:
        client.sock.sendall(more)
        client.sock.shutdown(socket.SHUT_WR)
    except OSError:
        return False
    return True


def test_an_answer_before_the_body_ends_keeps_the_connection_once_the_rest_is_read(server, connection):
    connection.send(head("/invocations", "Content-Length: 5000"))
    status, headers, _ = connection.read()  # refused from the Content-Length, before the body
    assert (status, headers.get("connection")) == (413, None)
    connection.send(b"x" * 5000)  # read and dropped: the next request is read as one
    connection.send(post("/invocations", b"{}"))
    assert connection.read()[0] == 200
    assert server.bodies == [b"{}"]


@pytest.mark.parametrize(
    "sent",
    [
        head("/invocations", "Transfer-Encoding: chunked") + b"258\r\n" + b"x" * 600 + b"\r\n" * 2,  # 413
        head("/invocations", "Content-Length: 100000"),  # 413, past drain_bytes
        head("/invocations", "Content-Length: 2000", "Expect: 100-continue"),  # 413; the body may never come
        head("/invocations", "Content-Length: 5000", "Connection: close"),  # 413
        head("/invocations", "Content-Length: 5000", "Connection: close", "X-Amzn-SageMaker-Custom-Attributes: "
             + "a" * 1025),  # 400 before the body is read
        head("/invocations", "Content-Length: 100000", method="PUT"),  # 405 through ASGI
        head("/models", "Content-Length: 100000"),  # a load past its limit: 413 through ASGI
    ],
    ids=["chunked", "too-long-to-drain", "100-continue", "connection-close", "custom-attributes", "asgi", "load"],
)  # fmt: skip
def test_an_answer_before_a_body_that_is_not_read_says_close_and_reaches_a_client_still_sending(
    monkeypatch, server, sent
):
    """The connection lingers: the client writes the rest of its body whole and then reads its answer, as
    a plain client does (before, it was reset while writing)."""
    monkeypatch.setattr(protocol.EdgeProtocol, "drain_bytes", 50_000)
    client = server.connect()
    client.send(sent)
    while not answered(client):
        time.sleep(0.01)
    assert sends_to_its_end(client, MORE[:40_000])
    status, headers, body = client.read()
    assert status in (400, 405, 413)
    assert headers["connection"] == "close"
    assert json.loads(body)["error"]
    assert client.closed_by_server()
    client.close()
    assert server.bodies == []


@pytest.mark.parametrize(
    "sent",
    [
        head("/invocations", "X-Big: " + "y" * 3000, f"Content-Length: {len(MORE)}"),  # 431
        head("/invocations", "Content-Length: 1x"),  # 400: not valid HTTP/1.1
    ],
    ids=["431", "400"],
)
def test_a_refusal_reaches_a_client_still_sending(server, sent):
    client = server.connect()
    client.send(sent)
    while not answered(client):
        time.sleep(0.01)
    assert sends_to_its_end(client, MORE)
    assert refused(client.read(), 431 if b"X-Big" in sent else 400)
    assert client.closed_by_server()
    client.close()


def test_a_lingering_connection_is_closed_past_its_bytes_or_the_client_timeout(monkeypatch, server):
    monkeypatch.setattr(protocol.EdgeProtocol, "drain_bytes", 50_000)
    endless = server.connect()  # a body with no end, sent on and on
    endless.send(head("/invocations", "Transfer-Encoding: chunked") + b"%x\r\n%s\r\n" % (2000, b"x" * 2000))
    assert refused(endless.read(), 413)
    assert not sends_to_its_end(endless, MORE)  # reset past the bound
    endless.close()
    silent = server.connect()  # a client that stops sending and never closes
    silent.send(head("/invocations", "Content-Length: 100000"))
    assert refused(silent.read(), 413)
    answered_at = time.monotonic()
    silent.sock.settimeout(TIMEOUT_S + 3)
    with contextlib.suppress(ConnectionResetError):
        assert silent.stream.read(1) == b""
    assert time.monotonic() - answered_at < TIMEOUT_S + 1
    silent.close()


def test_a_body_that_trickles_after_its_answer_is_closed_at_the_client_timeout(server):
    """A body kept to be read and dropped must still end: one trickling after its answer holds nothing."""
    client = server.connect()
    client.send(head("/invocations", "Content-Length: 5000"))
    status, headers, _ = client.read()
    assert (status, headers.get("connection")) == (413, None)
    answered_at = time.monotonic()
    while time.monotonic() - answered_at < TIMEOUT_S + 2 and not answered(client):
        try:
            client.send(b"x")
        except OSError:
            break
        time.sleep(TIMEOUT_S / 5)
    assert time.monotonic() - answered_at < TIMEOUT_S + 1
    with contextlib.suppress(ConnectionResetError):
        assert client.closed_by_server()
    client.close()


# ----- pipelined requests: a read that ends inside a request's head ------------------------------
def pipelined_kinds(i: int) -> dict[str, bytes]:
    """Request ``i`` of a pipelined run, framed each way the header count must see past."""
    body = b'{"id":"%d","inputs":[]}' % i
    return {
        "pings": get("/ping"),
        "bodies": post("/invocations", body),
        # most of each body after a blank line in it: what precedes the next head is not a head's end
        "large bodies": post("/invocations", b'{\r\n\r\n"id":"%d","inputs":[]}%s' % (i, b" " * 7000)),
        "chunked": head("/invocations", "Transfer-Encoding: chunked")
        + b"%x\r\n%s\r\n1\r\n \r\n0\r\n\r\n" % (len(body), body),
    }


class _Unread(asyncio.Transport):
    """A connection's transport that takes what is written and is never read."""

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name in ("sockname", "peername") else default

    def write(self, data: Any) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def head_bytes_counted(reads: list[bytes]) -> tuple[int, bool]:
    """What the protocol counts of the head the last of ``reads`` ends inside, fed one by one to the
    fast path's protocol in this thread (no request is served), and whether it refused the connection."""

    class Parsing(data_protocol(DataPlane(SETTINGS, Metrics(enabled=False), "m"))):
        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            pass  # parsed only

    config = uvicorn.Config(app=lambda scope, receive, send: None, log_config=None)
    config.load()
    loop = asyncio.new_event_loop()
    try:
        parsing = Parsing(config=config, server_state=ServerState(), app_state={}, _loop=loop)
        parsing.connection_made(_Unread())
        for read in reads:
            parsing.data_received(read)
        assert parsing._in_head
        return parsing._head_received, parsing._refusal is not None
    finally:
        loop.close()


def test_a_read_that_ends_inside_a_head_counts_only_that_heads_own_bytes():
    """Wherever a read ends inside a head, after whatever came before it in the read (pipelined requests
    with no body, bodies of a declared length with blank lines in them, chunked bodies, a chunked body
    whose last piece is how the next head begins, a body read across reads), the header limit counts
    the bytes since that head began: before, it counted the whole read, and requests pipelined past
    three times the limit in one read were refused 431."""
    last_chunk = b"POST"  # a chunked body ending with the very bytes the next head begins with
    stream = [
        get("/ping"),
        post("/invocations", b"{}"),
        pipelined_kinds(2)["large bodies"],
        pipelined_kinds(3)["chunked"],
        head("/invocations", "Transfer-Encoding: chunked") + b"4\r\n%s\r\n0\r\n\r\n" % last_chunk,
        post("/invocations", b'{"id":"5"}\r\n\r\n', "X-Pad: " + "p" * 1500),  # the body ends with a blank line
        post("/invocations", b"POST /invocations HTTP/1.1\r\n"),  # the body looks like the next head
        get("/ping", "X-Pad: " + "p" * 1500),
        post("/invocations", b"{}"),
    ]
    starts = [sum(len(request) for request in stream[:at]) for at in range(len(stream) + 1)]
    data = b"".join(stream)
    checked = 0
    for at in range(1, len(stream)):
        start, head_length = starts[at], stream[at].index(b"\r\n\r\n") + 4
        # the read begins at that request, at the one before it, in the middle of the one before it
        for read_from in sorted({start, starts[at - 1], (starts[at - 1] + start) // 2, 0}):
            for cut in range(start + 1, start + head_length, 7 if head_length > 200 else 1):
                reads = [data[:read_from], data[read_from:cut]] if read_from else [data[:cut]]
                counted, refused = head_bytes_counted(reads)
                assert (counted, refused) == (cut - start, False), (at, read_from, cut)
                checked += 1
    assert checked > 1000


@pytest.mark.parametrize("kind", list(pipelined_kinds(0)))
@pytest.mark.parametrize("cut", [3, 40, -2], ids=["in the method", "in a header", "in the blank line"])
def test_pipelined_requests_past_the_header_limit_in_one_read_are_all_answered_in_order(triton, kind, cut):
    """A run of pipelined requests, three times the header limit and more, ends inside a head; the rest of
    that head comes in the next read. Every request is answered, in order: none is refused 431."""
    requests = []
    while sum(len(request) for request in requests) < 5 * SETTINGS.max_header_bytes:
        requests.append(pipelined_kinds(len(requests))[kind])
    last = post("/invocations", b'{"id":"last","inputs":[]}', "X-Pad: " + "p" * 1000)
    sent = b"".join(requests) + last
    split = len(sent) - len(last) + (cut if cut > 0 else last.index(b"\r\n\r\n") + 4 + cut)
    with Server(triton, SETTINGS.model_copy(update={"max_payload_bytes": 64 << 10})) as server:
        client = server.connect()
        client.send(sent[:split])
        time.sleep(0.1)  # read apart: the first read ends inside the last request's head
        client.send(sent[split:])
        answers = [client.read() for _ in range(len(requests) + 1)]
        client.close()
    assert [status for status, _, _ in answers] == [200] * len(answers)
    if kind != "pings":
        ids = [orjson.loads(body)["id"] for _, _, body in answers]
        assert ids == [str(i) for i in range(len(requests))] + ["last"]


def test_a_head_past_the_limit_after_pipelined_requests_is_still_431_after_their_answers(server):
    """Counting a head from its own first byte lets no head grow past the limit: one that never ends, sent
    after pipelined requests in the same write, is refused once their answers are out."""
    client = server.connect()
    pipelined = b"".join(post("/invocations", b'{"id":"%d","inputs":[]}' % i) for i in range(10))
    client.send(pipelined + b"POST /invocations HTTP/1.1\r\nHost: t\r\nX-Big: " + b"y" * 8000)
    assert [client.read()[0] for _ in range(10)] == [200] * 10
    assert refused(client.read(), 431) == "request headers are larger than the limit of 2048 bytes"
    assert client.closed_by_server()
    client.close()


# ----- which uvicorn the fast path runs on --------------------------------------------------------
def _probe(cls: type) -> object:
    """An instance of ``cls`` with the attributes its constructor sets (uvicorn's own arguments)."""
    if cls is HttpToolsProtocol:
        from uvicorn.server import ServerState

        config = uvicorn.Config(app=lambda scope, receive, send: None, log_config=None)
        config.load()
        loop = asyncio.new_event_loop()  # the protocol only keeps it; no connection is made
        try:
            return HttpToolsProtocol(config=config, server_state=ServerState(), app_state={}, _loop=loop)
        finally:
            loop.close()
    scope: Any = {"type": "http"}
    logger = logging.getLogger("test")
    return cls(
        scope=scope, transport=None, flow=None, logger=logger, access_logger=logger, access_log=False,
        default_headers=[], message_event=asyncio.Event(), expect_100_continue=False, keep_alive=True,
        on_response=lambda: None,
    )  # fmt: skip


def test_every_uvicorn_internal_the_fast_path_reads_is_there():
    """Fails loudly when a uvicorn release moves what the fast path relies on: pyproject.toml pins the
    release; update TESTED_UVICORN and UVICORN_INTERNALS (smtriton/serve/http/fastpath.py) only after the
    fast path works on another."""
    missing = [
        f"{cls.__name__}.{name}"
        for cls, names in UVICORN_INTERNALS.items()
        for name in names
        if not hasattr(_probe(cls), name) and not hasattr(cls, name)
    ]
    assert missing == []
    assert ".".join(uvicorn.__version__.split(".")[:2]) in TESTED_UVICORN
    plane = DataPlane(SETTINGS, Metrics(False), "m")
    assert issubclass(data_protocol(plane), DataProtocol)
    config = http_server(plane).config
    assert issubclass(config.http, DataProtocol)  # header sizes are the protocol's to check


def test_a_client_that_leaves_while_triton_works_cancels_the_request_upstream(triton, caplog):
    triton.infer_delay_s = 1.0
    with Server(triton) as server:
        client = server.connect()
        client.send(post("/invocations", b'{"inputs":[]}'))
        deadline = time.monotonic() + 5
        while not server.bodies:  # the request reached Triton
            assert time.monotonic() < deadline
            time.sleep(0.01)
        client.close()  # the client gives up before Triton answers
        deadline = time.monotonic() + 5
        while triton.infers_abandoned == 0:
            assert time.monotonic() < deadline, "the front kept its call to Triton after its client left"
            time.sleep(0.05)
        after = server.connect()  # and the server goes on
        after.send(get("/ping"))
        assert after.read()[0] == 200
        after.close()
    assert "Exception in the data route" not in caplog.text  # a client leaving is no error of serve's
