"""One worker's way to Triton: the clients for Triton's current loopback ports, and each inference
request read and made ready for Triton.

Requests go to Triton as SageMaker sent them: the body untouched (a binary one in the pieces it arrived
in, its JSON part alone read), except that a large JSON request is
re-encoded binary (:mod:`smtriton.serve.dataplane.reading.transcode`), an encoded image is wrapped as a BYTES
input (:mod:`smtriton.serve.dataplane.reading.images`), and parameters the front sets (custom attributes, a
session's sequence) are added to the JSON part as read (:mod:`smtriton.serve.dataplane.reading.inference`).
Answers come back as Triton gave them. Requests of one model that arrive while this worker's earlier
ones are still with Triton may be merged into one Triton request and its answer split back, each
client getting the answer it would have had alone (:mod:`smtriton.serve.dataplane.batching.coalescing`); what
that takes of a model's configuration is asked of Triton once per model, like where an image goes, and
whether it pays, of Triton's statistics of the model every few seconds while it is used.
A large binary part goes to Triton through the worker's shared memory rather than in the HTTP body
(:mod:`smtriton.serve.triton.input_arena`), a new arena for each Triton.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from smtriton.serve.dataplane.batching import coalescing, rule
from smtriton.serve.dataplane.batching.rule import ModelBatching
from smtriton.serve.dataplane.reading import codec, images, inference, large_json
from smtriton.serve.dataplane.reading.inference import Inference, check_json_depth
from smtriton.serve.dataplane.records import csv_values, csvrows, record_check
from smtriton.serve.dataplane.sending.mirror import EndpointMirror
from smtriton.serve.errors import (
    BadRequest,
    NotReady,
    PayloadTooLarge,
    ServeError,
    TritonUnavailable,
    UnsupportedMediaType,
)
from smtriton.serve.eventloop import LoopOfFirstUse
from smtriton.serve.ipc.messages import EndpointState
from smtriton.serve.metrics import Metrics
from smtriton.serve.settings import Settings
from smtriton.serve.triton import input_arena
from smtriton.serve.triton.access import TritonAccess
from smtriton.serve.triton.client import TritonClient, UpstreamResponse
from smtriton.serve.triton.input_arena import InputArena
from smtriton.serve.triton.request_body import BodyPieces, HeldBody, contiguous

if TYPE_CHECKING:
    from smtriton.serve.triton.streams import StreamClient

log = logging.getLogger("serve")
_UNKNOWN: Any = object()  # a model whose configuration has not been asked for yet


T = TypeVar("T")


async def _learnt(known: dict[str, T | ServeError], triton_name: str, learn: Callable[[], Awaitable[T]]) -> T:
    """What ``learn`` says of a model, asked once and kept in ``known`` (until the model changes), a
    model that cannot take such a body (415) included."""
    answer = known.get(triton_name)
    if answer is None:
        try:
            answer = await learn()
        except UnsupportedMediaType as exc:
            answer = exc
        known[triton_name] = answer
    if isinstance(answer, ServeError):
        raise answer
    return answer


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
        self._csv_inputs: dict[str, csv_values.CsvInput | ServeError] = {}  # Triton name -> where CSV rows go
        self._record_rules: dict[str, record_check.ModelRules] = {}  # Triton name -> what a record may hold
        self._batching: dict[str, ModelBatching | None] = {}  # Triton name -> how its requests merge (None: never)
        self._asking: dict[str, asyncio.Task[None]] = {}  # Triton name -> its configuration being asked for
        self.coalescer = (
            coalescing.Coalescer(
                self._send,
                settings.merge_in_flight,
                metrics,
                settings.workers,
                self._statistics,
                settings.merge_max_row_ms,
            )
            if settings.merge_requests
            else None
        )
        self._arena: InputArena | None = None  # mapped by the Triton of ``_arena_client`` (None: refused)
        self._arena_client: TritonClient | None = None
        self._arena_making: asyncio.Task[None] | None = None
        self._calls: set[asyncio.Future[UpstreamResponse]] = set()  # through a slot, run to their answer
        self._loop = LoopOfFirstUse()

    def follow(self, old: EndpointState, state: EndpointState) -> Awaitable[None] | None:
        """New loopback ports (Triton restarted) mean new clients; the old ones close in what is returned."""
        closing: list[TritonClient | StreamClient] = []
        if (state.http_port, state.triton_key) != (old.http_port, old.triton_key):
            self._image_inputs.clear()  # Triton restarted: models may have been loaded anew
            self._csv_inputs.clear()
            self._record_rules.clear()
            self._forget_batching()
            if self.client is not None:
                closing.append(self.client)
            self.client = None
            if state.http_port is not None:
                url = f"http://127.0.0.1:{state.http_port}"
                access = TritonAccess(state.triton_key) if state.triton_key is not None else None
                self.client = TritonClient(url, self.settings.request_timeout_s, self._pool_size, access)
        if state.grpc_port != old.grpc_port and self._stream_client is not None:
            closing.append(self._stream_client)
            self._stream_client = None
        return _close_all(closing) if closing else None

    def model_changed(self, triton_name: str) -> None:
        """A model was loaded or unloaded under ``triton_name``: what was learnt of it is forgotten."""
        self._image_inputs.pop(triton_name, None)
        self._csv_inputs.pop(triton_name, None)
        self._record_rules.pop(triton_name, None)
        self._forget_batching(triton_name)
        if self.coalescer is not None:
            self.coalescer.forget(triton_name)

    async def close(self) -> None:
        self._forget_batching()
        if self.coalescer is not None:
            await self.coalescer.close()
        if self._arena_making is not None:
            self._arena_making.cancel()
        if self._arena is not None:
            if self._arena_client is self.client and self.client is not None:
                with contextlib.suppress(ServeError):  # Triton gone: its mapping went with it
                    await self.client.shared_memory(self._arena.name)
            self._arena.close()
            self._arena = None
        if self.client is not None:
            await self.client.close()
        if self._stream_client is not None:
            await self._stream_client.close()

    def ready(self) -> TritonClient:
        """The client, if requests may go to Triton now; else 503, as :class:`TritonUnavailable` with
        nothing sent: a request that waited (to be merged, say) while Triton died may then wait for the
        next Triton, as one that met Triton down does (the data plane's waiting)."""
        client = self.client
        state = self.mirror.state
        if not state.serving or client is None:
            raise TritonUnavailable(state.reason or "Triton is not ready", sent=False)
        return client

    # ----- a request read and made ready ----------------------------------------------------------------
    async def read(self, triton_name: str, body: HeldBody, content_type: str | None) -> Inference:
        """An inference request as the front reads it (:mod:`smtriton.serve.dataplane.reading.inference`), or an
        encoded image made the request it stands for."""
        if images.is_image(content_type):
            return images.request(contiguous(body), await self._image_input(self.ready(), triton_name))
        header_length = codec.request_header_length(content_type, len(body))
        if header_length is None and len(body) > large_json.SLICED_JSON_BYTES:
            sliced = await large_json.read(contiguous(body))  # in slices: the event loop serves between them
            self.metrics.transcoded.inc()
            return sliced
        if header_length is not None and header_length > large_json.SLICED_JSON_BYTES:
            raise PayloadTooLarge.saying(
                f"the JSON part of a binary+json request may be at most {large_json.SLICED_JSON_BYTES >> 20} MiB: "
                "send the tensors in its binary part"
            )
        if isinstance(body, BodyPieces) and header_length is not None:  # binary: its JSON part is all that is read
            read = inference.read(body.prefix(header_length), header_length)
            return Inference(body, header_length, read.header, read.complete)
        read = inference.read(contiguous(body), header_length, self.settings.transcode_json_min_bytes)
        if read.body is not body:
            self.metrics.transcoded.inc()
        return read

    async def _image_input(self, client: TritonClient, triton_name: str) -> images.ImageInput:
        """Where an image goes in ``triton_name`` (asked of Triton once, until the model changes)."""

        async def learn() -> images.ImageInput:
            return images.image_input(triton_name, await client.model_metadata(triton_name))

        return await _learnt(self._image_inputs, triton_name, learn)

    async def csv_input(self, triton_name: str) -> csv_values.CsvInput:
        """Where CSV rows go in ``triton_name`` (asked of Triton once, until the model changes)."""

        async def learn() -> csv_values.CsvInput:
            return csvrows.csv_input(triton_name, await self.ready().model_config(triton_name))

        return await _learnt(self._csv_inputs, triton_name, learn)

    async def record_rules(self, triton_name: str) -> record_check.ModelRules:
        """What a record of a multi-record body may hold for ``triton_name`` (asked of Triton once, until the
        model changes); a model Triton cannot describe gets the checks that need no configuration."""
        rules = self._record_rules.get(triton_name)
        if rules is None:
            try:
                config = await self.ready().model_config(triton_name)
            except NotReady:
                raise
            except ServeError:  # not a model Triton knows: its records fail there, in Triton's words
                return record_check.ModelRules(triton_name)
            rules = self._record_rules[triton_name] = record_check.model_rules(triton_name, config)
        return rules

    # ----- to Triton ----------------------------------------------------------------------------------------
    async def infer(self, triton_name: str, inference: Inference) -> UpstreamResponse:
        """Triton's answer to ``inference``: sent at once, or merged with others of its model that wait
        while this worker's earlier requests to it are in flight (module docstring)."""
        coalescer = self.coalescer
        if coalescer is not None:
            model = self._batching.get(triton_name, _UNKNOWN)
            if model is _UNKNOWN:
                self._ask_batching(triton_name)  # meanwhile this request goes alone: nothing waits for it
            elif model is not None:
                assert isinstance(model, ModelBatching)
                return await coalescer.infer(triton_name, inference, model)
        return await self._send(triton_name, inference)

    async def _statistics(self, triton_name: str) -> dict[str, object]:
        """Triton's statistics of a model, by which the coalescer judges whether merging it pays."""
        return await self.ready().model_statistics(triton_name)

    def sender(self, triton_name: str) -> Callable[[Inference], Awaitable[UpstreamResponse]]:
        """How the requests of a body that holds several go to ``triton_name``: as they are, never held to
        merge with other clients' (they merge among themselves:
        :func:`~smtriton.serve.dataplane.batching.coalescing.send_merged`)."""

        async def send(inference: Inference) -> UpstreamResponse:
            return await self._send(triton_name, inference)

        return send

    async def _send(self, triton_name: str, inference: Inference) -> UpstreamResponse:
        client = self.ready()
        length = inference.header_length
        if length and inference.header is not None and self.settings.worker_shm_input_bytes:
            size = len(inference.body) - length
            fits = input_arena.MIN_BYTES <= size <= input_arena.LARGEST_BYTES
            arena = self._arena_for(client) if fits else None
            if arena is not None and size <= arena.largest:
                sizes = input_arena.binary_inputs(inference.header, length, len(inference.body))
                slot = arena.take(size) if sizes is not None else None
                if slot is not None:
                    assert sizes is not None
                    return await self._send_through(client, arena, slot, triton_name, inference, sizes)
        return await client.infer(triton_name, inference.body, length)

    async def _send_through(
        self,
        client: TritonClient,
        arena: InputArena,
        slot: input_arena.Slot,
        triton_name: str,
        inference: Inference,
        sizes: list[int],
    ) -> UpstreamResponse:
        """``inference`` with its binary part in ``slot`` of ``arena``, its JSON part naming the slot. The
        call to Triton runs to its answer even if the client leaves (Triton does not stop a request whose
        HTTP connection closes, and reads the slot until it answers): the slot is free again then. A call
        that ends without an answer (out of time, Triton gone) leaves its slot retired."""
        assert inference.header is not None and inference.header_length is not None
        try:
            arena.fill(slot, inference.body, inference.header_length)
            request = arena.request(inference.header, sizes, slot)
        except BaseException:
            arena.give_back(slot)
            raise
        call = self._loop.get().create_task(client.infer(triton_name, request, None))
        self._calls.add(call)
        self.metrics.through_shared_memory.inc()

        def done(call: asyncio.Future[UpstreamResponse]) -> None:
            self._calls.discard(call)
            if not call.cancelled() and call.exception() is None:
                arena.give_back(slot)
            else:
                arena.retire(slot)  # Triton may still read it

        call.add_done_callback(done)
        return await asyncio.shield(call)

    def _arena_for(self, client: TritonClient) -> InputArena | None:
        """The arena ``client``'s Triton has mapped; None until it has (or when it refused)."""
        if self._arena_client is client:
            return self._arena
        if self._arena_making is None:
            self._arena_making = asyncio.create_task(self._make_arena(client))
        return None

    async def _make_arena(self, client: TritonClient) -> None:
        arena: InputArena | None = None
        try:
            arena = InputArena(self.settings.worker_shm_input_bytes)
            await client.shared_memory(arena.name, arena.key, arena.byte_size)
        except (OSError, ServeError) as exc:
            reason = exc.message if isinstance(exc, ServeError) else str(exc)
            log.warning("no shared memory for inputs (%s): inputs go in the HTTP body to this Triton", reason)
            if arena is not None:
                arena.close()
            arena = None
        except BaseException:
            if arena is not None:
                arena.close()
            raise
        finally:
            self._arena_making = None
        if arena is not None:
            arena.unlink()  # mapped by Triton and here: the name is no longer needed
        if self.client is not client:  # Triton restarted meanwhile
            if arena is not None:
                arena.close()
            return
        if self._arena is not None:
            self._arena.close()
        self._arena, self._arena_client = arena, client

    async def batching(self, triton_name: str) -> ModelBatching | None:
        """How ``triton_name``'s requests may be merged (None: they go alone), asked of Triton if need be."""
        if triton_name not in self._batching:
            self._ask_batching(triton_name)
            asking = self._asking.get(triton_name)
            if asking is not None:
                await asyncio.shield(asking)
        return self._batching.get(triton_name)

    def _ask_batching(self, triton_name: str) -> None:
        """Ask Triton for the model's configuration, once at a time, without making anyone wait for it."""
        if triton_name not in self._asking and self.client is not None and self.mirror.state.serving:
            task = asyncio.create_task(self._learn_batching(self.client, triton_name))
            self._asking[triton_name] = task
            task.add_done_callback(lambda done: self._asked(triton_name, done))

    def _asked(self, triton_name: str, task: asyncio.Task[None]) -> None:
        if self._asking.get(triton_name) is task:
            del self._asking[triton_name]

    async def _learn_batching(self, client: TritonClient, triton_name: str) -> None:
        try:
            config = await client.model_config(triton_name)
        except NotReady:
            return  # Triton is away: asked again by a later request
        except ServeError:
            self._batching[triton_name] = None  # not a model Triton knows: its requests fail alone anyway
            return
        self._batching[triton_name] = rule.model_batching(config)

    def _forget_batching(self, triton_name: str | None = None) -> None:
        """What was learnt of one model's (or, None, every model's) configuration is forgotten, and a
        question still on its way is dropped: its answer could describe the model as it was."""
        names = list(self._asking) if triton_name is None else [triton_name]
        for name in names:
            task = self._asking.pop(name, None)
            if task is not None:
                task.cancel()
        if triton_name is None:
            self._batching.clear()
        else:
            self._batching.pop(triton_name, None)

    async def generate(self, model: str, body: HeldBody) -> UpstreamResponse:
        client = self.ready()
        whole = contiguous(body)
        check_json_depth(whole)
        return await client.generate(model, whole)

    @contextlib.asynccontextmanager
    async def generate_stream(
        self, model: str, body: HeldBody
    ) -> AsyncIterator[tuple[UpstreamResponse | None, AsyncIterator[bytes] | None]]:
        """Triton's generate stream: ``(failure, None)`` with Triton's error answer, or ``(None, events)``
        with the server-sent events as they arrive; leaving the context early drops the upstream request."""
        client = self.ready()
        whole = contiguous(body)
        check_json_depth(whole)
        async with client.generate_stream(model, whole) as upstream:
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
        request = streams.build_request(triton_name, header, contiguous(inference.body), inference.header_length)
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
