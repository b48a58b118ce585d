"""The data plane of one front worker: it owns an inference request from its head to its answer.

:meth:`DataPlane.invoke` is the one call the HTTP side makes for an inference request
(:mod:`~smtriton.serve.dataplane.request` says what goes in and comes out, nothing of HTTP). It tells the
story of one request, each step one call into a room of ``dataplane/``:

1. the model: the single model of an SME, or an MME model through this worker's copy of the load
   records, the invoke counted in flight so that an unload can wait for it (``sending/mirror.py``);
2. the body, read whole or in its pieces, inflated (``reading/body.py``);
3. a body of several records (batch transform's mini-batches: JSON Lines, CSV rows) is answered a line a
   record (``records/``, through ``sending/sender.py``); any other is read once, as Triton will read it
   (``reading/``, through :meth:`Upstream.read <smtriton.serve.dataplane.sending.upstream.Upstream.read>`);
4. the request's step in its session, when it names one (``sending/sessions.py``), and the parameters
   the front sets;
5. Triton: a decoupled model's answer streamed; any other request sent, a stateless one waiting for a
   Triton that serves and merged with others of its model where Triton would batch them
   (``sending/sender.py``, ``sending/waiting.py``, ``batching/``);
6. the answer: Triton's mapped to SageMaker's (:mod:`~smtriton.serve.dataplane.answers`), the owner asked
   whether a failed MME invoke ran out of memory;
7. the request counted, and logged when it failed.

The control routes make one call each too: load, unload, list and describe (the owner's to decide), and
batch transform's execution parameters. What the owner tells this worker comes in through
:meth:`DataPlane.handle`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any

from smtriton.serve import headers
from smtriton.serve.dataplane import answers
from smtriton.serve.dataplane.reading import codec, images
from smtriton.serve.dataplane.reading.body import Buffers, read_body
from smtriton.serve.dataplane.records import csvrows, multirecord
from smtriton.serve.dataplane.request import Headers, Reply, Request
from smtriton.serve.dataplane.sending.mirror import EndpointMirror, Target
from smtriton.serve.dataplane.sending.owner_link import OwnerLink
from smtriton.serve.dataplane.sending.sender import Sender, with_front_parameters
from smtriton.serve.dataplane.sending.sessions import SessionSteps
from smtriton.serve.dataplane.sending.upstream import Upstream
from smtriton.serve.dataplane.sending.waiting import Waiting
from smtriton.serve.errors import (
    INTERNAL_ERROR,
    BadRequest,
    ModelNotFound,
    ServeError,
    UnsupportedMediaType,
    error_body,
)
from smtriton.serve.ipc.channel import Channel
from smtriton.serve.ipc.messages import (
    EndpointState,
    Heartbeat,
    Message,
    ModelAdded,
    ModelDraining,
    ModelRemoved,
    StateChanged,
)
from smtriton.serve.logs import log_failure
from smtriton.serve.metrics import Metrics
from smtriton.serve.settings import DEFAULT_BATCH_PAYLOAD_MB, Settings
from smtriton.serve.triton.client import UpstreamResponse
from smtriton.serve.triton.request_body import BodyPieces, HeldBody

log = logging.getLogger("serve")

EMPTY_BODY = "the request body is empty: send the model's inputs as an inference request (JSON, or binary+json)"
CLIENT_CLOSED = 499  # the status counted for a request whose client left before its answer (nginx's)
_BLANK_MAX = 4096  # a body up to this size may be told "empty" when it is only whitespace
_ATTRIBUTES = headers.wire(headers.CUSTOM_ATTRIBUTES)


def error_reply(status: int, message: str) -> Reply:
    return Reply(status, codec.JSON, error_body(message))


class DataPlane:
    """One worker's view of the endpoint: the SME ``default_model``, or the MME models, on the one Triton.

    ``owner`` is the channel to the main process (None: a plane used alone, in tests)."""

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
        self.mirror = EndpointMirror(self.multi_model)
        self.upstream = Upstream(settings, metrics, self.mirror, pool_size)
        self.owner = OwnerLink(owner, self.multi_model)
        self.sessions = SessionSteps(self.owner)
        self.waiting = Waiting(settings, self.mirror, self.owner.probation)
        self.sender = Sender(settings, self.upstream, self.waiting, self.sessions)
        self.buffers = Buffers()

    # ----- what the owner tells -------------------------------------------------------------------
    def handle(self, message: Message) -> Awaitable[None] | None:
        """A notice or a call from the endpoint's owner, taken in the order they were sent; what is
        left to wait for (old clients closing, invokes finishing) is returned."""
        match message:
            case StateChanged(state=state):
                return self.apply(state)
            case ModelAdded(record=record):
                self.mirror.add(record)
                self.upstream.model_changed(record.triton_name)
            case ModelDraining(name=name, seconds=seconds):
                self._model_gone(name)
                return self.mirror.drain(name, seconds)
            case ModelRemoved(name=name):
                self._model_gone(name)
                self.mirror.forget(name)
            case Heartbeat():
                pass
            case _:
                raise BadRequest(f"unknown operation {message.op!r}")
        return None

    def _model_gone(self, name: str) -> None:
        model = self.mirror.models.get(name)
        if model is not None:
            self.upstream.model_changed(model.record.triton_name)

    def apply(self, state: EndpointState) -> Awaitable[None] | None:
        """Take the owner's state; new loopback ports (Triton restarted) mean new clients, and the old
        ones are closed in what is returned."""
        return self.upstream.follow(self.mirror.apply(state), state)

    def begin_drain(self) -> None:
        """SIGTERM arrived: /ping fails from now on so no new traffic is routed here; requests
        already accepted still run to completion."""
        self.mirror.draining = True

    @property
    def healthy(self) -> bool:
        return self.mirror.healthy

    def ping_status(self) -> int:
        """What ``GET /ping`` answers: the owner's verdict, and 503 once this worker drains."""
        return 200 if self.mirror.healthy else 503

    async def close(self) -> None:
        self.mirror.close()
        await self.upstream.close()

    # ----- an inference request: the one call --------------------------------------------------------
    async def invoke(self, request: Request) -> Reply:
        """Answer one inference request: SME ``/invocations`` when ``request.model`` is None, else an MME
        invoke. Errors become their JSON answers here; failures are logged and counted."""
        route = "invocations" if request.model is None else "invoke"
        started = self.metrics.begin(route)
        model = request.model or self.default_model or ""
        status = 500
        try:
            reply = await self._invoke(request)
            status = reply.status
        except ServeError as exc:
            status = exc.status
            reply = error_reply(status, exc.message)
        except asyncio.CancelledError:  # the client went away: its request upstream was cancelled
            status = CLIENT_CLOSED
            raise
        except Exception:  # a bug, not the client's fault: logged with its traceback, answered in JSON
            log.exception("POST %s failed inside serve", _path(request))
            reply = error_reply(500, INTERNAL_ERROR)
        finally:
            self.metrics.end(route, model, status, started)
        if status != 200:
            log_failure("POST", _path(request), status, request.inference_id)
        return reply

    def sme_model(self) -> str:
        """The model /invocations serves."""
        if self.default_model is None:
            raise BadRequest(
                "this is a multi-model endpoint: invoke a model with POST /models/<name>/invoke "
                "(TargetModel in boto3), or set SAGEMAKER_TRITON_DEFAULT_MODEL_NAME"
            )
        return self.default_model

    async def _invoke(self, request: Request) -> Reply:
        """Steps 1 and 2: the model and the body."""
        attributes = request.custom_attributes
        if attributes is not None and len(attributes) > headers.CUSTOM_ATTRIBUTES_MAX:
            raise BadRequest(
                f"{headers.CUSTOM_ATTRIBUTES} is {len(attributes)} characters long; "
                f"InvokeEndpoint takes at most {headers.CUSTOM_ATTRIBUTES_MAX}"
            )
        if request.model is None:
            model = self.sme_model()
            body = await read_body(request, self.settings)
            if self.settings.inference_type != "infer":
                return await self.sender.generate(model, body, request)
            return await self._infer_or_explain(request, body, Target(model, self.mirror.state.decoupled))
        if not self.multi_model:
            raise ModelNotFound(request.model)
        body = await read_body(request, self.settings)
        invoke = self.mirror.begin_invoke(request.model, request.target_model)
        record = invoke.record
        try:
            reply = await self._infer_or_explain(request, body, Target(record.triton_name, record.decoupled, invoke))
        except BaseException:
            invoke.end()
            raise
        if reply.stream is None:
            invoke.end()
        return reply

    async def _infer_or_explain(self, request: Request, body: HeldBody, target: Target) -> Reply:
        """:meth:`_infer`, with an empty body's 400 said in words (Triton says nothing of it); a large
        body is given back once answered."""
        blank = len(body) <= _BLANK_MAX and (not body or body.isspace())
        try:
            reply = await self._infer(request, body, target)
        except ServeError as exc:
            if exc.status == 400 and blank:
                raise BadRequest(EMPTY_BODY) from None
            raise
        finally:
            self.buffers.give_back(body)
        if reply.status == 400 and blank:
            return error_reply(400, EMPTY_BODY)
        return reply

    async def _infer(self, request: Request, body: HeldBody, target: Target) -> Reply:
        """Steps 3 to 6: an inference (streamed for a decoupled model), in its session if the request
        names one."""
        deadline = time.monotonic() + self.settings.request_timeout_s
        if target.decoupled and images.is_image(request.content_type):
            raise UnsupportedMediaType("a model that streams its answer takes JSON or binary+json, not an image body")
        if not isinstance(body, BodyPieces):  # a body held in pieces is a binary request's: no rows, no records
            if csvrows.is_csv(request.content_type, body):
                return await self.sender.csv_rows(request, body, target, deadline)
            if multirecord.holds_records(request.content_type, body, self.settings.batch):
                return await self.sender.records(request, body, target, deadline)
        inference = await self.upstream.read(target.triton_name, body, request.content_type)
        if inference.body is not body:
            self.buffers.give_back(body)  # re-encoded: the body as it came is read no more
        step = None
        if request.session is not None:
            step = await self.sessions.step(
                target.triton_name, request.session, inference.header, inference.header is not None, target.decoupled
            )
            if step.parameters is None:  # opened or closed the session: nothing to infer
                return Reply(200, codec.JSON, step.body, step.headers)
        inference = with_front_parameters(inference, request.custom_attributes, step)
        if target.decoupled:
            return self.sender.stream(target, inference, request.accept, step)
        try:
            upstream = await self.sender.infer(target, inference, deadline, step)
        finally:
            if step is None and inference.body is not body:
                self.buffers.give_back(inference.body)
        status, content_type, payload = await self._answer(target, upstream)
        answer_headers = _attributes(upstream)
        if step is not None:
            await self.sessions.done(step, status == 200)
            if status == 200:
                answer_headers += step.headers
        return Reply(status, content_type, payload, answer_headers)

    async def _answer(self, target: Target, upstream: UpstreamResponse) -> answers.Answer:
        """Triton's answer as SageMaker's: on an MME, with the caller's model name, and a failure judged
        out of memory or not by the owner (the invoke is no longer in flight by then)."""
        invoke = target.invoke
        if invoke is None:
            return answers.to_sagemaker(upstream)
        invoke.end()
        oom = answers.may_be_out_of_memory(upstream) and await self.owner.out_of_memory(
            answers.failure_message(upstream), upstream.status, invoke.oom_kills
        )
        return answers.to_mme_response(invoke.record, upstream, oom)

    # ----- the control routes: one call each --------------------------------------------------------------
    async def execution_parameters(self) -> dict[str, Any]:
        """Batch transform asks before sending work (docs/contract.md §7): job settings first, then ours."""
        settings = self.settings
        concurrency = settings.max_concurrent_transforms
        if concurrency is None:
            concurrency = await self.upstream.instance_count(self.default_model) if self.default_model else 1
        return {
            "MaxConcurrentTransforms": concurrency,
            "BatchStrategy": settings.batch_strategy or "MULTI_RECORD",
            # 0 is passed on as set: SageMaker's "any size, chunked" (serve still refuses a body past
            # SMTRITON_MAX_PAYLOAD_BYTES: it never holds an unbounded one).
            "MaxPayloadInMB": (
                settings.max_payload_in_mb if settings.max_payload_in_mb is not None else DEFAULT_BATCH_PAYLOAD_MB
            ),
        }

    async def load(self, body: bytes, target_model: str | None) -> None:
        """A multi-model load (the owner's to decide), counted in the metrics."""
        started = time.perf_counter()
        try:
            await self.owner.load(body, target_model)
        except ServeError:
            self.metrics.model_load(False, time.perf_counter() - started)
            raise
        self.metrics.model_load(True, time.perf_counter() - started)

    async def unload(self, name: str, target_model: str | None) -> None:
        """A multi-model unload (the owner's to decide), counted in the metrics."""
        try:
            await self.owner.unload(name, target_model)
        except ServeError as exc:
            self.metrics.model_unload(exc.status == 404)
            raise
        self.metrics.model_unload(True)

    async def list_models(self, token: str | None, limit: str | None) -> dict[str, Any]:
        return await self.owner.list_models(token, limit)

    async def describe(self, name: str) -> dict[str, str]:
        return await self.owner.describe(name)


def _path(request: Request) -> str:
    return "/invocations" if request.model is None else f"/models/{request.model}/invoke"


def _attributes(upstream: UpstreamResponse) -> Headers:
    """The custom attributes header of an answer, when the model set them."""
    value = answers.custom_attributes(upstream)
    return [] if value is None else [(_ATTRIBUTES, value.encode("latin-1", errors="replace"))]
