"""A bug inside serve answers 500 with a JSON body, on the raw data routes and in the control app alike,
and the next request is served normally."""

from __future__ import annotations

import asyncio
import contextlib
import json

from smtriton.serve.app import create_app, create_control_app
from smtriton.serve.errors import INTERNAL_ERROR
from smtriton.serve.metrics import Metrics
from smtriton.serve.settings import Settings
from smtriton.serve.triton.client import UpstreamResponse


class BuggyPlane:
    """Just what the routes use of the data plane; ``infer`` and ``instance_count`` fail unexpectedly
    once, then answer."""

    def __init__(self) -> None:
        self.settings = Settings.from_env({})
        self.metrics = Metrics(enabled=False)
        self.default_model = "m"
        self.multi_model = False
        self.decoupled = False
        self.healthy = True
        self.calls = 0

    def sme_model(self) -> str:
        return "m"

    async def infer(self, model, body, content_type, attributes) -> UpstreamResponse:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("a bug")
        return UpstreamResponse(200, "application/json", None, b'{"outputs":[]}')

    async def instance_count(self) -> int:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("a bug")
        return 1


def call(
    app, body: bytes = b'{"inputs":[]}', method: str = "POST", path: str = "/invocations"
) -> tuple[int, dict[bytes, bytes], bytes]:
    """One request through an ASGI app, as uvicorn would make it."""
    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": [(b"content-type", b"application/json")], "http_version": "1.1",
             "scheme": "http", "server": ("127.0.0.1", 8080), "client": ("127.0.0.1", 1), "root_path": ""}  # fmt: skip
    messages: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict) -> None:
        messages.append(message)

    async def run() -> None:
        with contextlib.suppress(RuntimeError):  # Starlette re-raises after answering, for the server's log
            await app(scope, receive, send)

    asyncio.run(run())
    start = next(m for m in messages if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), payload


def test_the_data_routes_answer_a_bug_with_json_500_and_go_on(caplog):
    app = create_app(BuggyPlane())  # type: ignore[arg-type]
    status, headers, payload = call(app)
    assert (status, headers[b"content-type"], json.loads(payload)) == (
        500,
        b"application/json",
        {"error": INTERNAL_ERROR},
    )
    assert "RuntimeError: a bug" in caplog.text  # the traceback is logged, never the body
    assert call(app)[0] == 200


def test_the_control_app_answers_a_bug_with_json_500_and_goes_on():
    app = create_control_app(BuggyPlane())  # type: ignore[arg-type]
    status, headers, payload = call(app, method="GET", path="/execution-parameters")
    assert (status, headers[b"content-type"], json.loads(payload)) == (
        500,
        b"application/json",
        {"error": INTERNAL_ERROR},
    )
    assert call(app, method="GET", path="/execution-parameters")[0] == 200
