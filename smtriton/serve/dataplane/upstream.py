"""One worker's way to Triton: the clients for Triton's current loopback ports, and each inference
request read and made ready for Triton.

Requests go to Triton as SageMaker sent them: the body untouched, except that a large JSON request is
re-encoded binary (:mod:`smtriton.serve.dataplane.transcode`), an encoded image is wrapped as a BYTES
input (:mod:`smtriton.serve.dataplane.images`), and parameters the front sets (custom attributes, a
session's sequence) are added to the JSON part as read (:mod:`smtriton.serve.dataplane.reading`).
Answers come back as Triton gave them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import TYPE_CHECKING, Any

from smtriton.serve.dataplane import codec, csvrows, images, reading
from smtriton.serve.dataplane.mirror import EndpointMirror
from smtriton.serve.dataplane.reading import Inference
from smtriton.serve.errors import BadRequest, NotReady, ServeError, UnsupportedMediaType
from smtriton.serve.ipc.messages import EndpointState
from smtriton.serve.metrics import Metrics
from smtriton.serve.settings import Settings
from smtriton.serve.triton.client import RequestBody, TritonClient, UpstreamResponse

if TYPE_CHECKING:
    from smtriton.serve.triton.streams import StreamClient


async def _close_all(clients: list[TritonClient | StreamClient]) -> None:
    for client in clients:
        await client.close()


class Upstream:
    """The clients to the one Triton, following it to new ports after a restart (``mirror``'s state)."""

    def __init__(self, settings: Settings, metrics: Metrics, mirror: EndpointMirror, pool_size: int = 256) -> None:
        self.settings = settings
        self.metrics = metrics
        self.mirror = mirror
        self.client: TritonClient | None = None
        self._stream_client: StreamClient | None = None
        self._pool_size = pool_size
        self._image_inputs: dict[str, images.ImageInput | ServeError] = {}  # Triton name -> where an image goes
        self._csv_inputs: dict[str, csvrows.CsvInput | ServeError] = {}  # Triton name -> where CSV rows go

    def follow(self, old: EndpointState, state: EndpointState) -> Awaitable[None] | None:
        """New loopback ports (Triton restarted) mean new clients; the old ones close in what is returned."""
        closing: list[TritonClient | StreamClient] = []
        if state.http_port != old.http_port:
            self._image_inputs.clear()  # Triton restarted: models may have been loaded anew
            self._csv_inputs.clear()
            if self.client is not None:
                closing.append(self.client)
            self.client = None
            if state.http_port is not None:
                url = f"http://127.0.0.1:{state.http_port}"
                self.client = TritonClient(url, self.settings.request_timeout_s, self._pool_size)
        if state.grpc_port != old.grpc_port and self._stream_client is not None:
            closing.append(self._stream_client)
            self._stream_client = None
        return _close_all(closing) if closing else None

    def model_changed(self, triton_name: str) -> None:
        """A model was loaded or unloaded under ``triton_name``: what was learnt of it is forgotten."""
        self._image_inputs.pop(triton_name, None)
        self._csv_inputs.pop(triton_name, None)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()
        if self._stream_client is not None:
            await self._stream_client.close()

    def ready(self) -> TritonClient:
        """The client, if requests may go to Triton now (else 503)."""
        client = self.client
        state = self.mirror.state
        if not state.serving or client is None:
            raise NotReady(state.reason or "Triton is not ready")
        return client

    # ----- a request read and made ready ----------------------------------------------------------------
    async def read(self, triton_name: str, body: RequestBody, content_type: str | None) -> Inference:
        """An inference request as the front reads it (:mod:`smtriton.serve.dataplane.reading`), or an
        encoded image made the request it stands for."""
        if images.is_image(content_type):
            return images.request(body, await self._image_input(self.ready(), triton_name))
        header_length = codec.request_header_length(content_type, len(body))
        inference = reading.read(body, header_length, self.settings.transcode_json_min_bytes)
        if inference.body is not body:
            self.metrics.transcoded.inc()
        return inference

    async def _image_input(self, client: TritonClient, triton_name: str) -> images.ImageInput:
        """Where an image goes in ``triton_name`` (asked of Triton once, until the model changes)."""
        known = self._image_inputs.get(triton_name)
        if known is None:
            try:
                known = images.image_input(triton_name, await client.model_metadata(triton_name))
            except UnsupportedMediaType as exc:
                known = exc
            self._image_inputs[triton_name] = known
        if isinstance(known, ServeError):
            raise known
        return known

    async def csv_input(self, triton_name: str) -> csvrows.CsvInput:
        """Where CSV rows go in ``triton_name`` (asked of Triton once, until the model changes)."""
        known = self._csv_inputs.get(triton_name)
        if known is None:
            try:
                known = csvrows.csv_input(triton_name, await self.ready().model_config(triton_name))
            except UnsupportedMediaType as exc:
                known = exc
            self._csv_inputs[triton_name] = known
        if isinstance(known, ServeError):
            raise known
        return known

    # ----- to Triton ----------------------------------------------------------------------------------------
    async def infer(self, triton_name: str, inference: Inference) -> UpstreamResponse:
        return await self.ready().infer(triton_name, inference.body, inference.header_length)

    async def generate(self, model: str, body: RequestBody) -> UpstreamResponse:
        client = self.ready()
        reading.check_json_depth(body)
        return await client.generate(model, body)

    @contextlib.asynccontextmanager
    async def generate_stream(
        self, model: str, body: RequestBody
    ) -> AsyncIterator[tuple[UpstreamResponse | None, AsyncIterator[bytes] | None]]:
        """Triton's generate stream: ``(failure, None)`` with Triton's error answer, or ``(None, events)``
        with the server-sent events as they arrive; leaving the context early drops the upstream request."""
        client = self.ready()
        reading.check_json_depth(body)
        async with client.generate_stream(model, body) as upstream:
            if upstream.status != 200:
                payload = await upstream.read()
                yield UpstreamResponse(upstream.status, upstream.headers.get("Content-Type", ""), None, payload), None
                return
            yield None, upstream.content.iter_any()

    def stream(self, triton_name: str, inference: Inference) -> AsyncGenerator[dict[str, Any], None]:
        """A decoupled model's responses, one KServe JSON response each, as Triton streams them."""
        from smtriton.serve.triton import streams  # gRPC and numpy only for endpoints that stream

        header = inference.whole_header()
        if header is None:
            raise BadRequest("raw binary requests cannot be streamed; send JSON or binary+json")
        request = streams.build_request(triton_name, header, inference.body, inference.header_length)
        self.ready()
        if self._stream_client is None:  # made on first use: most endpoints never stream
            assert self.mirror.state.grpc_port is not None
            self._stream_client = streams.StreamClient(f"127.0.0.1:{self.mirror.state.grpc_port}")
        return self._stream_client.stream(request)

    async def instance_count(self, model: str) -> int:
        """Model instances Triton runs for ``model`` (1 when unknown)."""
        if not self.mirror.state.serving or self.client is None:
            return 1
        try:
            config = await self.client.model_config(model)
        except ServeError:
            return 1
        groups = config.get("instance_group")
        total = 0
        for group in groups if isinstance(groups, list) else []:
            if isinstance(group, dict):
                total += int(group.get("count", 1))
        return max(1, total)
