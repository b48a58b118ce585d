"""A small HTTP server speaking the part of Triton's HTTP API the data plane uses, for in-process tests
of the real data plane, routes and Triton client: health, infer (echoing what it was sent), generate,
generate_stream (server-sent events at a pace the test sets), config, and the repository's index,
load and unload. It records what reached it and when a streamed request was closed by its client."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, NamedTuple

import orjson
from aiohttp import web

from smtriton.serve.dataplane.plane import DataPlane
from smtriton.serve.http.app import create_app
from smtriton.serve.ipc.messages import EndpointState
from smtriton.serve.metrics import Metrics
from smtriton.serve.settings import Settings

HEADER_LENGTH = "Inference-Header-Content-Length"


class TritonStandIn:
    def __init__(self) -> None:
        self.requests: list[tuple[str, bytes, dict[str, str]]] = []
        self.events = 5  # generate_stream: events per request
        self.gap_s = 0.05  # generate_stream: pause between events
        self.stream_status = 200
        self.streams_open = 0
        self.streams_closed_early = 0
        self.streams_finished = 0
        self.models: dict[str, str] = {"m": "READY"}
        self.answer: tuple[int, bytes] | None = None  # infer: this answer (status, JSON body) instead of the echo
        self.infer_delay_s = 0.0  # infer: how long Triton takes to answer
        self.infers_abandoned = 0  # infer: requests whose client had gone when the answer was ready
        self.die_on_infer = 0  # infer: this many requests find the connection closed under them, as when Triton dies
        self.on_death: Callable[[], None] | None = None  # called each time, as the owner would hear of the death
        self.die_after = 0  # infer: this many requests are answered before die_on_infer's deaths begin
        self.load_error: str | None = None  # load: refused with this message
        # metadata: each model's inputs as Triton describes them (name, datatype, shape)
        self.inputs: dict[str, list[dict[str, object]]] = {
            "m": [{"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]}]
        }
        self.decoupled: set[str] = set()
        self.max_batch_size: dict[str, int] = {}  # config: models Triton batches (dynamic_batching on)
        self.config_extra: dict[str, dict[str, object]] = {}  # config: fields added to a model's (its inputs)
        self.config_delay_s = 0.0  # config: how long Triton takes to answer
        self.configs_asked = 0
        self.configs_answered = 0
        self.port = 0
        self._runner: web.AppRunner | None = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[TritonStandIn]:
        app = web.Application()
        app.add_routes(
            [
                web.get("/v2/health/live", self._live),
                web.post("/v2/models/{model}/infer", self._infer),
                web.post("/v2/models/{model}/generate", self._generate),
                web.post("/v2/models/{model}/generate_stream", self._generate_stream),
                web.get("/v2/models/{model}/config", self._config),
                web.get("/v2/models/{model}/ready", self._ready),
                web.get("/v2/models/{model}", self._metadata),
                web.post("/v2/repository/index", self._index),
                web.post("/v2/repository/models/{model}/load", self._load),
                web.post("/v2/repository/models/{model}/unload", self._unload),
            ]
        )
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            yield self
        finally:
            await self._runner.cleanup()

    async def _record(self, request: web.Request) -> bytes:
        body = await request.read()
        self.requests.append((request.path, body, dict(request.headers)))
        return body

    async def _live(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _infer(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        dies = self.die_on_infer and not self.die_after
        self.die_after = max(0, self.die_after - 1)
        if dies:
            self.die_on_infer -= 1
            if self.on_death is not None:
                self.on_death()
            assert request.transport is not None
            request.transport.abort()  # the connection dies with the request in flight
            raise web.HTTPServiceUnavailable()
        if self.infer_delay_s:
            await asyncio.sleep(self.infer_delay_s)
            if request.transport is None or request.transport.is_closing():
                self.infers_abandoned += 1  # the front closed its connection: the request was cancelled
        model = request.match_info["model"]
        if self.models.get(model) != "READY":
            return web.json_response({"error": f"Request for unknown model: '{model}' is not found"}, status=400)
        if self.answer is not None:
            return web.Response(status=self.answer[0], body=self.answer[1], content_type="application/json")
        headers = {}
        if HEADER_LENGTH in request.headers:
            headers[HEADER_LENGTH] = request.headers[HEADER_LENGTH]
        return web.Response(body=body, headers=headers, content_type=request.content_type)

    async def _generate(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"model_name": request.match_info["model"], "text_output": "done"})

    async def _generate_stream(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        if self.stream_status != 200:
            return web.json_response({"error": "generate failed"}, status=self.stream_status)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        self.streams_open += 1
        try:
            for i in range(self.events):
                await response.write(b"data: " + orjson.dumps({"index": i}) + b"\n\n")
                await asyncio.sleep(self.gap_s)
            await response.write_eof()
            self.streams_finished += 1
        except (ConnectionResetError, asyncio.CancelledError):
            self.streams_closed_early += 1
            raise
        finally:
            self.streams_open -= 1
        return response

    async def _config(self, request: web.Request) -> web.Response:
        model = request.match_info["model"]
        self.configs_asked += 1
        await asyncio.sleep(self.config_delay_s)
        self.configs_answered += 1
        if model not in self.models:
            return web.json_response({"error": f"Request for unknown model: '{model}' is not found"}, status=400)
        config: dict[str, object] = {"name": model, "instance_group": [{"count": 2, "kind": "KIND_CPU"}]}
        if model in self.decoupled:
            config["model_transaction_policy"] = {"decoupled": True}
        if model in self.max_batch_size:
            # as an ONNX model would be: its backend runs a batch as one tensor, so its requests may merge
            config.update(backend="onnxruntime", max_batch_size=self.max_batch_size[model], dynamic_batching={})
        config.update(self.config_extra.get(model, {}))
        return web.json_response(config)

    async def _metadata(self, request: web.Request) -> web.Response:
        await self._record(request)
        model = request.match_info["model"]
        if model not in self.models:
            return web.json_response({"error": f"Request for unknown model: '{model}' is not found"}, status=400)
        return web.json_response({"name": model, "versions": ["1"], "inputs": self.inputs.get(model, [])})

    async def _ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.models.get(request.match_info["model"]) == "READY" else 400)

    async def _index(self, request: web.Request) -> web.Response:
        index = [{"name": name, "version": "1", "state": state} for name, state in self.models.items()]
        return web.json_response(index)

    async def _load(self, request: web.Request) -> web.Response:
        await self._record(request)
        if self.load_error is not None:
            return web.json_response({"error": self.load_error}, status=400)
        self.models[request.match_info["model"]] = "READY"
        return web.Response(status=200)

    async def _unload(self, request: web.Request) -> web.Response:
        await self._record(request)
        self.models[request.match_info["model"]] = "UNAVAILABLE"
        return web.Response(status=200)


@contextlib.contextmanager
def stand_in_thread(triton: TritonStandIn | None = None) -> Iterator[TritonStandIn]:
    """The stand-in served from a thread of its own, for a server under test that runs in another."""
    triton = triton or TritonStandIn()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop = asyncio.Event()

    async def serve() -> None:
        async with triton.running():
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    try:
        assert ready.wait(10), "the Triton stand-in did not start"
        yield triton
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


# What the in-process tests give the real data plane: limits small enough to reach with small bodies.
TEST_SETTINGS = Settings(max_payload_bytes=1024, max_header_bytes=2048)


def serving_plane(triton: TritonStandIn, settings: Settings = TEST_SETTINGS, default_model: str | None = "m",
                  healthy: bool = True) -> DataPlane:  # fmt: skip
    """The real data plane, told (as the endpoint's owner tells it) that requests may go to ``triton``;
    call it inside the event loop that will run its requests."""
    plane = DataPlane(settings, Metrics(enabled=False), default_model)
    plane.apply(EndpointState(healthy, True, "", triton.port, 9))
    return plane


class Answer(NamedTuple):
    status: int
    headers: dict[bytes, bytes]
    body: bytes
    reached_triton: list[tuple[str, bytes, dict[str, str]]]  # (path, body, headers) of what Triton got


def call(method: str, path: str, body: bytes = b"", headers: Sequence[tuple[bytes, bytes]] = (), *,
         default_model: str | None = "m", healthy: bool = True, settings: Settings = TEST_SETTINGS,
         triton: TritonStandIn | None = None) -> Answer:  # fmt: skip
    """One request through the real ASGI app and data plane (in-process, as uvicorn would make it) in
    front of a stand-in Triton."""
    triton = triton or TritonStandIn()

    async def scenario() -> Answer:
        async with triton.running():
            plane = serving_plane(triton, settings, default_model, healthy)
            try:
                status, answer_headers, payload = await asgi_call(create_app(plane), method, path, body, headers)
            finally:
                await plane.close()
        return Answer(status, answer_headers, payload, triton.requests)

    return asyncio.run(scenario())


async def asgi_call(app: Any, method: str, path: str, body: bytes = b"", headers: Sequence[tuple[bytes, bytes]] = (),
                    reraised: type[BaseException] | None = None) -> tuple[int, dict[bytes, bytes], bytes]:  # fmt: skip
    """One request through an ASGI app, its body in pieces of 100 bytes, as uvicorn would hand it over.
    ``reraised``: an exception the app may raise after it answered (Starlette does, for the server's log)."""
    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": list(headers), "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", 8080),
             "client": ("127.0.0.1", 1), "root_path": ""}  # fmt: skip
    messages: list[dict[str, Any]] = []
    chunks = [body[i : i + 100] for i in range(0, len(body), 100)] or [b""]

    async def receive() -> dict[str, Any]:
        chunk = chunks.pop(0) if chunks else b""
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    try:
        await app(scope, receive, send)
    except BaseException as exc:
        if reraised is None or not isinstance(exc, reraised) or not messages:
            raise
    start = next(m for m in messages if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), payload
