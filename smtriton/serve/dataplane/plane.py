"""The data plane of one front worker: what the routes ask of Triton and of the endpoint, no HTTP in it.

Infer, generate and stream for the single model an SME serves; invoke for the models of an MME, through
this worker's copy of the load records, counting the invokes it runs so an unload can wait for them.
Requests go to Triton as SageMaker sent them: the body untouched, except that a large JSON request is
re-encoded binary (:mod:`smtriton.serve.dataplane.transcode`) and custom attributes are added to its parameters.
Answers come back as Triton gave them; mapping them to SageMaker's responses is the HTTP edge's job.

What every worker must agree on is decided by the endpoint's owner in the main process
(:mod:`smtriton.serve.owner.endpoint`): it sends this plane the state (Triton's ports, whether requests may
go to Triton, what `/ping` answers) and each change of the model table, and answers the multi-model
API (load, unload, list, describe) for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from smtriton.serve.dataplane import codec, guard, images, sessions, transcode
from smtriton.serve.dataplane.sessions import SessionStep, SessionStream
from smtriton.serve.errors import BadRequest, ModelNotFound, NotReady, ServeError, UnsupportedMediaType
from smtriton.serve.host import cgroups
from smtriton.serve.ipc.channel import Channel, ChannelClosed
from smtriton.serve.ipc.messages import (
    STARTING,
    Call,
    CloseSession,
    DescribeModel,
    EndpointState,
    Heartbeat,
    InvokeFailed,
    ListModels,
    LoadModel,
    Message,
    ModelAdded,
    ModelDraining,
    ModelRemoved,
    OpenSession,
    SessionAnswered,
    StateChanged,
    UnloadModel,
    UseSession,
)
from smtriton.serve.metrics import Metrics
from smtriton.serve.multimodel.records import ModelRecord
from smtriton.serve.settings import Settings
from smtriton.serve.triton.access import TritonAccess
from smtriton.serve.triton.client import TritonClient, UpstreamResponse

if TYPE_CHECKING:
    from smtriton.serve.dataplane.streaming import StreamClient

log = logging.getLogger("serve")

# docs/contract.md §7: the custom attributes header travels to the model as this request parameter,
# and a response parameter of the same name set by the model comes back as the header.
CUSTOM_ATTRIBUTES = "sagemaker_custom_attributes"


_SESSION = sessions.SESSION_HEADER.lower().encode()
_NEW_SESSION = sessions.NEW_SESSION_HEADER.lower().encode()
_CLOSED_SESSION = sessions.CLOSED_SESSION_HEADER.lower().encode()


def _request_parameters(
    body: codec.RequestBody,
    header_length: int | None,
    custom_attributes: str | None,
    session: dict[str, str | int | bool] | None,
) -> dict[str, str | int | bool]:
    """The parameters the front sets in an inference request: the custom attributes, a session's
    sequence. A request outside a session may set its own sequence, but not one of the sessions'."""
    extra = dict(session or {})
    if custom_attributes is not None:
        extra[CUSTOM_ATTRIBUTES] = custom_attributes
    if session is None and sessions.names_a_session_sequence(body, header_length):
        raise BadRequest(
            f"sequence ids from {sessions.SESSION_SEQUENCES} on belong to stateful sessions: "
            f"send {sessions.SESSION_HEADER} instead"
        )
    return extra


R = TypeVar("R")


class Invocable:
    """A loaded model as this worker invokes it: its record and the invokes running now."""

    def __init__(self, record: ModelRecord) -> None:
        self.record = record
        self.inflight = 0
        self.idle = asyncio.Event()
        self.idle.set()


class Invoke:
    """One MME invoke in flight: the model, and the OOM killer's count when it began (so a failure can
    be judged by what happened during this request only)."""

    __slots__ = ("model", "oom_kills")

    def __init__(self, model: Invocable, oom_kills: int | None) -> None:
        self.model = model
        self.oom_kills = oom_kills


async def _close_all(clients: list[TritonClient | StreamClient]) -> None:
    for client in clients:
        await client.close()


async def _wait_idle(name: str, model: Invocable, timeout: float) -> None:
    try:
        await asyncio.wait_for(model.idle.wait(), timeout)
    except asyncio.TimeoutError:
        log.warning("unloading %s with %d requests still in flight", name, model.inflight)


