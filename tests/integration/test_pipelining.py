"""Requests pipelined on one connection, written at once, against the real serve + Triton with one worker
(the HTTP protocol's header count, smtriton/serve/http/protocol.py).

3,000 requests go out in one stream while the client reads the answers; reads of the server then end
inside request heads, after hundreds of whole requests. Each answer must come, in order: before, the
whole read was counted as the head it ended in, and after some 2,500 answers a false 431 "headers
larger than 65536" closed the connection and the rest were never answered. Meanwhile ``/ping`` is asked
every 20 ms on a connection of its own, and the worker's peak memory is measured.
"""

from __future__ import annotations

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
from tests.integration.harness import ServeProcess, Watch, worker_pids

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


def test_thousands_of_requests_pipelined_at_once_are_all_answered_in_order(server):
    sent = b"".join(_request(i) for i in range(REQUESTS))
    client = socket.create_connection(("127.0.0.1", server.port), timeout=120)
    stream = client.makefile("rb")
    # written at once, while the answers are read: a client that read nothing until it had written all
    # would stop the server writing its answers, and so reading on
    writer = threading.Thread(target=client.sendall, args=(sent,))
    started = time.monotonic()
    with Watch(server, PING_EVERY_S) as pinging:
        writer.start()
        answers = _answers(stream, REQUESTS)
        writer.join(60)
    took = time.monotonic() - started
    stream.close()
    client.close()
    grew = pinging.grew

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
    assert worker_pids(server) == [pinging.worker]
    assert pinging.slowest < SLOWEST_PING_S, f"/ping took {pinging.slowest:.2f} s meanwhile"
    assert grew < MOST_GROWTH, f"the worker grew {grew >> 20} MiB"
    assert "Traceback" not in server.log_text()
    print(f"{REQUESTS} pipelined answers in {took:.1f} s; slowest /ping {pinging.slowest * 1000:.0f} ms; "
          f"worker peak +{grew >> 20} MiB")  # fmt: skip
