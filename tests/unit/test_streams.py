"""Every way a streamed invocation can end, through the real routes and data plane (in-process, ASGI)
in front of a stand-in Triton: the upstream stream is closed and the MME in-flight count released in
each, also when the client left before the answer started and nothing ever read the stream."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import orjson
import pytest

from smtriton.serve.dataplane.plane import DataPlane
from smtriton.serve.dataplane.reading.inference import Inference
from smtriton.serve.dataplane.sending.sessions import CLOSE_PARAMETER, SESSION_HEADER
from smtriton.serve.http.app import create_app
from smtriton.serve.ipc.messages import EndpointState, ModelAdded, ModelDraining
from smtriton.serve.metrics import Metrics
from smtriton.serve.multimodel.records import ModelRecord
from smtriton.serve.settings import Settings
from tests.unit.stand_ins import OUT, RecordingOwner, TritonStream
from tests.unit.triton_stand_in import TritonStandIn

BODY = b'{"text_input": "hi", "parameters": {"stream": true}}'


async def _plane(triton: TritonStandIn, settings: Settings, default_model: str | None = "m") -> DataPlane:
    plane = DataPlane(settings, Metrics(enabled=False), default_model)
    # gRPC port 9: nothing listens there; a decoupled stream that is never read never dials it.
    pending = plane.apply(EndpointState(True, True, "", triton.port, 9))
    assert pending is None
    return plane


async def _call(
    plane: DataPlane,
    path: str,
    body: bytes,
    leave_at_once: bool = False,
    headers: Iterable[tuple[bytes, bytes]] = (),
    head_stalls: bool = False,
) -> tuple[int, bytes]:
    """One POST through the ASGI app. ``leave_at_once``: the client is gone as soon as its body was read;
    ``headers``: besides its content type; ``head_stalls``: writing the answer's head waits for a socket
    that never drains (the server's send waits while writing is paused), so a client that left is seen
    gone before anything iterates the stream."""
    scope = {"type": "http", "method": "POST", "path": path, "raw_path": path.encode(), "query_string": b"",
             "headers": [(b"content-type", b"application/json"), *headers], "http_version": "1.1",
             "scheme": "http", "server": ("127.0.0.1", 8080), "client": ("127.0.0.1", 1), "root_path": ""}  # fmt: skip
    sent_body = False
    messages: list[dict] = []

    async def receive() -> dict:
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        if leave_at_once:
            return {"type": "http.disconnect"}
        await asyncio.Event().wait()  # the client stays until the answer ends
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        messages.append(message)
        if head_stalls and message["type"] == "http.response.start":
            await asyncio.Event().wait()

    await create_app(plane)(scope, receive, send)  # type: ignore[arg-type]
    start = next((m for m in messages if m["type"] == "http.response.start"), None)
    payload = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return (start["status"] if start else 0), payload


async def _settled(triton: TritonStandIn) -> None:
    """Let the stand-in see what the client side did to the connection."""
    for _ in range(100):
        if triton.streams_open == 0:
            return
        await asyncio.sleep(0.02)


def test_a_generate_stream_read_to_the_end_passes_every_event_and_releases_the_upstream():
    async def scenario() -> None:
        async with TritonStandIn().running() as triton:
            plane = await _plane(triton, Settings(inference_type="generate_stream"))
            status, payload = await _call(plane, "/invocations", BODY)
            assert status == 200
            assert [orjson.loads(line[6:]) for line in payload.split(b"\n\n") if line] == [
                {"index": i} for i in range(5)
            ]
            await _settled(triton)
            assert (triton.streams_finished, triton.streams_closed_early) == (1, 0)
            await plane.close()

    asyncio.run(scenario())


def test_a_client_that_leaves_before_the_stream_starts_closes_the_upstream_request():
    """Nothing reads the stream: its clean-up still runs, and Triton's request is closed."""

    async def scenario() -> None:
        async with TritonStandIn().running() as triton:
            triton.gap_s = 0.5  # 2.5 s for the whole stream if nobody closed it
            plane = await _plane(triton, Settings(inference_type="generate_stream"))
            await asyncio.wait_for(_call(plane, "/invocations", BODY, leave_at_once=True), 5)
            await _settled(triton)
            assert triton.streams_open == 0
            assert triton.streams_closed_early == 1
            assert triton.streams_finished == 0
            await plane.close()

    asyncio.run(scenario())


def test_a_generate_stream_refused_upstream_is_an_error_answer_and_no_stream():
    async def scenario() -> None:
        async with TritonStandIn().running() as triton:
            triton.stream_status = 400
            plane = await _plane(triton, Settings(inference_type="generate_stream"))
            status, payload = await _call(plane, "/invocations", BODY)
            assert status == 400
            assert orjson.loads(payload) == {"error": "generate failed"}
            await plane.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("leave_at_once", [True, False])
def test_a_decoupled_invoke_always_gives_back_its_in_flight_count(leave_at_once):
    """An unload waits for the invokes a worker counts: one whose stream never started (the client
    left first) or failed (Triton unreachable) must not keep it waiting."""

    async def scenario() -> None:
        async with TritonStandIn().running() as triton:
            plane = await _plane(triton, Settings(), default_model=None)
            record = ModelRecord("dec", "/u", None, "dec", ["dec"], "dec", decoupled=True)
            plane.handle(ModelAdded(record))
            body = orjson.dumps({"inputs": [{"name": "N", "shape": [1], "datatype": "INT32", "data": [3]}]})
            status, _ = await asyncio.wait_for(_call(plane, "/models/dec/invoke", body, leave_at_once), 30)
            model = plane.mirror.models["dec"]
            assert model.inflight == 0
            assert model.idle.is_set()
            if not leave_at_once:  # read: the stream reports that Triton cannot be reached
                assert status in (200, 503)
            drained = plane.handle(ModelDraining("dec", 60))
            assert drained is not None
            await asyncio.wait_for(drained, 1)  # nothing to wait for
            await plane.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("closes", [True, False], ids=["closing", "not-closing"])
@pytest.mark.parametrize("how", ["left-before-it-started", "left-at-once", "read-to-the-end"])
def test_a_streamed_answer_in_a_session_closes_triton_and_the_owner_hears_once(closes, how):
    """In a session too, however the answer ends: Triton's stream is closed, and a closing inference
    closes the session, once; also when the client left before the answer started and nothing ever
    read the stream ("left-before-it-started"), or when it left at once (then the stream may have begun)."""

    async def scenario() -> None:
        async with TritonStandIn().running() as triton:
            plane = await _plane(triton, Settings())
            assert plane.apply(EndpointState(True, True, "", triton.port, 9, decoupled=True)) is None
            owner = RecordingOwner({"session_use": {"sequence_id": 7, "start": False}})
            plane.owner.channel = owner  # type: ignore[assignment]
            read = how == "read-to-the-end"
            # A client that left sees no answer: Triton's never comes (no "answered" notice, read or not).
            upstream = TritonStream([OUT, OUT]) if read else TritonStream([], hold=True)
            asked: list[object] = []

            def stream(triton_name: str, inference: Inference) -> object:
                asked.append(dict(inference.parameters))  # the session's sequence (and the request's own)
                return upstream.generator

            plane.upstream.stream = stream  # type: ignore[method-assign]
            request: dict[str, object] = {"inputs": [{"name": "N", "shape": [1], "datatype": "INT32", "data": [3]}]}
            if closes:
                request["parameters"] = {CLOSE_PARAMETER: True}
            own = {CLOSE_PARAMETER: True} if closes else {}
            headers = [(SESSION_HEADER.lower().encode(), b"s1")]
            left_early = how == "left-before-it-started"
            call = _call(plane, "/invocations", orjson.dumps(request), not read, headers, head_stalls=left_early)
            status, payload = await asyncio.wait_for(call, 5)
            assert asked == [{**own, "sequence_id": 7, "sequence_end": True} if closes else {"sequence_id": 7}]
            assert upstream.closed
            if left_early:
                assert not upstream.started  # nothing ever iterated the stream
            said = [("call", "session_use")]
            if read:
                assert status == 200
                assert [orjson.loads(line) for line in payload.splitlines()] == [OUT, OUT]
                if not closes:
                    said.append(("notice", "session_answered"))
            if closes:
                said.append(("call", "session_close"))
            assert owner.said == said
            await plane.close()

    asyncio.run(scenario())
