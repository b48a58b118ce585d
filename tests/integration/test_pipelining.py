"""Requests pipelined on one connection, written at once, against the real serve + Triton with one worker
(the HTTP protocol's header count, smtriton/serve/http/protocol.py).

3,000 requests go out in one stream while the client reads the answers; reads of the server then end
inside request heads, after hundreds of whole requests. Each answer must come, in order: before, the
whole read was counted as the head it ended in, and after some 2,500 answers a false 431 "headers
larger than 65536" closed the connection and the rest were never answered. Meanwhile ``/ping`` is asked
every 20 ms on a connection of its own, and the worker's peak memory is measured.
"""

from __future__ import annotations

import http.client
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import orjson
import pytest

from tests.integration.conftest import start_serve
from tests.integration.harness import ServeProcess, worker_pids

pytestmark = pytest.mark.integration

LARGE_MODELS = Path(__file__).parent / "models_large"
REQUESTS = 3000
PING_EVERY_S = 0.02
SLOWEST_PING_S = 1.0  # on this 2-core machine, shared with Triton and the client
MOST_GROWTH = 256 << 20  # what the worker's peak resident memory may grow by meanwhile
USER_AGENT = b"python-requests/2.32.3 (pipelining; smtriton tests)"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("pipelining")
    shutil.copytree(LARGE_MODELS, tmp / "models")
    running = start_serve(tmp, tmp / "models", "total", env={"SAGEMAKER_MODEL_SERVER_WORKERS": "1"})
    yield running
    running.stop()


def _request(i: int) -> bytes:
    """Request ``i``: a ping every tenth, a chunked body every tenth, else a body of declared length; an
    inference's answer is its own number (the ``total`` model sums its values)."""
    usual = b"Host: 127.0.0.1\r\nUser-Agent: %s\r\nAccept: */*\r\nAccept-Encoding: gzip, deflate\r\n" % USER_AGENT
    usual += b"X-Request-Id: %032x\r\n" % i  # heads of some 250 bytes, as clients send
    if i % 10 == 9:
        return b"GET /ping HTTP/1.1\r\n" + usual + b"\r\n"
    body = b'{"inputs":[{"name":"VALUES","shape":[1],"datatype":"FP32","data":[%d]}]}' % i
    head = b"POST /invocations HTTP/1.1\r\n" + usual + b"Content-Type: application/json\r\n"
    if i % 10 == 4:
        half = len(body) // 2
        chunks = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, body[:half], len(body) - half, body[half:])
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


def _answers(stream: BinaryIO, count: int) -> list[tuple[int, bytes]]:
    """``count`` answers read in order from ``stream`` (a buffered socket file); fewer if it closes."""
    answers: list[tuple[int, bytes]] = []
    for _ in range(count):
        status_line = stream.readline()
        if not status_line:
            break
        length = 0
        while (line := stream.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        answers.append((int(status_line.split()[1]), stream.read(length)))
    return answers


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


class Pinging:
    """``/ping`` every 20 ms on a connection of its own while the block runs: ``slowest``, the longest answer."""

    def __init__(self, server: ServeProcess) -> None:
        self.server = server
        self.pings: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._ping)

    def __enter__(self) -> Pinging:
        self._thread.start()
        return self

    def _ping(self) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                connection.request("GET", "/ping")
                response = connection.getresponse()
                response.read()
                self.pings.append(time.monotonic() - started if response.status == 200 else float("inf"))
            except OSError:
                self.pings.append(float("inf"))
                connection.close()
            time.sleep(PING_EVERY_S)
        connection.close()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)
        self.slowest = max(self.pings, default=float("inf"))


def test_thousands_of_requests_pipelined_at_once_are_all_answered_in_order(server):
    (worker,) = worker_pids(server)
    Path(f"/proc/{worker}/clear_refs").write_text("5")  # the worker's peak memory counts from now
    before = _status_kib(worker, "VmRSS") << 10
    sent = b"".join(_request(i) for i in range(REQUESTS))
    client = socket.create_connection(("127.0.0.1", server.port), timeout=120)
    stream = client.makefile("rb")
    # written at once, while the answers are read: a client that read nothing until it had written all
    # would stop the server writing its answers, and so reading on
    writer = threading.Thread(target=client.sendall, args=(sent,))
    started = time.monotonic()
    with Pinging(server) as pinging:
        writer.start()
        answers = _answers(stream, REQUESTS)
        writer.join(60)
    took = time.monotonic() - started
    stream.close()
    client.close()
    grew = (_status_kib(worker, "VmHWM") << 10) - before

    assert len(answers) == REQUESTS, f"{len(answers)} answers, the last {answers[-1] if answers else None}"
    wrong = []
    for i, (status, body) in enumerate(answers):
        if i % 10 == 9:
            expected: tuple[int, object] = (200, b"")
            got: tuple[int, object] = (status, body)
        else:
            expected = (200, float(i))
            got = (status, orjson.loads(body)["outputs"][0]["data"][0] if status == 200 else body[:200])
        if got != expected:
            wrong.append((i, got))
    assert wrong == []
    assert worker_pids(server) == [worker]
    assert pinging.slowest < SLOWEST_PING_S, f"/ping took {pinging.slowest:.2f} s meanwhile"
    assert grew < MOST_GROWTH, f"the worker grew {grew >> 20} MiB"
    assert "Traceback" not in server.log_text()
    print(f"{REQUESTS} pipelined answers in {took:.1f} s; slowest /ping {pinging.slowest * 1000:.0f} ms; "
          f"worker peak +{grew >> 20} MiB")  # fmt: skip
