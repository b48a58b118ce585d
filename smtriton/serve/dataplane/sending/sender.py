"""How each kind of inference goes to Triton, and what a Triton that is down costs it.

- A stateless inference (no session, no sequence of its own, not streamed) takes the one path of
  :meth:`~smtriton.serve.dataplane.sending.waiting.Waiting.send`: it waits for a Triton that serves, and
  is sent again once after a Triton death (a crash costs it time, not its answer); on its way it may
  merge with other clients' requests of its model (:meth:`Upstream.infer
  <smtriton.serve.dataplane.sending.upstream.Upstream.infer>`).
- An inference of a sequence (its session's step, or one it sets itself) is sent once: never held for a
  restarting Triton nor sent again after a death, since the next Triton holds nothing of the sequence
  (503 saying so).
- A decoupled model's answer is streamed; Triton's generate API (``SAGEMAKER_TRITON_INFERENCE_TYPE``)
  passes Triton's answer or its server-sent events on.
- A body of several records (JSON Lines, CSV rows: :mod:`~smtriton.serve.dataplane.records`) gets what its
  records need of this worker: how one is read, what its model takes, and how each of its Triton requests
  goes — as a stateless one does, but never held to merge with other clients' requests.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from smtriton.serve import headers
from smtriton.serve.dataplane import answers
from smtriton.serve.dataplane.reading.inference import Inference
from smtriton.serve.dataplane.records import csvrows, multirecord
from smtriton.serve.dataplane.request import Headers, Reply, Request, Streamed
from smtriton.serve.dataplane.sending import sessions
from smtriton.serve.dataplane.sending.mirror import Target
from smtriton.serve.dataplane.sending.sessions import SessionStep, SessionSteps
from smtriton.serve.dataplane.sending.upstream import Upstream
from smtriton.serve.dataplane.sending.waiting import Waiting
from smtriton.serve.errors import BadRequest, TritonUnavailable, UnsupportedMediaType
from smtriton.serve.settings import Settings
from smtriton.serve.triton.client import RequestBody, UpstreamResponse
from smtriton.serve.triton.request_body import HeldBody


class Sender:
    """One worker's inferences to Triton, by kind (the module docstring)."""

    def __init__(self, settings: Settings, upstream: Upstream, waiting: Waiting, sessions: SessionSteps) -> None:
        self.settings = settings
        self.upstream = upstream
        self.waiting = waiting
        self.sessions = sessions

    # ----- one inference -------------------------------------------------------------------------------
    def infer(
        self, target: Target, inference: Inference, deadline: float, step: SessionStep | None
    ) -> Awaitable[UpstreamResponse]:
        """Triton's answer to ``inference``: stateless, or of a sequence (its session's ``step``, or one it
        sets itself)."""
        if step is None and not sessions.in_a_sequence(inference.parameters):
            return self._send(target, inference, deadline)
        return self._send_once(target, inference, step)

    async def _send(self, target: Target, inference: Inference, deadline: float) -> UpstreamResponse:
        """A stateless inference to Triton, which a Triton death costs time, not its answer
        (:meth:`~smtriton.serve.dataplane.sending.waiting.Waiting.send`); it may merge with other clients'
        requests."""
        name = target.triton_name
        return await self.waiting.send(
            lambda: self.upstream.infer(name, inference), deadline, name, len(inference.body)
        )

    async def _send_once(self, target: Target, inference: Inference, step: SessionStep | None) -> UpstreamResponse:
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

    # ----- streamed answers ------------------------------------------------------------------------------
    def stream(self, target: Target, inference: Inference, accept: str | None, step: SessionStep | None) -> Reply:
        """A decoupled model's answer, streamed (in its session, when ``step`` is one)."""
        responses = self.upstream.stream(target.triton_name, inference)
        media_type = answers.stream_media_type(accept)
        on_done = target.invoke.end if target.invoke is not None else None
        if step is None:
            return Reply(200, media_type, b"", [], _streamed(responses, media_type, on_done))
        session = self.sessions.stream(step, responses)
        stream = _streamed(session.responses, media_type, on_done, step.headers, session.close)
        return Reply(200, media_type, b"", [], stream)

    async def generate(self, model: str, body: HeldBody, request: Request) -> Reply:
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

    # ----- bodies of several records (batch transform's mini-batches) ------------------------------------
    async def records(self, request: Request, body: RequestBody, target: Target, deadline: float) -> Reply:
        """A body of JSON Lines, one KServe v2 request a line (:mod:`~smtriton.serve.dataplane.records.multirecord`)."""
        _records_only(request, target, "a body of several records")
        name = target.triton_name
        rules = await self.waiting.ask(lambda: self.upstream.record_rules(name), deadline)

        async def read(line: RequestBody) -> Inference:
            inference = await self.upstream.read(name, line, None)
            return with_front_parameters(inference, request.custom_attributes, None)

        work = multirecord.Work(
            read,
            rules,
            await self.upstream.batching(name) if self.upstream.coalescer is not None else None,
            self._sender(target, deadline),
            _to_answer(target),
            self.settings.failed_record == "error-line",
            self.settings.records_in_flight,
        )
        return await multirecord.answer(body, work)

    async def csv_rows(self, request: Request, body: RequestBody, target: Target, deadline: float) -> Reply:
        """A text/csv body, a row a line (:mod:`~smtriton.serve.dataplane.records.csvrows`)."""
        _records_only(request, target, "a text/csv body")
        to = await self.waiting.ask(lambda: self.upstream.csv_input(target.triton_name), deadline)
        parameters = {} if request.custom_attributes is None else {answers.CUSTOM_ATTRIBUTES: request.custom_attributes}
        work = csvrows.Work(
            self._sender(target, deadline),
            _to_answer(target),
            self.settings.failed_record == "error-line",
            self.settings.records_in_flight,
            csvrows.wants_json_lines(request.accept),
            target.invoke.record.response_name if target.invoke is not None else target.triton_name,
            parameters,
        )
        return await csvrows.answer(body, to, work)

    def _sender(self, target: Target, deadline: float) -> Callable[[Inference], Awaitable[UpstreamResponse]]:
        """How each Triton request of a body goes: as a single stateless one does (:meth:`_send`: a Triton
        death costs it time, not its answer), but never held to merge with other clients' requests."""
        name, send = target.triton_name, self.upstream.sender(target.triton_name)

        async def sent(inference: Inference) -> UpstreamResponse:
            return await self.waiting.send(lambda: send(inference), deadline, name, len(inference.body))

        return sent


def with_front_parameters(inference: Inference, custom_attributes: str | None, step: SessionStep | None) -> Inference:
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


def _records_only(request: Request, target: Target, what: str) -> None:
    """Records are answered whole, each alone: neither in a session nor streamed."""
    if request.session is not None:
        raise BadRequest(f"{what} cannot be sent in a stateful session: send one request a session step")
    if target.decoupled:
        raise UnsupportedMediaType(f"a model that streams its answer takes JSON or binary+json, not {what}")


def _to_answer(target: Target) -> Callable[[UpstreamResponse], answers.Answer]:
    """How one record's Triton answer becomes SageMaker's (on an MME, with the caller's model name)."""
    invoke = target.invoke
    if invoke is None:
        return answers.to_sagemaker
    return lambda upstream: answers.to_mme_response(invoke.record, upstream)


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
