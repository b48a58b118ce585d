"""The data plane of one front worker: it owns an inference request from its head to its answer.

:meth:`DataPlane.invoke` is the one call the HTTP side makes for an inference request
(:mod:`smtriton.serve.dataplane.request` says what goes in and comes out, nothing of HTTP): it resolves
the model (the single model of an SME, or an MME model through this worker's copy of the load records,
counting the invoke in flight so that an unload can wait for it), reads the body, takes the request's
steps in its session, sends it to Triton, maps Triton's answer to SageMaker's
(:mod:`smtriton.serve.dataplane.answers`), asks the owner whether a failed MME invoke ran out of memory,
and counts and logs the request. A body of several records (batch transform's mini-batches: JSON Lines,
CSV rows) is answered a line a record (:mod:`~smtriton.serve.dataplane.records.multirecord`,
:mod:`~smtriton.serve.dataplane.records.csvrows`). The control routes make one call each too: load, unload, list and
describe (the owner's to decide), and batch transform's execution parameters.

The parts, each a job of its own: what the owner told this worker
(:mod:`~smtriton.serve.dataplane.sending.mirror`), the way to Triton
(:mod:`~smtriton.serve.dataplane.sending.upstream`), the questions to the owner
(:mod:`~smtriton.serve.dataplane.sending.owner_link`), the session steps
(:mod:`~smtriton.serve.dataplane.sending.sessions`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from smtriton.serve import headers
from smtriton.serve.dataplane import answers
from smtriton.serve.dataplane.reading import codec, images
from smtriton.serve.dataplane.reading.inference import Inference
from smtriton.serve.dataplane.records import csvrows, multirecord
from smtriton.serve.dataplane.request import Headers, Reply, Request, Streamed
from smtriton.serve.dataplane.sending import sessions
from smtriton.serve.dataplane.sending.mirror import EndpointMirror, Invoke
from smtriton.serve.dataplane.sending.owner_link import OwnerLink
from smtriton.serve.dataplane.sending.sessions import SessionStep, SessionSteps
from smtriton.serve.dataplane.sending.upstream import Upstream
from smtriton.serve.dataplane.sending.waiting import Waiting
from smtriton.serve.errors import (
    INTERNAL_ERROR,
    BadRequest,
    ModelNotFound,
    PayloadTooLarge,
    ServeError,
    TritonUnavailable,
    UnsupportedMediaType,
    error_body,
)
from smtriton.serve.host import memory
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
from smtriton.serve.setting_types import MIB
from smtriton.serve.settings import DEFAULT_BATCH_PAYLOAD_MB, Settings
from smtriton.serve.triton.client import RequestBody, UpstreamResponse
from smtriton.serve.triton.request_body import BodyPieces, HeldBody, contiguous

log = logging.getLogger("serve")

EMPTY_BODY = "the request body is empty: send the model's inputs as an inference request (JSON, or binary+json)"
CLIENT_CLOSED = 499  # the status counted for a request whose client left before its answer (nginx's)
# Request buffers this large are given back beside the event loop once read (freed at once, one holds
# the loop ~0.13 s a GiB).
GIVE_BACK_FROM = 64 * MIB
_BLANK_MAX = 4096  # a body up to this size may be told "empty" when it is only whitespace
# Compressed bodies up to this size inflate on the event loop (a few milliseconds at most); larger ones
# in a thread.
INFLATE_ON_LOOP_BYTES = 8 * 1024
# A body held in pieces up to this size is joined on the event loop (a few milliseconds at most).
JOIN_ON_LOOP_BYTES = 8 * 1024 * 1024
_ATTRIBUTES = headers.wire(headers.CUSTOM_ATTRIBUTES)


def error_reply(status: int, message: str) -> Reply:
    return Reply(status, codec.JSON, error_body(message))


@dataclass(slots=True)
class _Target:
    """The Triton model a request goes to; ``invoke``: an MME invoke in flight (None on an SME)."""

    triton_name: str
    decoupled: bool
    invoke: Invoke | None = None


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
        self._giving_back: set[asyncio.Future[None]] = set()

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
        attributes = request.custom_attributes
        if attributes is not None and len(attributes) > headers.CUSTOM_ATTRIBUTES_MAX:
            raise BadRequest(
                f"{headers.CUSTOM_ATTRIBUTES} is {len(attributes)} characters long; "
                f"InvokeEndpoint takes at most {headers.CUSTOM_ATTRIBUTES_MAX}"
            )
        if request.model is None:
            model = self.sme_model()
            body = await self._body(request)
            if self.settings.inference_type != "infer":
                return await self._generate(model, body, request)
            return await self._infer_or_explain(request, body, _Target(model, self.mirror.state.decoupled))
        if not self.multi_model:
            raise ModelNotFound(request.model)
        body = await self._body(request)
        invoke = self.mirror.begin_invoke(request.model, request.target_model)
        record = invoke.record
        try:
            reply = await self._infer_or_explain(request, body, _Target(record.triton_name, record.decoupled, invoke))
        except BaseException:
            invoke.end()
            raise
        if reply.stream is None:
            invoke.end()
        return reply

    async def _body(self, request: Request) -> HeldBody:
        try:
            body = await request.read_body()
            if isinstance(body, BodyPieces) and (request.encoding is not None or not _binary(request.content_type)):
                body = await _whole(body)  # only a binary request goes to Triton in its pieces: the rest is read whole
            if request.encoding is None:
                return body
            limit = self.settings.max_payload_bytes
            if len(body) <= INFLATE_ON_LOOP_BYTES:
                return codec.decompress(contiguous(body), request.encoding, limit)
            # zlib lets other threads run while it inflates: a large body inflates beside the event loop,
            # bounded by the limit (a bomb stops there, 413)
            return await asyncio.to_thread(codec.decompress, contiguous(body), request.encoding, limit)
        except PayloadTooLarge:
            if not self.settings.batch:
                raise
            raise PayloadTooLarge(self.settings.max_payload_bytes, self._batch_limit()) from None

    def _batch_limit(self) -> str:
        """Where batch transform's body limit comes from, said in its 413."""
        settings = self.settings
        megabytes = settings.max_payload_in_mb
        if megabytes:
            source = f"SAGEMAKER_MAX_PAYLOAD_IN_MB={megabytes}, the job's"
        elif megabytes is None and settings.max_payload_bytes == DEFAULT_BATCH_PAYLOAD_MB * MIB:
            megabytes, source = DEFAULT_BATCH_PAYLOAD_MB, "SageMaker's default, which /execution-parameters answers"
        else:
            return " (SMTRITON_MAX_PAYLOAD_BYTES)"
        return f": batch transform's MaxPayloadInMB of {megabytes} MB ({source}); send smaller mini-batches"

    async def _infer_or_explain(self, request: Request, body: HeldBody, target: _Target) -> Reply:
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
            self._give_back(body)
        if reply.status == 400 and blank:
            return error_reply(400, EMPTY_BODY)
        return reply

    def _give_back(self, buffer: object) -> None:
        """A large buffer of a request, no longer read, given back to the system beside the answer
        (freed at once, a gigabyte holds the event loop for a tenth of a second): a body read whole, or
        the tensors a large JSON request was re-encoded into (a mapping of their own)."""
        if isinstance(buffer, bytearray) and len(buffer) >= GIVE_BACK_FROM:
            task = asyncio.ensure_future(_shrink(buffer))
            self._giving_back.add(task)
            task.add_done_callback(self._giving_back.discard)
        elif isinstance(buffer, BodyPieces):
            for piece in buffer.pieces:
                if memory.is_untouched(piece) and len(piece) >= GIVE_BACK_FROM:
                    memory.give_back_beside_loop(piece)

    async def _infer(self, request: Request, body: HeldBody, target: _Target) -> Reply:
        """An inference (streamed for a decoupled model), in its session if the request names one."""
        deadline = time.monotonic() + self.settings.request_timeout_s
        if target.decoupled and images.is_image(request.content_type):
            raise UnsupportedMediaType("a model that streams its answer takes JSON or binary+json, not an image body")
        if not isinstance(body, BodyPieces):  # a body held in pieces is a binary request's: no rows, no records
            if csvrows.is_csv(request.content_type, body):
                return await self._csv_rows(request, body, target, deadline)
            if multirecord.holds_records(request.content_type, body, self.settings.batch):
                return await self._records(request, body, target, deadline)
        inference = await self.upstream.read(target.triton_name, body, request.content_type)
        if inference.body is not body:
            self._give_back(body)  # re-encoded: the body as it came is read no more
        step = None
        if request.session is not None:
            step = await self.sessions.step(
                target.triton_name, request.session, inference.header, inference.header is not None, target.decoupled
            )
            if step.parameters is None:  # opened or closed the session: nothing to infer
                return Reply(200, codec.JSON, step.body, step.headers)
        inference = _with_front_parameters(inference, request.custom_attributes, step)
        if target.decoupled:
            return self._streamed(target, inference, request.accept, step)
        if step is None:
            try:
                if sessions.in_a_sequence(inference.parameters):
                    upstream = await self._send_once(target, inference, None)
                else:
                    upstream = await self._send(target, inference, deadline)
            finally:
                if inference.body is not body:
                    self._give_back(inference.body)
        else:
            upstream = await self._send_once(target, inference, step)
        status, content_type, payload = await self._answer(target, upstream)
        answer_headers = _attributes(upstream)
        if step is not None:
            await self.sessions.done(step, status == 200)
            if status == 200:
                answer_headers += step.headers
        return Reply(status, content_type, payload, answer_headers)

    async def _send(self, target: _Target, inference: Inference, deadline: float) -> UpstreamResponse:
        """A stateless inference to Triton, which a Triton death costs time, not its answer
        (:meth:`~smtriton.serve.dataplane.sending.waiting.Waiting.send`); it may merge with other clients' requests."""
        name = target.triton_name
        return await self.waiting.send(
            lambda: self.upstream.infer(name, inference), deadline, name, len(inference.body)
        )

    async def _send_once(self, target: _Target, inference: Inference, step: SessionStep | None) -> UpstreamResponse:
        """An inference of a sequence (its session's ``step``, or one it sets itself): sent once, never held
        for a restarting Triton nor sent again after a death, since the next Triton holds nothing of the
        sequence (it would answer from a fresh state, or refuse): 503 saying so."""
        try:
            return await self.upstream.infer(target.triton_name, inference)
        except TritonUnavailable as exc:
            if step is None:
                raise TritonUnavailable(f"{exc.message}: {sessions.SEQUENCE_LOST}") from None
            await self.sessions.done(step, False)
            raise TritonUnavailable(
                f"{exc.message}: a session's sequence does not outlive its Triton; open a new session"
            ) from None
        except BaseException:
            if step is not None:
                await self.sessions.done(step, False)
            raise

    # ----- bodies of several records (batch transform's mini-batches) ------------------------------------
    def _records_only(self, request: Request, target: _Target, what: str) -> None:
        """Records are answered whole, each alone: neither in a session nor streamed."""
        if request.session is not None:
            raise BadRequest(f"{what} cannot be sent in a stateful session: send one request a session step")
        if target.decoupled:
            raise UnsupportedMediaType(f"a model that streams its answer takes JSON or binary+json, not {what}")

    def _to_answer(self, target: _Target) -> Callable[[UpstreamResponse], answers.Answer]:
        """How one record's Triton answer becomes SageMaker's (on an MME, with the caller's model name)."""
        invoke = target.invoke
        if invoke is None:
            return answers.to_sagemaker
        return lambda upstream: answers.to_mme_response(invoke.record, upstream)

    def _sender(self, target: _Target, deadline: float) -> Callable[[Inference], Awaitable[UpstreamResponse]]:
        """How each Triton request of a body goes: as a single stateless one does (:meth:`_send`: a Triton
        death costs it time, not its answer), but never held to merge with other clients' requests."""
        name, send = target.triton_name, self.upstream.sender(target.triton_name)

        async def sent(inference: Inference) -> UpstreamResponse:
            return await self.waiting.send(lambda: send(inference), deadline, name, len(inference.body))

        return sent

    async def _records(self, request: Request, body: RequestBody, target: _Target, deadline: float) -> Reply:
        """A body of JSON Lines, one KServe v2 request a line (:mod:`~smtriton.serve.dataplane.records.multirecord`)."""
        self._records_only(request, target, "a body of several records")
        name = target.triton_name
        rules = await self.waiting.ask(lambda: self.upstream.record_rules(name), deadline)

        async def read(line: RequestBody) -> Inference:
            inference = await self.upstream.read(name, line, None)
            return _with_front_parameters(inference, request.custom_attributes, None)

        work = multirecord.Work(
            read,
            rules,
            await self.upstream.batching(name) if self.upstream.coalescer is not None else None,
            self._sender(target, deadline),
            self._to_answer(target),
            self.settings.failed_record == "error-line",
            self.settings.records_in_flight,
        )
        return await multirecord.answer(body, work)

    async def _csv_rows(self, request: Request, body: RequestBody, target: _Target, deadline: float) -> Reply:
        """A text/csv body, a row a line (:mod:`~smtriton.serve.dataplane.records.csvrows`)."""
        self._records_only(request, target, "a text/csv body")
        to = await self.waiting.ask(lambda: self.upstream.csv_input(target.triton_name), deadline)
        parameters = {} if request.custom_attributes is None else {answers.CUSTOM_ATTRIBUTES: request.custom_attributes}
        work = csvrows.Work(
            self._sender(target, deadline),
            self._to_answer(target),
            self.settings.failed_record == "error-line",
            self.settings.records_in_flight,
            csvrows.wants_json_lines(request.accept),
            target.invoke.record.response_name if target.invoke is not None else target.triton_name,
            parameters,
        )
        return await csvrows.answer(body, to, work)

    async def _answer(self, target: _Target, upstream: UpstreamResponse) -> answers.Answer:
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

    def _streamed(self, target: _Target, inference: Inference, accept: str | None, step: SessionStep | None) -> Reply:
        responses = self.upstream.stream(target.triton_name, inference)
        media_type = answers.stream_media_type(accept)
        on_done = target.invoke.end if target.invoke is not None else None
        if step is None:
            return Reply(200, media_type, b"", [], _streamed(responses, media_type, on_done))
        session = self.sessions.stream(step, responses)
        stream = _streamed(session.responses, media_type, on_done, step.headers, session.close)
        return Reply(200, media_type, b"", [], stream)

    async def _generate(self, model: str, body: HeldBody, request: Request) -> Reply:
        """Triton's generate API (SAGEMAKER_TRITON_INFERENCE_TYPE generate or generate_stream)."""
        if request.session is not None:
            raise BadRequest("stateful sessions need SAGEMAKER_TRITON_INFERENCE_TYPE=infer")
        if self.settings.inference_type == "generate":
            return Reply(*answers.to_sagemaker(await self.upstream.generate(model, body)))
        # Triton's server-sent events, passed on as they arrive; a client that goes away closes the
        # upstream request too.
        context = self.upstream.generate_stream(model, body)
        failure, events = await context.__aenter__()

        async def close_upstream() -> None:
            await context.__aexit__(None, None, None)

        if events is None:
            await close_upstream()
            assert failure is not None
            return Reply(*answers.to_sagemaker(failure))
        return Reply(200, answers.SSE, b"", [], Streamed(events, answers.SSE, close_upstream))

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


