"""HTTP routes of the SageMaker hosting contract (CONTRACT.md §2); thin: the engine does the work."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI, Request, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve.codec import JSON
from serve.engine import Engine
from serve.errors import BadRequest, PayloadTooLarge, ServeError, error_body

_PLAIN = {"content-type": "text/plain"}


def _error(status: int, message: str) -> Response:
    return Response(error_body(message), status_code=status, media_type=JSON)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to pass ``limit`` (before reading it all)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise BadRequest("invalid Content-Length")
        if int(declared) > limit:
            raise PayloadTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(limit)
        chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def create_app(engine: Engine) -> FastAPI:
    """The ASGI app serving one engine; Triton starts with the app and stops with it."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            await engine.stop()

    app = FastAPI(
        lifespan=lifespan,
        redirect_slashes=False,  # native: /ping/ and /invocations/ are unrouted (400), not redirected
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    limit = engine.settings.max_payload_bytes

    @app.exception_handler(ServeError)
    async def _serve_error(_: Request, exc: ServeError) -> Response:
        return _error(exc.status, exc.message)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 405:
            return _error(405, "Method Not Allowed")
        if exc.status_code == 404:  # native answers 400 for every unrouted path
            return _error(400, f"no route for {request.method} {request.url.path}")
        return _error(exc.status_code, str(exc.detail))

    @app.get("/ping")
    async def ping() -> Response:
        if engine.healthy:
            return Response(b"", status_code=200, headers=_PLAIN)
        return Response(b"", status_code=503, headers=_PLAIN)

    @app.post("/invocations")
    async def invocations(request: Request) -> Response:
        body = await read_body(request, limit)
        status, content_type, payload = await engine.invoke(body, request.headers.get("content-type"))
        return Response(payload, status_code=status, media_type=content_type)

    @app.get("/models")
    async def list_models() -> Response:
        # Live in both modes (CONTRACT.md §2.1); a single-model endpoint has no MME models.
        return Response(orjson.dumps({"models": []}), media_type=JSON)

    return app
