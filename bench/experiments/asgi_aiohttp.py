"""Raw ASGI (no FastAPI/Starlette) + one aiohttp session to Triton: the reference pass-through of docs/design.md §5."""

from __future__ import annotations

import aiohttp

from bench.experiments.common import request_header_length, response_content_type, triton_address

_session: aiohttp.ClientSession | None = None
_url = ""
_PING = {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]}
_EMPTY = {"type": "http.response.body", "body": b""}


async def app(scope, receive, send):
    global _session, _url
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                host, port, model = triton_address()
                _url = f"http://{host}:{port}/v2/models/{model}/infer"
                _session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=256), auto_decompress=False,
                    skip_auto_headers=("User-Agent", "Accept-Encoding"),
                )  # fmt: skip
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if _session is not None:
                    await _session.close()
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
    chunks, more = [], True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    header_length = request_header_length(content_type)
    headers = {"Content-Type": "application/json"}
    if header_length is not None:
        headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(header_length)}
    assert _session is not None
    async with _session.post(_url, data=body, headers=headers) as resp:
        payload = await resp.read()
        raw = resp.headers.get("Inference-Header-Content-Length")
    await send(
        {
            "type": "http.response.start",
            "status": resp.status,
            "headers": [
                (b"content-type", response_content_type(raw.encode() if raw is not None else None)),
                (b"content-length", b"%d" % len(payload)),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
