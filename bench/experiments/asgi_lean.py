"""Raw ASGI (no FastAPI/Starlette) + the minimal upstream client: /ping, /invocations pass-through."""

from __future__ import annotations

from bench.experiments.common import request_header_length, response_content_type, triton_address
from bench.experiments.upstream import Upstream

_upstream: Upstream | None = None
_PING = {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]}
_EMPTY = {"type": "http.response.body", "body": b""}


async def app(scope, receive, send):
    global _upstream
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                _upstream = Upstream(*triton_address())
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["path"] == "/ping":
        await send(_PING)
        await send(_EMPTY)
        return
    content_type = None
    for name, value in scope["headers"]:
        if name == b"content-type":
            content_type = value
    message = await receive()
    body = message.get("body", b"")
    if message.get("more_body"):
        chunks = [body]
        while message.get("more_body"):
            message = await receive()
            chunks.append(message.get("body", b""))
        body = b"".join(chunks)
    assert _upstream is not None
    status, header_length, payload = await _upstream.infer(body, request_header_length(content_type))
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", response_content_type(header_length)),
                (b"content-length", b"%d" % len(payload)),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
