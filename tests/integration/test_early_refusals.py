"""Answers given before a request's body has ended reach a client still sending it (the HTTP protocol's
lingering close and drain, smtriton/serve/http/protocol.py), against the real serve + Triton.

A 32 MiB request is refused early, for each reason it may be, many times in a row on fresh connections,
by a plain client: http.client gives up at its first failed write, so a connection closed while it still
sends (the kernel then resets it) loses the answer. Each refusal must arrive whole every time, and the
server stays healthy.
"""

from __future__ import annotations

import http.client
import json
import shutil
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
import requests

from smtriton.serve import headers
from tests.integration.conftest import start_serve
from tests.integration.harness import ServeProcess, worker_pids

pytestmark = pytest.mark.integration

LARGE_MODELS = Path(__file__).parent / "models_large"
LIMIT = 32 << 20  # the server's body limit
ROUNDS = 25  # each refusal, on a fresh connection every time
ROUNDS_WITHIN_S = 90  # all rounds of one refusal, on this 2-core machine shared with Triton


def _request(size: int) -> bytes:
    """A JSON request for the ``total`` model, ``size`` bytes long: a 2 MiB ``id`` (outside its data), then
    FP32 values."""
    head = b'{"id":"' + b"x" * (2 << 20) + b'","inputs":[{"name":"VALUES","shape":[%d],"datatype":"FP32","data":['
    count = (size - len(head) - 16) // 4
    head %= count
    body = head + b"0.5," * (count - 1) + b"0.5]}]}"
    return body + b" " * (size - len(body))


JUST_UNDER = _request(LIMIT - 1024)  # within the limit: refused once read, for its JSON outside the data
OVER = _request(LIMIT + 1024)  # past the limit: refused from its Content-Length, before its body


class Refusal(NamedTuple):
    body: bytes
    headers: dict[str, str]
    status: int
    error: str  # how its JSON error begins
    kept: bool | None  # whether its answer keeps the connection (None: either, as the timing has it)
    method: str = "POST"
    chunked: bool = False


REFUSALS = {
    "413 for the JSON outside its data": Refusal(
        JUST_UNDER, {}, 413, "the JSON of this request outside its inputs' data is over 1 MiB", True
    ),
    "413 for the JSON outside its data, Connection: close": Refusal(
        JUST_UNDER, {"Connection": "close"}, 413, "the JSON of this request outside its inputs' data", False
    ),
    "413 for its size": Refusal(OVER, {}, 413, f"request body is larger than the limit of {LIMIT} bytes", True),
    "413 for its size, Connection: close": Refusal(
        OVER, {"Connection": "close"}, 413, "request body is larger than the limit", False
    ),
    # refused once past the limit, near its end: kept if the rest came before the answer went out
    "413 for its size, chunked": Refusal(OVER, {}, 413, "request body is larger than the limit", None, chunked=True),
    "400 for a header, Connection: close": Refusal(
        OVER,
        {headers.CUSTOM_ATTRIBUTES: "a" * (headers.CUSTOM_ATTRIBUTES_MAX + 1), "Connection": "close"},
        400,
        f"{headers.CUSTOM_ATTRIBUTES} is",
        False,
    ),
    "405 through ASGI, Connection: close": Refusal(
        OVER, {"Connection": "close"}, 405, "Method Not Allowed", False, method="PUT"
    ),
    "400 for an invalid Content-Length": Refusal(
        OVER, {"Content-Length": "1x"}, 400, "the request is not valid HTTP/1.1", False
    ),
    "431 for its headers": Refusal(OVER, {"X-Padding": "y" * (80 << 10)}, 431, "request headers are larger", False),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("early")
    shutil.copytree(LARGE_MODELS, tmp / "models")
    env = {"SAGEMAKER_MODEL_SERVER_WORKERS": "1", "SMTRITON_MAX_PAYLOAD_BYTES": str(LIMIT)}
    running = start_serve(tmp, tmp / "models", "total", env=env)
    yield running
    running.stop()


def _pieces(body: bytes) -> Iterable[bytes]:
    return (body[at : at + (1 << 20)] for at in range(0, len(body), 1 << 20))


def _send(server: ServeProcess, refusal: Refusal) -> str:
    """One refused request on a fresh connection, and a ping on it when its answer keeps it: what went
    wrong, or ""."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        body: bytes | Iterable[bytes] = _pieces(refusal.body) if refusal.chunked else refusal.body
        try:
            connection.request(
                refusal.method, "/invocations", body, {"Content-Type": "application/json", **refusal.headers}
            )
            answer = connection.getresponse()
            status, closes, text = answer.status, answer.will_close, answer.read()
        except OSError as exc:
            return f"lost: {exc!r}"
        error = json.loads(text).get("error", "") if answer.getheader("content-type") == "application/json" else ""
        if (status, error[: len(refusal.error)]) != (refusal.status, refusal.error):
            return f"answered {status} {text[:200]!r}"
        if refusal.kept is not None and closes == refusal.kept:
            return f"Connection: close {'said' if closes else 'not said'}"
        if not closes:  # the rest of the body was read and dropped: the next request is read as one
            connection.request("GET", "/ping")
            ping = connection.getresponse()
            ping.read()
            if ping.status != 200:
                return f"the next request on the connection was answered {ping.status}"
        return ""
    finally:
        connection.close()


@pytest.mark.parametrize("name", list(REFUSALS))
def test_an_early_refusal_of_a_32_mib_request_reaches_its_client_every_time(server, name):
    refusal = REFUSALS[name]
    (worker,) = worker_pids(server)
    started = time.monotonic()
    outcomes = [_send(server, refusal) for _ in range(ROUNDS)]
    assert [outcome for outcome in outcomes if outcome] == []
    assert time.monotonic() - started < ROUNDS_WITHIN_S
    assert requests.get(f"{server.url}/ping", timeout=5).status_code == 200
    request = b'{"inputs":[{"name":"VALUES","shape":[3],"datatype":"FP32","data":[1,2,3.5]}]}'
    answer = requests.post(f"{server.url}/invocations", data=request, timeout=30)
    assert answer.status_code == 200, answer.text
    assert {o["name"]: o["data"] for o in answer.json()["outputs"]} == {"SUM": [6.5], "COUNT": [3]}
    assert worker_pids(server) == [worker]
    assert "Traceback" not in server.log_text()
