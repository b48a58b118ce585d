"""A bug inside serve answers 500 with a JSON body, on the raw fast path and in the FastAPI app alike,
and the next request is served normally."""

from __future__ import annotations

import asyncio
import contextlib
import json
import types

from smtriton.serve.app import create_app
from smtriton.serve.errors import INTERNAL_ERROR
from smtriton.serve.fastpath import FastPath
from smtriton.serve.metrics import Metrics
from smtriton.serve.settings import Settings
from smtriton.serve.triton.client import UpstreamResponse


class BuggyEngine:
    """Just what the /invocations routes use; ``forward`` fails unexpectedly once, then answers."""

    def __init__(self) -> None:
        self.settings = Settings.from_env({})
        self.metrics = Metrics(enabled=False)
        self.default_model = "m"
        self.decoupled = False
        self.healthy = True
        self.calls = 0

    def sme_model(self) -> str:
        return "m"

    async def forward(self, model, body, content_type, attributes) -> UpstreamResponse:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("a bug")
        return UpstreamResponse(200, "application/json", None, b'{"outputs":[]}')


def call(app, body: bytes = b'{"inputs":[]}') -> tuple[int, dict[bytes, bytes], bytes]:
    """One POST /invocations through an ASGI app, as uvicorn would make it."""
    scope = {"type": "http", "method": "POST", "path": "/invocations", "raw_path": b"/invocations",
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


def test_the_fast_path_answers_a_bug_with_json_500_and_goes_on(caplog):
    engine = BuggyEngine()
    fast = FastPath(types.SimpleNamespace(), engine)  # type: ignore[arg-type]
    status, headers, payload = call(fast)
    assert (status, headers[b"content-type"], json.loads(payload)) == (
        500,
        b"application/json",
        {"error": INTERNAL_ERROR},
    )
    assert "RuntimeError: a bug" in caplog.text  # the traceback is logged, never the body
    assert call(fast)[0] == 200


def test_the_app_answers_a_bug_with_json_500_and_goes_on():
    engine = BuggyEngine()
    app = create_app(engine)  # type: ignore[arg-type]
    status, headers, payload = call(app)
    assert (status, headers[b"content-type"], json.loads(payload)) == (
        500,
        b"application/json",
        {"error": INTERNAL_ERROR},
    )
    assert call(app)[0] == 200
