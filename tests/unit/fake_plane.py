"""A data plane without Triton for in-process contract tests of the routes, and an ASGI caller."""

from __future__ import annotations

import asyncio

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
        self.multi_model = False
        self.decoupled = False
        self.healthy = healthy
        self.seen: list[tuple[str, bytes, str | None, str | None]] = []

    def sme_model(self) -> str:
        if self.default_model is None:
            raise BadRequest("this is a multi-model endpoint")
        return self.default_model

    async def instance_count(self) -> int:
        return 1

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
