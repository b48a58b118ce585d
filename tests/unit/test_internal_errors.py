"""A bug inside serve answers 500 with a JSON body, on the data routes and in the control app alike,
and the next request is served normally (the real app and data plane, a fault put into the plane;
for the protocol's fast path, real sockets and a fault put into its request cycle)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from smtriton.serve.dataplane.plane import DataPlane
from smtriton.serve.dataplane.sending.upstream import Upstream
from smtriton.serve.errors import INTERNAL_ERROR
from smtriton.serve.http import fastpath
from smtriton.serve.http.app import create_app
from tests.unit.test_protocol import Server, get, post
from tests.unit.triton_stand_in import TritonStandIn, asgi_call, serving_plane, stand_in_thread


def _once(fail: str, monkeypatch, owner: type = Upstream) -> None:
    """Make ``owner``'s ``fail`` method (the data plane's way to Triton by default) raise a bug once,
    then work again."""
    real = getattr(owner, fail)
    calls = []

    async def buggy(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(owner, fail, buggy)


def _twice(method: str, path: str, body: bytes = b"") -> list[tuple[int, dict[bytes, bytes], bytes]]:
    async def scenario() -> list[tuple[int, dict[bytes, bytes], bytes]]:
        async with TritonStandIn().running() as triton:
            plane = serving_plane(triton)
            app = create_app(plane)
            answers = []
            headers = [(b"content-type", b"application/json")]
            for _ in range(2):  # Starlette re-raises a bug after answering it, for the server's log
                answers.append(await asgi_call(app, method, path, body, headers, reraised=RuntimeError))
            await plane.close()
            return answers

    return asyncio.run(scenario())


def test_the_data_routes_answer_a_bug_with_json_500_and_go_on(caplog, monkeypatch):
    _once("infer", monkeypatch)
    (status, headers, payload), (second, _, _) = _twice("POST", "/invocations", b'{"inputs":[]}')
    assert (status, headers[b"content-type"], json.loads(payload)) == (
        500,
        b"application/json",
        {"error": INTERNAL_ERROR},
    )
    assert "RuntimeError: a bug" in caplog.text  # the traceback is logged, never the body
    assert second == 200


def test_the_control_app_answers_a_bug_with_json_500_and_goes_on(monkeypatch):
    _once("instance_count", monkeypatch)
    (status, headers, payload), (second, _, answer) = _twice("GET", "/execution-parameters")
    assert (status, headers[b"content-type"], json.loads(payload)) == (
        500,
        b"application/json",
        {"error": INTERNAL_ERROR},
    )
    assert second == 200
    assert json.loads(answer)["MaxConcurrentTransforms"] == 2  # the stand-in's model has two instances


def _fails_once(owner: object, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the callable ``owner.name`` raise a bug once, then work again."""
    real = getattr(owner, name)
    calls = []

    def buggy(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, buggy)


@pytest.fixture
def server() -> Iterator[Server]:
    with stand_in_thread() as triton, Server(triton) as running:
        yield running


@pytest.mark.parametrize(
    ("request_bytes", "owner", "name"),
    [
        (post("/invocations", b"{}"), fastpath, "request_of"),  # the fast cycle reads the request's headers
        (get("/ping"), DataPlane, "ping_status"),
    ],
    ids=["invocations", "ping"],
)
def test_the_fast_path_answers_a_bug_in_its_cycle_with_json_500_and_goes_on(
    server, caplog, monkeypatch, request_bytes, owner, name
):
    """The fault is outside :meth:`DataPlane.invoke`'s own catch: the fast cycle's last resort answers."""
    _fails_once(owner, name, monkeypatch)
    client = server.connect()
    client.send(request_bytes)
    status, headers, payload = client.read()
    assert (status, headers["content-type"], json.loads(payload)) == (
        500,
        "application/json",
        {"error": INTERNAL_ERROR},
    )
    assert headers["connection"] == "close"
    assert client.closed_by_server()
    client.close()
    assert "RuntimeError: a bug" in caplog.text  # logged with its traceback
    assert server.bodies == []  # nothing reached Triton
    again = server.connect()
    again.send(request_bytes)
    assert again.read()[0] == 200
    again.close()
    assert server.asgi_paths == []  # both were the fast path's: the ASGI app never saw them
