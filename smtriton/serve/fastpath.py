"""The hot routes as raw ASGI, in front of the FastAPI app.

`GET /ping` and `POST /invocations` (infer, non-decoupled SME model) are answered here without
FastAPI/Starlette's routing, dependency solving and Request/Response objects: measured in `bench/`
(NOTES.md), those layers were ~21 % of the front's CPU per request. Everything else, including every
other method on these paths, falls through to the FastAPI app, which stays the reference
implementation of the same contract (the integration tests exercise both).
"""

from __future__ import annotations

import logging

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from smtriton.serve import codec
from smtriton.serve.engine import CUSTOM_ATTRIBUTES, Engine, to_sagemaker
from smtriton.serve.errors import INTERNAL_ERROR, BadRequest, HeadersTooLarge, PayloadTooLarge, ServeError, error_body

log = logging.getLogger("serve.access")

_PLAIN_EMPTY = [(b"content-type", b"text/plain"), (b"content-length", b"0")]
_BODY_END: Message = {"type": "http.response.body", "body": b""}
_ATTRIBUTES = b"x-amzn-sagemaker-custom-attributes"


def log_failure(method: str, path: str, status: int, inference_id: str | None) -> None:
    """One line per failed request, with SageMaker's inference id; never the body."""
    log.info("%s %s answered %d", method, path, status, extra={"status": status, "inference_id": inference_id})


async def read_limited(receive: Receive, content_length: bytes | None, limit: int) -> bytes:
    """The whole request body, refused with 413 as soon as it is known to pass ``limit``: from
    Content-Length before reading anything, else while a chunked body streams in."""
    if content_length is not None:
        if not content_length.isdigit():
            raise BadRequest("invalid Content-Length")
        if int(content_length) > limit:
            raise PayloadTooLarge(limit)
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body"):
        if len(body) > limit:
            raise PayloadTooLarge(limit)
        return body
    chunks = [body]
    size = len(body)
    while message.get("more_body"):
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


class FastPath:
    """ASGI wrapper: serves the hot routes itself, passes the rest to ``app``."""

    def __init__(self, app: ASGIApp, engine: Engine) -> None:
        self.app = app
        self.engine = engine
        settings = engine.settings
        self.limit = settings.max_payload_bytes
        self.header_limit = settings.max_header_bytes
        self.enabled = engine.default_model is not None and settings.inference_type == "infer"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope["path"]
            if path == "/ping" and scope["method"] == "GET":
                status = 200 if self.engine.healthy else 503
                await send({"type": "http.response.start", "status": status, "headers": _PLAIN_EMPTY})
                await send(_BODY_END)
                return
            if path == "/invocations" and scope["method"] == "POST" and self.enabled and not self.engine.decoupled:
                await self._invocations(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _invocations(self, scope: Scope, receive: Receive, send: Send) -> None:
        content_type = content_length = encoding = attributes = inference_id = None
        size = 0
        for name, value in scope["headers"]:
            size += len(name) + len(value)
            if name == b"content-type":
                content_type = value.decode("latin-1")
            elif name == b"content-length":
                content_length = value
            elif name == b"content-encoding":
                encoding = value.decode("latin-1")
            elif name == _ATTRIBUTES:
                attributes = value.decode("latin-1")
            elif name == b"x-amzn-sagemaker-inference-id":
                inference_id = value.decode("latin-1")
        engine = self.engine
        model = engine.default_model
        assert model is not None
        metrics = engine.metrics
        started = metrics.begin("invocations")
        status = 500
        attribute = None
        try:
            if size > self.header_limit:
                raise HeadersTooLarge(self.header_limit)
            body = await read_limited(receive, content_length, self.limit)
            if encoding is not None:
                body = codec.decompress(body, encoding, self.limit)
            upstream = await engine.forward(model, body, content_type, attributes)
            status, response_type, payload = to_sagemaker(upstream)
            if status == 200:
                attribute = codec.response_parameter(upstream.body, upstream.header_length, CUSTOM_ATTRIBUTES)
        except ServeError as exc:
            status, response_type, payload = exc.status, "application/json", error_body(exc.message)
        except Exception:  # a bug, not the client's fault: logged with its traceback, answered in JSON
            log.exception("POST /invocations failed inside serve")
            status, response_type, payload = 500, "application/json", error_body(INTERNAL_ERROR)
        finally:
            metrics.end("invocations", model, status, started)
        headers = [(b"content-type", response_type.encode()), (b"content-length", b"%d" % len(payload))]
        if attribute is not None:
            headers.append((_ATTRIBUTES, attribute.encode("latin-1", errors="replace")))
        if status != 200:
            log_failure("POST", "/invocations", status, inference_id)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})
