"""HTTP routes of the SageMaker hosting contract (CONTRACT.md §2); thin: the engine does the work."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI, Request, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve import codec
from serve.codec import JSON
from serve.engine import CUSTOM_ATTRIBUTES, Engine, to_sagemaker
from serve.errors import BadRequest, PayloadTooLarge, ServeError, error_body
from serve.multimodel import ModelRegistry, NotLoaded, to_mme_response
from serve.triton.client import UpstreamResponse

_PLAIN = {"content-type": "text/plain"}
LOAD_BODY_LIMIT = 64 * 1024  # a load request is a small JSON object
CUSTOM_ATTRIBUTES_HEADER = "X-Amzn-SageMaker-Custom-Attributes"
DEFAULT_BATCH_PAYLOAD_MB = 6  # SageMaker's own default MaxPayloadInMB


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


def create_app(engine: Engine, registry: ModelRegistry | None = None) -> FastAPI:
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

    def _json(value: object, status: int = 200) -> Response:
        return Response(orjson.dumps(value), status_code=status, media_type=JSON)

    @app.get("/ping")
    async def ping() -> Response:
        if engine.healthy:
            return Response(b"", status_code=200, headers=_PLAIN)
        return Response(b"", status_code=503, headers=_PLAIN)

    @app.get("/execution-parameters")
    async def execution_parameters() -> Response:
        """Batch transform asks before sending work (CONTRACT.md §7): job settings first, then ours."""
        settings = engine.settings
        concurrency = settings.max_concurrent_transforms
        if concurrency is None:
            concurrency = await engine.instance_count()
        return _json(
            {
                "MaxConcurrentTransforms": concurrency,
                "BatchStrategy": settings.batch_strategy or "MULTI_RECORD",
                "MaxPayloadInMB": settings.max_payload_in_mb or DEFAULT_BATCH_PAYLOAD_MB,
            }
        )

    async def read_invocation(request: Request) -> tuple[bytes, str | None, str | None]:
        """(body, content type, custom attributes) of an inference request, decompressed if encoded."""
        headers = request.headers
        body = codec.decompress(await read_body(request, limit), headers.get("content-encoding"), limit)
        return body, headers.get("content-type"), headers.get(CUSTOM_ATTRIBUTES_HEADER)

    def respond(upstream: UpstreamResponse, status: int, content_type: str, payload: bytes) -> Response:
        response = Response(payload, status_code=status, media_type=content_type)
        if status == 200:
            attributes = codec.response_parameter(upstream.body, upstream.header_length, CUSTOM_ATTRIBUTES)
            if attributes is not None:
                response.headers[CUSTOM_ATTRIBUTES_HEADER] = attributes
        return response

    @app.post("/invocations")
    async def invocations(request: Request) -> Response:
        model = engine.sme_model()
        body, content_type, attributes = await read_invocation(request)
        upstream = await engine.forward(model, body, content_type, attributes)
        return respond(upstream, *to_sagemaker(upstream))

    target_header = "x-amzn-sagemaker-target-model"

    def _registry() -> ModelRegistry:
        if registry is None:
            raise BadRequest("the multi-model API needs SAGEMAKER_MULTI_MODEL=true")
        return registry

    @app.get("/models")
    @app.get("/models/")
    async def list_models(request: Request) -> Response:
        if registry is None:  # live in both modes (CONTRACT.md §2.1); an SME has no MME models
            return _json({"models": []})
        params = request.query_params
        return _json(registry.list(params.get("next_page_token"), params.get("limit") or params.get("max_results")))

    @app.get("/models/{name}")
    @app.get("/models/{name}/invoke")
    async def describe_model(name: str) -> Response:
        if registry is None:
            raise NotLoaded(name)
        return _json(registry.describe(name))

    @app.post("/models")
    @app.post("/models/")
    @app.post("/models/{ignored}")
    async def load_model(request: Request) -> Response:
        # Native: POST /models/<anything> is a load too; the body names the model.
        body = await read_body(request, LOAD_BODY_LIMIT)
        await _registry().load(body, request.headers.get(target_header))
        return Response(b"", status_code=200, headers=_PLAIN)

    @app.delete("/models/{name}")
    async def unload_model(request: Request, name: str) -> Response:
        if registry is None:
            raise NotLoaded(name)
        await registry.unload(name, request.headers.get(target_header))
        return Response(b"", status_code=200, headers=_PLAIN)

    @app.delete("/models")
    async def unload_nothing() -> Response:
        return _error(404, "DELETE needs a model name: /models/<name>")

    @app.post("/models/{name}/invoke")
    async def invoke_model(request: Request, name: str) -> Response:
        if registry is None:
            raise NotLoaded(name)
        body, content_type, attributes = await read_invocation(request)
        record = registry.begin_invoke(name, request.headers.get(target_header))
        try:
            upstream = await engine.forward(record.triton_name, body, content_type, attributes)
        finally:
            registry.end_invoke(record)
        return respond(upstream, *to_mme_response(record, upstream))

    @app.api_route("/models/{name}/invoke", methods=["PUT", "PATCH", "DELETE", "OPTIONS"])
    @app.api_route("/models", methods=["PUT", "PATCH", "OPTIONS"])
    async def models_wrong_method(request: Request) -> Response:
        return _error(400, f"{request.method} is not supported on {request.url.path}")

    return app
