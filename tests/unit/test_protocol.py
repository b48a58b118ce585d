"""The HTTP server's fast path for the data routes, over real sockets, in-process with a fake data plane.

uvicorn runs with `serve`'s protocol on an ephemeral loopback port in a thread. The tests speak raw
HTTP/1.1 so that keep-alive, pipelining, 100-continue, chunked bodies, limits and disconnects are what
a client really sends; the differential test holds the fast path to the ASGI app's answers.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from smtriton.serve.app import create_app
from smtriton.serve.protocol import data_protocol
from smtriton.serve.triton.client import UpstreamResponse
from tests.unit.fake_plane import FakePlane, call

Response = tuple[int, dict[str, str], bytes]


class Server:
    def __init__(self, plane: FakePlane) -> None:
        self.plane = plane
        app = create_app(plane)  # type: ignore[arg-type]
        self.asgi_paths: list[str] = []  # what reached the ASGI app rather than the fast path

        async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
            self.asgi_paths.append(scope["path"])
            await app(scope, receive, send)

        config = uvicorn.Config(asgi, http=data_protocol(app), lifespan="off", log_config=None, timeout_keep_alive=5)
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


@pytest.fixture
def server() -> Iterator[Server]:
    with Server(FakePlane()) as running:
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


def json_of(response: Response) -> object:
    return json.loads(response[2])


@pytest.mark.parametrize(
    ("method", "path", "body", "headers"),
    [
        ("GET", "/ping", b"", []),
        ("POST", "/invocations", b'{"inputs":[]}', [(b"content-type", b"application/json")]),
        ("POST", "/invocations", b"x" * 1025, []),
        ("POST", "/invocations", b"{}", [(b"x-big", b"y" * 3000)]),
        ("POST", "/invocations", gzip.compress(b"{}"), [(b"content-encoding", b"gzip")]),
        ("POST", "/invocations", b"{}", [(b"content-encoding", b"br")]),
        ("POST", "/models/m/invoke", b"{}", []),
        ("PUT", "/invocations", b"", []),
        ("POST", "/ping", b"", []),
    ],
)
def test_the_fast_path_answers_as_the_asgi_app_does(connection, method, path, body, headers):
    expected_status, expected_headers, expected_body = call(FakePlane(), method, path, body, headers)
    head = [f"{method} {path} HTTP/1.1", "Host: t", f"Content-Length: {len(body)}"]
    head += [f"{name.decode()}: {value.decode()}" for name, value in headers]
    connection.send(("\r\n".join(head) + "\r\n\r\n").encode() + body)
    status, response_headers, response_body = connection.read()
    assert (status, response_body) == (expected_status, expected_body)
    for name, value in expected_headers.items():
        assert response_headers[name.decode()] == value.decode()


def test_keep_alive_serves_many_requests_on_one_connection(server, connection):
    for i in range(3):
        connection.send(post("/invocations", b'{"i":%d}' % i, "Content-Type: application/json"))
        status, headers, _ = connection.read()
        assert (status, headers.get("connection")) == (200, None)
    connection.send(get("/ping"))
    assert connection.read()[:1] == (200,)
    assert [seen[1] for seen in server.plane.seen] == [b'{"i":0}', b'{"i":1}', b'{"i":2}']
    assert server.asgi_paths == []  # all served by the fast path


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
    assert "MaxConcurrentTransforms" in json_of(answers[3])  # type: ignore[operator]
    assert answers[4][2] == b""
    assert [(seen[1], seen[3]) for seen in server.plane.seen] == [(b'{"n":1}', None), (b'{"n":2}', "a=1")]
    assert server.asgi_paths == ["/models", "/execution-parameters"]


def test_100_continue_is_sent_before_the_body_is_read(server, connection):
    connection.send(
        post("/invocations", b"", "Expect: 100-continue").replace(b"Content-Length: 0", b"Content-Length: 7")
    )
    assert connection.read_line() == b"HTTP/1.1 100 Continue"
    assert connection.read_line() == b""
    connection.send(b'{"c":1}')
    assert connection.read()[0] == 200
    assert server.plane.seen[0][1] == b'{"c":1}'


def test_a_declared_body_over_the_limit_is_413_without_100_continue(server, connection):
    connection.send(
        post("/invocations", b"", "Expect: 100-continue").replace(b"Content-Length: 0", b"Content-Length: 5000")
    )
    status, _, body = connection.read()
    assert (status, json_of((status, {}, body))) == (
        413,
        {"error": "request body is larger than the limit of 1024 bytes"},
    )
    assert server.plane.seen == []


def test_a_chunked_body_is_delivered_whole(server, connection):
    connection.send(b"POST /invocations HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
    for piece in (b'{"a"', b":", b"[1,2,3]}"):
        connection.send(b"%x\r\n%s\r\n" % (len(piece), piece))
        time.sleep(0.01)
    connection.send(b"0\r\n\r\n")
    assert connection.read()[0] == 200
    assert server.plane.seen[0][1] == b'{"a":[1,2,3]}'


def test_a_chunked_body_over_the_limit_is_413_before_it_ends(server, connection):
    connection.send(b"POST /invocations HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
    connection.send(b"%x\r\n%s\r\n" % (600, b"x" * 600) * 2)  # 1,200 bytes, the stream not ended
    assert connection.read()[0] == 413
    assert server.plane.seen == []


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
    time.sleep(0.05)
    client.close()
    time.sleep(0.05)
    other = server.connect()
    other.send(get("/ping") + post("/invocations", b"{}"))
    assert [other.read()[0], other.read()[0]] == [200, 200]
    other.close()
    assert [seen[1] for seen in server.plane.seen] == [b"{}"]


def test_query_strings_and_escaped_paths_reach_the_same_routes(server, connection):
    connection.send(post("/invocations?x=1", b"{}") + post("/models/a%20b/invoke", b"{}") + get("/ping?probe=1"))
    assert connection.read()[0] == 200
    status, _, body = connection.read()
    assert (status, json.loads(body)) == (404, {"error": "model 'a b' is not loaded"})
    assert connection.read()[:1] == (200,)
    assert server.asgi_paths == ["/models/a b/invoke"]  # escaped paths are left to the ASGI app


def test_a_model_s_custom_attributes_with_a_line_break_never_reach_the_header(server, connection):
    async def infer(model, body, content_type, attributes):  # a model answering with a header injection
        payload = b'{"parameters":{"sagemaker_custom_attributes":"a\\r\\nx-evil: 1"},"outputs":[]}'
        return UpstreamResponse(200, "application/json", None, payload)

    server.plane.infer = infer
    connection.send(post("/invocations", b"{}"))
    status, headers, _ = connection.read()
    assert status == 200
    assert "x-evil" not in headers
    assert "x-amzn-sagemaker-custom-attributes" not in headers
