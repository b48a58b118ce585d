"""A small HTTP server speaking the part of Triton's HTTP API the data plane uses, for in-process tests
of the real data plane, routes and Triton client: health, infer (echoing what it was sent), generate,
generate_stream (server-sent events at a pace the test sets), config, and the repository's index,
load and unload. It records what reached it and when a streamed request was closed by its client."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import orjson
from aiohttp import web

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
        self.decoupled: set[str] = set()
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
        model = request.match_info["model"]
        if self.models.get(model) != "READY":
            return web.json_response({"error": f"Request for unknown model: '{model}' is not found"}, status=400)
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
        config: dict[str, object] = {"name": model, "instance_group": [{"count": 2, "kind": "KIND_CPU"}]}
        if model in self.decoupled:
            config["model_transaction_policy"] = {"decoupled": True}
        return web.json_response(config)

    async def _ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.models.get(request.match_info["model"]) == "READY" else 400)

    async def _index(self, request: web.Request) -> web.Response:
        index = [{"name": name, "version": "1", "state": state} for name, state in self.models.items()]
        return web.json_response(index)

    async def _load(self, request: web.Request) -> web.Response:
        await self._record(request)
        self.models[request.match_info["model"]] = "READY"
        return web.Response(status=200)

    async def _unload(self, request: web.Request) -> web.Response:
        await self._record(request)
        self.models[request.match_info["model"]] = "UNAVAILABLE"
        return web.Response(status=200)