class DataPlane:
    """One worker's view of the endpoint: the SME ``default_model``, or the MME models, on the one Triton.

    ``owner`` is the channel to the main process (None: a plane used alone, in tests of the routes)."""

    def __init__(
        self,
        settings: Settings,
        metrics: Metrics,
        default_model: str | None = None,
        owner: Channel | None = None,
        pool_size: int = 256,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.default_model = default_model
        self.multi_model = default_model is None
        self.owner = owner
        self.state = STARTING
        self.draining = False
        self.client: TritonClient | None = None
        self._stream_client: StreamClient | None = None
        self._pool_size = pool_size
        self.models: dict[str, Invocable] = {}
        self._image_inputs: dict[str, images.ImageInput | ServeError] = {}  # Triton name -> where an image goes
        # The OOM killer's count in this cgroup, read as each MME invoke begins (None: not counted here).
        self._oom = cgroups.oom_counter(cgroups.memory_group()) if self.multi_model else None

    # ----- what the owner tells -------------------------------------------------------------------
    def handle(self, message: Message) -> Awaitable[None] | None:
        """A notice or a call from the endpoint's owner, taken in the order they were sent; what is
        left to wait for (old clients closing, invokes finishing) is returned."""
        match message:
            case StateChanged(state=state):
                return self.apply(state)
            case ModelAdded(record=record):
                self.models[record.model_name] = Invocable(record)
                self._image_inputs.pop(record.triton_name, None)
            case ModelDraining(name=name, seconds=seconds):
                return self._drain_model(name, seconds)
            case ModelRemoved(name=name):
                self._forget_model(name)
            case Heartbeat():
                pass
            case _:
                raise BadRequest(f"unknown operation {message.op!r}")
        return None

    def _forget_model(self, name: str) -> Invocable | None:
        model = self.models.pop(name, None)
        if model is not None:
            self._image_inputs.pop(model.record.triton_name, None)
        return model

    def apply(self, state: EndpointState) -> Awaitable[None] | None:
        """Take the owner's state; new loopback ports (Triton restarted) mean new clients, and the old
        ones are closed in what is returned."""
        old = self.state
        self.state = state
        closing: list[TritonClient | StreamClient] = []
        if (state.http_port, state.triton_key) != (old.http_port, old.triton_key):
            self._image_inputs.clear()  # Triton restarted: models may have been loaded anew
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

    def _drain_model(self, name: str, timeout: float) -> Awaitable[None] | None:
        """An unload: new invokes of ``name`` get 404 from now on; the invokes running finish in what is
        returned (up to ``timeout`` seconds)."""
        model = self._forget_model(name)
        return _wait_idle(name, model, timeout) if model is not None else None

    async def close(self) -> None:
        if self._oom is not None:
            self._oom.close()
        if self.client is not None:
            await self.client.close()
        if self._stream_client is not None:
            await self._stream_client.close()

    def begin_drain(self) -> None:
        """SIGTERM arrived: /ping fails from now on so no new traffic is routed here; requests
        already accepted still run to completion."""
        self.draining = True

    @property
    def healthy(self) -> bool:
        """What /ping answers, as the owner decided it (false at once on this worker's SIGTERM)."""
        return self.state.healthy and not self.draining

    @property
    def decoupled(self) -> bool:
        """The SME model streams its responses."""
        return self.state.decoupled

    # ----- single-model endpoint ----------------------------------------------------------------
    def sme_model(self) -> str:
        """The model /invocations serves."""
        if self.default_model is None:
            raise BadRequest(
                "this is a multi-model endpoint: invoke a model with POST /models/<name>/invoke "
                "(TargetModel in boto3), or set SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"
            )
        return self.default_model

    def _ready_client(self) -> TritonClient:
        """The client, if requests may go to Triton now (else 503)."""
        client = self.client
        if not self.state.serving or client is None:
            raise NotReady(self.state.reason or "Triton is not ready")
        return client

    async def infer(
        self,
        triton_name: str,
        body: codec.RequestBody,
        content_type: str | None,
        custom_attributes: str | None = None,
        parameters: dict[str, str | int | bool] | None = None,
    ) -> UpstreamResponse:
        """One SageMaker-encoded inference request to a Triton model (an encoded image too, for a model
        that takes one: :mod:`smtriton.serve.dataplane.images`); ``parameters`` are set in the request (a session's
        sequence)."""
        client = self._ready_client()
        header_length: int | None
        if images.is_image(content_type):
            body, header_length = images.request(body, await self._image_input(client, triton_name))
        else:
            header_length = codec.request_header_length(content_type, len(body))
        if header_length is None and 0 < self.settings.transcode_json_min_bytes <= len(body):
            binary = transcode.to_binary(body)  # also refuses a body nested too deep, or lying about its size
            if binary is not None:
                body, header_length = binary
                self.metrics.transcoded.inc()
        elif header_length != 0:
            guard.check_request(body, header_length)
        extra = _request_parameters(body, header_length, custom_attributes, parameters)
        if extra:
            body, header_length = codec.add_request_parameters(body, header_length, extra)
        return await client.infer(triton_name, body, header_length)

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

    async def generate(self, model: str, body: codec.RequestBody) -> UpstreamResponse:
        client = self._ready_client()
        guard.check_json_depth(body)
        return await client.generate(model, body)

    @contextlib.asynccontextmanager
    async def generate_stream(
        self, model: str, body: codec.RequestBody
    ) -> AsyncIterator[tuple[UpstreamResponse | None, AsyncIterator[bytes] | None]]:
        """Triton's generate stream: ``(failure, None)`` with Triton's error answer, or ``(None, events)``
        with the server-sent events as they arrive; leaving the context early drops the upstream request."""
        client = self._ready_client()
        guard.check_json_depth(body)
        async with client.generate_stream(model, body) as upstream:
            if upstream.status != 200:
                payload = await upstream.read()
                yield UpstreamResponse(upstream.status, upstream.headers.get("Content-Type", ""), None, payload), None
                return
            yield None, upstream.content.iter_any()

    def stream(
        self,
        triton_name: str,
        body: codec.RequestBody,
        content_type: str | None,
        custom_attributes: str | None = None,
        parameters: dict[str, str | int | bool] | None = None,
    ) -> AsyncGenerator[dict[str, Any], None]:
        """A decoupled model's responses, one KServe JSON response each, as Triton streams them."""
        from smtriton.serve.dataplane import streaming  # gRPC and numpy only for endpoints that stream

        if images.is_image(content_type):
            raise UnsupportedMediaType("a model that streams its answer takes JSON or binary+json, not an image body")
        header_length = codec.request_header_length(content_type, len(body))
        if header_length != 0:
            guard.check_request(body, header_length)
        extra = _request_parameters(body, header_length, custom_attributes, parameters)
        request = streaming.build_request(triton_name, body, header_length, extra)
        self._ready_client()
        if self._stream_client is None:  # made on first use: most endpoints never stream
            assert self.state.grpc_port is not None
            self._stream_client = streaming.StreamClient(f"127.0.0.1:{self.state.grpc_port}")
        return self._stream_client.stream(request)

    async def instance_count(self) -> int:
        """Model instances Triton runs for the SME model (1 for an MME or when unknown)."""
        if self.default_model is None or not self.state.serving or self.client is None:
            return 1
        try:
            config = await self.client.model_config(self.default_model)
        except ServeError:
            return 1
        groups = config.get("instance_group")
        total = 0
        for group in groups if isinstance(groups, list) else []:
            if isinstance(group, dict):
                total += int(group.get("count", 1))
        return max(1, total)

    # ----- multi-model endpoint: invoke here, the rest asked of the owner -------------------------
    def begin_invoke(self, name: str, target_model: str | None) -> Invoke:
        """Resolve an MME model for one invocation; pair with :meth:`end_invoke` (unloads wait for it)."""
        model = self.models.get(name)
        if model is None:
            raise ModelNotFound(name)
        model.record.check_target(target_model)
        model.inflight += 1
        model.idle.clear()
        return Invoke(model, self._oom.read() if self._oom is not None else None)

    @staticmethod
    def end_invoke(invoke: Invoke) -> None:
        model = invoke.model
        model.inflight -= 1
        if model.inflight == 0:
            model.idle.set()

    async def _ask(self, message: Call[R], *, mme: bool = True) -> R:
        """The owner's answer to ``message``; 503 when the main process cannot be reached."""
        if mme and not self.multi_model:
            raise BadRequest("the multi-model API needs SAGEMAKER_MULTI_MODEL=true")
        if self.owner is None:
            raise NotReady("the endpoint's owner is not reachable")
        try:
            return await self.owner.call(message)
        except ChannelClosed:
            raise NotReady("the server's main process is not reachable (it is stopping or restarting)") from None

    # ----- stateful sessions: the owner keeps them, this plane asks and sets the sequence ----------
    async def session_step(
        self, triton_name: str, header: str, body: codec.RequestBody, content_type: str | None, streamed: bool
    ) -> SessionStep:
        """What a request in a session (``header``: X-Amzn-SageMaker-Session-Id) asks: open or close
        the session (no inference), or an inference in its sequence (the parameters to set)."""
        header_length = None if images.is_image(content_type) else codec.request_header_length(content_type, len(body))
        request = sessions.read_request(header, body, header_length)
        if request.control is None and header_length == 0:
            raise BadRequest("a request in a session is JSON or binary+json: its sequence goes in the parameters")
        if request.session is None:
            if request.control is None and streamed:
                raise BadRequest("a streamed answer cannot open a session: open it first (NEW_SESSION, or "
                                 '{"requestType": "NEW_SESSION"}), then stream in it')  # fmt: skip
            opened = await self._ask(OpenSession(triton_name), mme=False)
            value = f"{opened['id']}; Expires={opened['expires']}".encode()
            headers = [(_SESSION, value), (_NEW_SESSION, value)]
            if request.control == "open":
                answer = orjson.dumps({"session_id": opened["id"], "expires": opened["expires"]})
                return SessionStep(opened["id"], None, headers, answer)
            start: dict[str, str | int | bool] = {"sequence_id": opened["sequence_id"], "sequence_start": True}
            return SessionStep(opened["id"], start, headers, opened=True)
        session = request.session
        closed = [(_CLOSED_SESSION, session.encode())]
        if request.control == "close":
            await self._ask(CloseSession(session, triton_name), mme=False)
            return SessionStep(session, None, closed, orjson.dumps({"closed_session_id": session}))
        used = await self._ask(UseSession(session, triton_name), mme=False)
        parameters: dict[str, str | int | bool] = {"sequence_id": used["sequence_id"]}
        if used["start"]:
            parameters["sequence_start"] = True
        if request.close:
            parameters["sequence_end"] = True
        return SessionStep(session, parameters, closed if request.close else [], closes=request.close)

    async def session_done(self, step: SessionStep, answered: bool) -> None:
        """After the session's inference, tell the owner how it went: a session whose first inference
        failed never began, one whose closing inference was answered is closed, and otherwise the
        sequence has started (when answered) and was used now."""
        if (step.opened and not answered) or (step.closes and answered):
            await self._ask(CloseSession(step.session, "", any_model=True), mme=False)
        elif answered and step.parameters is not None and step.parameters.get("sequence_start"):
            # The sequence started: the owner must know before the caller can send the next request,
            # which another worker may take, or that one would start the sequence again.
            await self._ask(SessionAnswered(step.session), mme=False)
        elif answered and self.owner is not None:
            self.owner.notify(SessionAnswered(step.session))

    def stream_in_session(self, step: SessionStep, responses: AsyncGenerator[dict[str, Any], None]) -> SessionStream:
        """A streamed answer in a session: its responses to iterate, and the clean-up to run once it
        ends (:meth:`SessionStream.close`), also when nothing ever iterated it."""
        return SessionStream(self, step, responses)

    async def invoke_out_of_memory(self, invoke: Invoke, message: str, status: int) -> bool:
        """Whether a failed invoke was out of memory (the owner decides, once for all workers)."""
        return await self._ask(InvokeFailed(message, status, invoke.oom_kills))

    async def load(self, body: bytes, target_model: str | None) -> None:
        await self._ask(LoadModel(body.decode("latin-1"), target_model))

    async def unload(self, name: str, target_model: str | None) -> None:
        await self._ask(UnloadModel(name, target_model))

    async def list_models(self, token: str | None, limit: str | None) -> dict[str, Any]:
        return await self._ask(ListModels(token, limit))

    async def describe(self, name: str) -> dict[str, str]:
        return await self._ask(DescribeModel(name))
