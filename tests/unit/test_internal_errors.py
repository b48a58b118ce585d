"""A bug inside serve answers 500 with a JSON body, on the data routes and in the control app alike,
and the next request is served normally (the real app and data plane, a fault put into the plane)."""

from __future__ import annotations

import asyncio
import json

from smtriton.serve.app import create_app
from smtriton.serve.dataplane import DataPlane
from smtriton.serve.errors import INTERNAL_ERROR
from tests.unit.triton_stand_in import TritonStandIn, asgi_call, serving_plane


def _once(fail: str, monkeypatch) -> None:
    """Make the data plane's ``fail`` method raise a bug once, then work again."""
    real = getattr(DataPlane, fail)
    calls = []

    async def buggy(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        return await real(self, *args, **kwargs)

    monkeypatch.setattr(DataPlane, fail, buggy)


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
