"""Contract rules of the routes that need no Triton, in-process on the ASGI app with a fake data plane."""

from __future__ import annotations

import asyncio
import gzip
import json

import pytest

from smtriton.serve.app import create_app
from smtriton.serve.errors import BadRequest
from smtriton.serve.metrics import Metrics
from smtriton.serve.settings import Settings
from smtriton.serve.triton.client import UpstreamResponse


class FakePlane:
    """What the routes use of the data plane; ``infer`` echoes what it was given."""

    def __init__(self, default_model: str | None = "m", healthy: bool = True) -> None:
        self.settings = Settings(max_payload_bytes=1024, max_header_bytes=2048)
        self.metrics = Metrics(enabled=False)
        self.default_model = default_model
        self.registry = None
        self.decoupled = False
        self.healthy = healthy
        self.seen: list[tuple[str, bytes, str | None, str | None]] = []

    def sme_model(self) -> str:
        if self.default_model is None:
            raise BadRequest("this is a multi-model endpoint")
        return self.default_model

    async def infer(self, model, body, content_type, attributes) -> UpstreamResponse:
        self.seen.append((model, body, content_type, attributes))
        payload = b'{"parameters":{"sagemaker_custom_attributes":"back"},"outputs":[]}'
        return UpstreamResponse(200, "application/json", None, payload)


def call(plane, method: str, path: str, body: bytes = b"", headers=()) -> tuple[int, dict[bytes, bytes], bytes]:
    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": list(headers), "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 8080),
             "client": ("127.0.0.1", 1), "root_path": ""}  # fmt: skip
    messages: list[dict] = []
    chunks = [body[i : i + 100] for i in range(0, len(body), 100)] or [b""]

    async def receive() -> dict:
        chunk = chunks.pop(0) if chunks else b""
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message: dict) -> None:
        messages.append(message)

    asyncio.run(create_app(plane)(scope, receive, send))  # type: ignore[arg-type]
    start = next(m for m in messages if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), payload


@pytest.mark.parametrize(("healthy", "status"), [(True, 200), (False, 503)])
def test_ping_answers_health_with_an_empty_body(healthy, status):
    assert call(FakePlane(healthy=healthy), "GET", "/ping")[::2] == (status, b"")


@pytest.mark.parametrize(
    ("method", "path"), [("POST", "/ping"), ("HEAD", "/ping"), ("GET", "/invocations"), ("PUT", "/invocations")]
)
def test_wrong_methods_on_the_data_routes_are_405_in_json(method, path):
    status, headers, payload = call(FakePlane(), method, path)
    assert (status, headers[b"content-type"], json.loads(payload)) == (
        405,
        b"application/json",
        {"error": "Method Not Allowed"},
    )


def test_invocations_forward_the_decompressed_body_and_custom_attributes_both_ways():
    plane = FakePlane()
    body = b'{"inputs":[]}'
    headers = [
        (b"content-type", b"application/json"),
        (b"content-encoding", b"gzip"),
        (b"x-amzn-sagemaker-custom-attributes", b"trace=1"),
    ]
    status, response_headers, _ = call(plane, "POST", "/invocations", gzip.compress(body), headers)
    assert status == 200
    assert plane.seen == [("m", body, "application/json", "trace=1")]
    assert response_headers[b"x-amzn-sagemaker-custom-attributes"] == b"back"


def test_limits_are_413_and_431_before_anything_is_forwarded():
    plane = FakePlane()
    assert call(plane, "POST", "/invocations", b"x" * 1025)[0] == 413
    declared = [(b"content-length", b"5000")]
    assert call(plane, "POST", "/invocations", b"", declared)[0] == 413
    assert call(plane, "POST", "/invocations", b"{}", [(b"x-big", b"y" * 3000)])[0] == 431
    assert plane.seen == []


def test_invocations_on_a_multi_model_endpoint_and_invoke_on_a_single_model_one_are_refused():
    status, _, payload = call(FakePlane(default_model=None), "POST", "/invocations", b"{}")
    assert (status, json.loads(payload)["error"]) == (400, "this is a multi-model endpoint")
    status, _, payload = call(FakePlane(), "POST", "/models/m/invoke", b"{}")
    assert (status, json.loads(payload)) == (404, {"error": "model 'm' is not loaded"})


def test_unrouted_paths_are_400_as_native_answers_them():
    status, _, payload = call(FakePlane(), "GET", "/nowhere")
    assert (status, json.loads(payload)) == (400, {"error": "no route for GET /nowhere"})