async def _shrink(buffer: bytearray) -> None:
    """Give ``buffer``'s memory back (its pages released in a thread, then the buffer freed), the event
    loop served meanwhile; a buffer still seen through a view stays whole: it goes when that lets go."""
    if not memory.unused(buffer):
        return
    await asyncio.to_thread(memory.drop_pages, buffer)
    with contextlib.suppress(BufferError):
        buffer.clear()


async def _whole(body: BodyPieces) -> RequestBody:
    """A body read whole: joined, or (past :data:`JOIN_ON_LOOP_BYTES`) gathered beside the event loop,
    held once, while the loop serves (each piece's copy lets go of the GIL or is short)."""
    if len(body) <= JOIN_ON_LOOP_BYTES:
        return body.joined()
    return await asyncio.to_thread(body.gathered)


def _binary(content_type: str | None) -> bool:
    """Whether the request is binary+json (its tensors after a JSON part)."""
    return multirecord.media_type(content_type) == codec.BINARY_JSON


def _path(request: Request) -> str:
    return "/invocations" if request.model is None else f"/models/{request.model}/invoke"


def _with_front_parameters(inference: Inference, custom_attributes: str | None, step: SessionStep | None) -> Inference:
    """The request with the parameters the front sets: the custom attributes, a session's sequence. A
    request outside a session may set its own sequence, but not one of the sessions'."""
    extra: dict[str, Any] = dict(step.parameters) if step is not None and step.parameters is not None else {}
    if step is None and sessions.names_a_session_sequence(inference.parameters):
        raise BadRequest(
            f"sequence ids from {sessions.SESSION_SEQUENCES} on belong to stateful sessions: "
            f"send {headers.SESSION} instead"
        )
    if custom_attributes is not None:
        extra[answers.CUSTOM_ATTRIBUTES] = custom_attributes
    return inference.with_parameters(extra)


def _attributes(upstream: UpstreamResponse) -> Headers:
    """The custom attributes header of an answer, when the model set them."""
    value = answers.custom_attributes(upstream)
    return [] if value is None else [(_ATTRIBUTES, value.encode("latin-1", errors="replace"))]


def _streamed(
    responses: AsyncGenerator[dict[str, Any], None],
    media_type: str,
    on_done: Callable[[], None] | None = None,
    answer_headers: Headers | None = None,
    close_responses: Callable[[], Awaitable[None]] | None = None,
) -> Streamed:
    """A decoupled model's answer, streamed; when it ends, however it ends, the Triton stream is
    closed (cancelled, if it still runs) and ``on_done`` runs. ``close_responses`` closes ``responses``
    (by default their ``aclose``; a session's stream also tells the owner how it ended)."""
    chunks = answers.framed(responses, media_type)
    end = responses.aclose if close_responses is None else close_responses

    async def close() -> None:
        try:
            try:
                await chunks.aclose()
            finally:
                await end()
        finally:
            if on_done is not None:
                on_done()

    return Streamed(chunks, media_type, close, answer_headers)
