"""The ASGI application: the data routes (raw ASGI) in front of the control plane (FastAPI).

The control plane is what is neither hot nor streamed: batch transform's execution parameters and the
multi-model endpoint's load, list, describe and unload (docs/contract.md §2.4), which the endpoint's
owner in the main process decides (the data plane asks it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI, Request, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from smtriton.serve import headers
from smtriton.serve.dataplane.plane import DataPlane
from smtriton.serve.errors import INTERNAL_ERROR, ModelNotFound, ServeError, error_body
from smtriton.serve.eventloop import freeze_heap
from smtriton.serve.http.body import BodyReader
from smtriton.serve.http.routes import DataRoutes
from smtriton.serve.logs import log_failure
from smtriton.serve.triton.request_body import contiguous

_PLAIN = {"content-type": "text/plain"}
_JSON = "application/json"
LOAD_BODY_LIMIT = 64 * 1024  # a load request is a small JSON object
_TARGET = headers.TARGET_MODEL.lower()


def _log_failure(request: Request, status: int) -> None:
    log_failure(request.method, request.url.path, status, request.headers.get(headers.INFERENCE_ID))


def _error(status: int, message: str) -> Response:
    return Response(error_body(message), status_code=status, media_type=_JSON)


def _json(value: object, status: int = 200) -> Response:
    return Response(orjson.dumps(value), status_code=status, media_type=_JSON)


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 as soon as it is known to pass ``limit`` (before reading it all)."""
    reader = BodyReader(limit, pull=request.receive)
    declared = request.headers.get("content-length")
    reader.declared = declared.encode("latin-1") if declared is not None else None
    return bytes(contiguous(await reader.read()))  # a control request's small body (a load's JSON)


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
        """Batch transform asks before sending work (docs/contract.md §7)."""
        return _json(await plane.execution_parameters())

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
        await plane.load(await read_body(request, LOAD_BODY_LIMIT), request.headers.get(_TARGET))
        return Response(b"", status_code=200, headers=_PLAIN)

    @app.delete("/models/{name}")
    async def unload_model(request: Request, name: str) -> Response:
        if not multi_model:
            raise ModelNotFound(name)
        await plane.unload(name, request.headers.get(_TARGET))
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
