"""HTTP routes of the SageMaker hosting contract (CONTRACT.md §2); thin: the engine does the work."""

from __future__ import annotations

import contextlib
import functools
import gc
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from smtriton.serve import codec, streaming
from smtriton.serve.codec import JSON
from smtriton.serve.engine import CUSTOM_ATTRIBUTES, Engine, to_sagemaker
from smtriton.serve.errors import INTERNAL_ERROR, BadRequest, HeadersTooLarge, ServeError, error_body
from smtriton.serve.fastpath import log_failure, read_limited
from smtriton.serve.multimodel import ModelRegistry, NotLoaded, to_mme_response
from smtriton.serve.triton.client import UpstreamResponse

_PLAIN = {"content-type": "text/plain"}
LOAD_BODY_LIMIT = 64 * 1024  # a load request is a small JSON object
CUSTOM_ATTRIBUTES_HEADER = "X-Amzn-SageMaker-Custom-Attributes"
DEFAULT_BATCH_PAYLOAD_MB = 6  # SageMaker's own default MaxPayloadInMB


def _log_failure(request: Request, status: int) -> None:
    log_failure(request.method, request.url.path, status, request.headers.get("x-amzn-sagemaker-inference-id"))


def _error(status: int, message: str) -> Response:
    return Response(error_body(message), status_code=status, media_type=JSON)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to pass ``limit`` (before reading it all)."""
    declared = request.headers.get("content-length")
    return await read_limited(request.receive, declared.encode("latin-1") if declared is not None else None, limit)


class HeaderLimit:
    """Refuse requests whose headers pass the limit (431), before any route or body is touched."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and sum(len(k) + len(v) for k, v in scope["headers"]) > self.limit:
            error = HeadersTooLarge(self.limit)
            response = _error(error.status, error.message)
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def create_app(engine: Engine, registry: ModelRegistry | None = None) -> FastAPI:
    """The ASGI app serving one engine; Triton starts with the app and stops with it."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine.start()
        # Everything alive now lives for the whole process: keep it out of the collector's full
        # passes, which otherwise made the p99 (bench/NOTES.md: 57 ms pauses → p99 55 → 8 ms).
        gc.collect()
        gc.freeze()
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
    app.add_middleware(HeaderLimit, limit=engine.settings.max_header_bytes)

    @app.exception_handler(ServeError)
    async def _serve_error(request: Request, exc: ServeError) -> Response:
        _log_failure(request, exc.status)
        return _error(exc.status, exc.message)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> Response:
        """A bug, not the client's fault: JSON like every other error (Starlette logs the traceback)."""
        _log_failure(request, 500)
        return _error(500, INTERNAL_ERROR)

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

    def respond(
        request: Request, upstream: UpstreamResponse, status: int, content_type: str, payload: bytes
    ) -> Response:
        response = Response(payload, status_code=status, media_type=content_type)
        if status == 200:
            attributes = codec.response_parameter(upstream.body, upstream.header_length, CUSTOM_ATTRIBUTES)
            if attributes is not None:
                response.headers[CUSTOM_ATTRIBUTES_HEADER] = attributes
        else:
            _log_failure(request, status)
        return response

    metrics = engine.metrics

    @contextlib.contextmanager
    def observed(route: str, model: str) -> Iterator[list[int]]:
        """Count and time one request; the handler stores its status in the yielded list."""
        started = metrics.begin(route)
        status = [500]
        try:
            yield status
        except ServeError as exc:
            status[0] = exc.status
            raise
        finally:
            metrics.end(route, model, status[0], started)

    inference_type = engine.settings.inference_type

    async def generate_stream(request: Request, model: str, body: bytes) -> Response:
        """SAGEMAKER_TRITON_INFERENCE_TYPE=generate_stream: Triton's server-sent events, passed on as
        they arrive (chunked); a client that goes away closes the upstream request too."""
        stream = engine.ready_client(model).generate_stream(model, body)
        upstream = await stream.__aenter__()
        if upstream.status != 200:
            payload = await upstream.read()
            await stream.__aexit__(None, None, None)
            failed = UpstreamResponse(upstream.status, upstream.headers.get("Content-Type", ""), None, payload)
            return respond(request, failed, *to_sagemaker(failed))

        async def events() -> AsyncIterator[bytes]:
            try:
                async for chunk in upstream.content.iter_any():
                    yield chunk
            finally:
                await stream.__aexit__(None, None, None)

        return StreamingResponse(events(), media_type="text/event-stream")

    def stream_decoupled(
        request: Request,
        model: str,
        body: bytes,
        content_type: str | None,
        attributes: str | None,
        on_done: Callable[[], None] = lambda: None,
    ) -> Response:
        """A decoupled model's responses, streamed as JSON lines (or server-sent events on request).
        ``on_done`` runs when the stream ends, however it ends."""
        try:
            header_length = codec.request_header_length(content_type, len(body))
            extra = {CUSTOM_ATTRIBUTES: attributes} if attributes is not None else None
            grpc_request = streaming.build_request(model, body, header_length, extra)
            sse = "text/event-stream" in request.headers.get("accept", "")
            stream = engine.ready_stream_client(model).stream(grpc_request, sse)
        except BaseException:
            on_done()
            raise

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in stream:
                    yield chunk
            finally:
                await stream.aclose()
                on_done()

        return StreamingResponse(chunks(), media_type="text/event-stream" if sse else "application/jsonlines")

    @app.post("/invocations")
    async def invocations(request: Request) -> Response:
        model = engine.sme_model()
        with observed("invocations", model) as status:
            body, content_type, attributes = await read_invocation(request)
            if inference_type == "infer" and engine.decoupled:
                response = stream_decoupled(request, model, body, content_type, attributes)
                status[0] = response.status_code
                return response
            if inference_type == "infer":
                upstream = await engine.forward(model, body, content_type, attributes)
            elif inference_type == "generate":
                upstream = await engine.ready_client(model).generate(model, body)
            else:
                response = await generate_stream(request, model, body)
                status[0] = response.status_code
                return response
            response = respond(request, upstream, *to_sagemaker(upstream))
            status[0] = response.status_code
            return response

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
        started = time.perf_counter()
        try:
            await _registry().load(body, request.headers.get(target_header))
        except ServeError:
            metrics.model_load(False, time.perf_counter() - started)
            raise
        metrics.model_load(True, time.perf_counter() - started)
        return Response(b"", status_code=200, headers=_PLAIN)

    @app.delete("/models/{name}")
    async def unload_model(request: Request, name: str) -> Response:
        if registry is None:
            raise NotLoaded(name)
        try:
            await registry.unload(name, request.headers.get(target_header))
        except ServeError as exc:
            metrics.model_unload(exc.status == 404)
            raise
        metrics.model_unload(True)
        return Response(b"", status_code=200, headers=_PLAIN)

    @app.delete("/models")
    async def unload_nothing() -> Response:
        return _error(404, "DELETE needs a model name: /models/<name>")

    @app.post("/models/{name}/invoke")
    async def invoke_model(request: Request, name: str) -> Response:
        if registry is None:
            raise NotLoaded(name)
        with observed("invoke", name) as status:
            body, content_type, attributes = await read_invocation(request)
            record = registry.begin_invoke(name, request.headers.get(target_header))
            if record.decoupled:
                done = functools.partial(registry.end_invoke, record)  # an unload waits for the stream too
                response = stream_decoupled(request, record.triton_name, body, content_type, attributes, done)
                status[0] = response.status_code
                return response
            try:
                upstream = await engine.forward(record.triton_name, body, content_type, attributes)
            finally:
                registry.end_invoke(record)
            response = respond(request, upstream, *to_mme_response(record, upstream, registry.invoke_oom))
            status[0] = response.status_code
            return response

    @app.api_route("/models/{name}/invoke", methods=["PUT", "PATCH", "DELETE", "OPTIONS"])
    @app.api_route("/models", methods=["PUT", "PATCH", "OPTIONS"])
    async def models_wrong_method(request: Request) -> Response:
        return _error(400, f"{request.method} is not supported on {request.url.path}")

    return app
