"""The ASGI application: the data routes (raw ASGI) in front of the control plane (FastAPI).

The control plane is what is neither hot nor streamed: batch transform's execution parameters and the
multi-model endpoint's load, list, describe and unload (docs/contract.md §2.4), which the endpoint's
owner in the main process decides (the data plane asks it).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI, Request, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from smtriton.serve.dataplane.codec import JSON
from smtriton.serve.dataplane.plane import DataPlane
from smtriton.serve.errors import INTERNAL_ERROR, ModelNotFound, ServeError, error_body
from smtriton.serve.eventloop import freeze_heap
from smtriton.serve.http import edge
from smtriton.serve.http.routes import DataRoutes, log_failure, read_limited

_PLAIN = {"content-type": "text/plain"}
LOAD_BODY_LIMIT = 64 * 1024  # a load request is a small JSON object
DEFAULT_BATCH_PAYLOAD_MB = 6  # SageMaker's own default MaxPayloadInMB
_TARGET = edge.TARGET_MODEL_HEADER.lower()


def _log_failure(request: Request, status: int) -> None:
    log_failure(request.method, request.url.path, status, request.headers.get(edge.INFERENCE_ID_HEADER))


def _error(status: int, message: str) -> Response:
    return Response(error_body(message), status_code=status, media_type=JSON)


def _json(value: object, status: int = 200) -> Response:
    return Response(orjson.dumps(value), status_code=status, media_type=JSON)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to pass ``limit`` (before reading it all)."""
    declared = request.headers.get("content-length")
    body = await read_limited(request.receive, declared.encode("latin-1") if declared is not None else None, limit)
    return bytes(body)  # a control request's small body (a load's JSON)


def create_control_app(plane: DataPlane) -> FastAPI:
    """The control plane's routes; an unknown path is 404 (native answers 400, docs/contract.md §2.1)."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        freeze_heap()  # everything alive now lives for the whole process
        try:
            yield
        finally:
            await plane.close()

    app = FastAPI(
        lifespan=lifespan,
        redirect_slashes=False,  # native: /ping/ and /invocations/ are unrouted (400), not redirected
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    metrics = plane.metrics
    multi_model = plane.multi_model

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
        if exc.status_code == 404:  # native answers 400 for an unknown path; it is not found
            return _error(404, f"no route for {request.method} {request.url.path}")
        return _error(exc.status_code, str(exc.detail))

    @app.get("/execution-parameters")
    async def execution_parameters() -> Response:
        """Batch transform asks before sending work (docs/contract.md §7): job settings first, then ours."""
        settings = plane.settings
        concurrency = settings.max_concurrent_transforms
        if concurrency is None:
            concurrency = await plane.instance_count()
        return _json(
            {
                "MaxConcurrentTransforms": concurrency,
                "BatchStrategy": settings.batch_strategy or "MULTI_RECORD",
                # 0 is passed on as set: SageMaker's "any size, chunked" (serve still refuses a body
                # past SMTRITON_MAX_PAYLOAD_BYTES: it never holds an unbounded one).
                "MaxPayloadInMB": (
                    settings.max_payload_in_mb if settings.max_payload_in_mb is not None else DEFAULT_BATCH_PAYLOAD_MB
                ),
            }
        )

    @app.get("/models")
    @app.get("/models/")
    async def list_models(request: Request) -> Response:
        if not multi_model:  # live in both modes (docs/contract.md §2.1); an SME has no MME models
            return _json({"models": []})
        params = request.query_params
        token, limit = params.get("next_page_token"), params.get("limit") or params.get("max_results")
        return _json(await plane.list_models(token, limit))

    @app.get("/models/{name}")
    @app.get("/models/{name}/invoke")
    async def describe_model(name: str) -> Response:
        if not multi_model:
            raise ModelNotFound(name)
        return _json(await plane.describe(name))

    @app.post("/models")
    @app.post("/models/")
    @app.post("/models/{ignored}")
    async def load_model(request: Request) -> Response:
        # Native: POST /models/<anything> is a load too; the body names the model.
        body = await read_body(request, LOAD_BODY_LIMIT)
        started = time.perf_counter()
        try:
            await plane.load(body, request.headers.get(_TARGET))
        except ServeError:
            metrics.model_load(False, time.perf_counter() - started)
            raise
        metrics.model_load(True, time.perf_counter() - started)
        return Response(b"", status_code=200, headers=_PLAIN)

    @app.delete("/models/{name}")
    async def unload_model(request: Request, name: str) -> Response:
        if not multi_model:
            raise ModelNotFound(name)
        try:
            await plane.unload(name, request.headers.get(_TARGET))
        except ServeError as exc:
            metrics.model_unload(exc.status == 404)
            raise
        metrics.model_unload(True)
        return Response(b"", status_code=200, headers=_PLAIN)

    @app.delete("/models")
    async def unload_nothing() -> Response:
        return _error(404, "DELETE needs a model name: /models/<name>")

    @app.api_route("/models/{name}/invoke", methods=["PUT", "PATCH", "DELETE", "OPTIONS"])
    @app.api_route("/models", methods=["PUT", "PATCH", "OPTIONS"])
    async def models_wrong_method(request: Request) -> Response:
        return _error(400, f"{request.method} is not supported on {request.url.path}")

    return app


def create_app(plane: DataPlane) -> DataRoutes:
    """The whole ASGI application `serve` runs."""
    return DataRoutes(create_control_app(plane), plane)
