"""A worker's real data plane in front of a stand-in speaking Triton's HTTP API: it answers from the
owner's state, follows Triton to new ports, counts the invokes an unload waits for, and sends requests
on as SageMaker sent them (large JSON re-encoded binary, custom attributes as a parameter)."""

from __future__ import annotations

import asyncio
import gzip
import itertools
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import orjson
import pytest

from smtriton.serve.dataplane.batching.rule import ModelBatching
from smtriton.serve.dataplane.plane import DataPlane
from smtriton.serve.dataplane.reading.codec import BINARY_JSON
from smtriton.serve.dataplane.reading.inference import Inference
from smtriton.serve.dataplane.request import Reply, Request
from smtriton.serve.dataplane.sending.sessions import SEQUENCE_LOST, SessionStep
from smtriton.serve.errors import BadRequest, ModelNotFound, NotReady, TritonUnavailable
from smtriton.serve.ipc.messages import (
    STARTING,
    EndpointState,
    Message,
    ModelAdded,
    ModelDraining,
    ModelRemoved,
    Probation,
    ProbationOver,
)
from smtriton.serve.metrics import Metrics
from smtriton.serve.multimodel.records import ModelRecord
from smtriton.serve.settings import Settings
from smtriton.serve.triton.request_body import BodyPieces
from tests.unit.stand_ins import OUT, RecordingOwner, TritonStream
from tests.unit.triton_stand_in import HEADER_LENGTH, TritonStandIn, serving_plane

RECORD = ModelRecord("shown", "/opt/ml/models/a", "a.tar.gz", "a.tar.gz", ["a.tar.gz"], "a.tar.gz")


def run(scenario, default_model: str | None = "m", settings: Settings | None = None) -> None:
    async def main() -> None:
        async with TritonStandIn().running() as triton:
            plane = serving_plane(triton, settings or Settings(), default_model)
            try:
                await scenario(triton, plane)
            finally:
                await plane.close()

    asyncio.run(main())


def request(body: bytes, content_type: str | None = None, model: str | None = None, **fields: Any) -> Request:
    """A request as the HTTP side hands it to the data plane."""

    async def read_body() -> bytes:
        return body

    return Request(model, read_body, content_type, **fields)


async def invoke(plane: DataPlane, body: bytes, content_type: str | None = None, **fields: Any) -> Reply:
    return await plane.invoke(request(body, content_type, **fields))


def error_of(reply: Reply) -> str:
    return str(orjson.loads(reply.body)["error"])


NO_WAIT = Settings.from_env({"SMTRITON_WAIT_FOR_TRITON": "false"})


def test_before_the_owner_says_anything_it_is_not_healthy_and_refuses_with_the_reason():
    plane = DataPlane(NO_WAIT, Metrics(enabled=False), "m")
    assert plane.mirror.state == STARTING
    assert not plane.healthy

    async def scenario() -> None:
        with pytest.raises(NotReady, match="Triton is starting"):
            plane.upstream.ready()
        reply = await invoke(plane, b"{}")
        assert (reply.status, error_of(reply)) == (503, "Triton is starting")

    asyncio.run(scenario())


def test_the_owners_state_decides_ping_and_a_drain_fails_it_at_once():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        assert plane.healthy
        assert plane.ping_status() == 200
        plane.begin_drain()  # this worker's SIGTERM, before the owner says so
        assert not plane.healthy
        assert plane.ping_status() == 503
        assert (await invoke(plane, b"{}")).status == 200  # accepted requests are still served

    run(scenario)


def test_new_ports_after_a_restart_mean_a_new_client_and_the_old_one_closed():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        first = plane.upstream.client
        assert first is not None
        restarting = plane.apply(EndpointState(False, False, "Triton is restarting", None, None))
        assert restarting is not None
        await restarting
        assert plane.upstream.client is None
        reply = await invoke(plane, b"{}")
        assert (reply.status, error_of(reply)) == (503, "Triton is restarting")  # waiting is off here
        assert plane.apply(EndpointState(True, True, "", triton.port, 9)) is None  # nothing left to close
        assert plane.upstream.client is not None
        assert plane.upstream.client is not first
        assert (await invoke(plane, b"{}")).status == 200

    run(scenario, settings=NO_WAIT)


# ----- a Triton crash costs latency, not answers ---------------------------------------------------------
_CLOSING: set[asyncio.Future[None]] = set()


def _tell(plane: DataPlane, state: EndpointState) -> None:
    """The owner's new state, as a worker takes it (the old clients close in the background)."""
    closing = plane.apply(state)
    if closing is not None:
        task = asyncio.ensure_future(closing)
        _CLOSING.add(task)
        task.add_done_callback(_CLOSING.discard)


def _down(generation: int) -> EndpointState:
    return EndpointState(False, False, "Triton is restarting", None, None, generation=generation, returning=True)


def _up(triton: TritonStandIn, generation: int) -> EndpointState:
    return EndpointState(True, True, "", triton.port, 9, generation=generation)


def test_a_request_that_meets_triton_restarting_waits_and_is_answered_once_it_serves():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        _tell(plane, _down(1))
        answer = asyncio.ensure_future(invoke(plane, b"{}"))
        await asyncio.sleep(0.2)
        assert not answer.done()
        assert plane.waiting.waiting == 1
        assert triton.requests == []  # nothing reaches a Triton that is down
        _tell(plane, _up(triton, 2))
        assert (await asyncio.wait_for(answer, 5)).status == 200
        assert plane.waiting.waiting == 0

    run(scenario)


def test_a_request_before_any_triton_served_is_503_at_once():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        _tell(plane, EndpointState(False, False, "Triton is starting", None, None, generation=1))
        reply = await asyncio.wait_for(invoke(plane, b"{}"), 1)
        assert reply.status == 503
        assert error_of(reply) == "Triton is starting"
        assert plane.waiting.waiting == 0

    run(scenario)


def test_a_waiting_request_is_503_once_the_restarted_triton_cannot_serve_its_model():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        _tell(plane, _down(1))
        answer = asyncio.ensure_future(invoke(plane, b"{}"))
        await asyncio.sleep(0.1)
        assert plane.waiting.waiting == 1
        _tell(plane, EndpointState(False, False, "model 'm' is not ready", None, None, generation=2))
        reply = await asyncio.wait_for(answer, 1)
        assert reply.status == 503
        assert error_of(reply) == "model 'm' is not ready"
        assert triton.requests == []

    run(scenario)


def test_a_request_that_waited_to_be_merged_while_triton_died_is_not_sent_and_may_wait():
    """The merger sends what waited for the model's earlier requests: if Triton died meanwhile, that
    request never went out, so it is TritonUnavailable unsent (which the wait for Triton sends again)."""

    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        _tell(plane, _down(1))
        with pytest.raises(TritonUnavailable) as unavailable:
            await plane.upstream._send("m", Inference(b"{}", None, {}))
        assert unavailable.value.sent is False
        assert triton.requests == []

    run(scenario)


def test_the_waiting_queue_is_bounded_and_a_full_one_answers_503_at_once():
    settings = Settings.from_env({"SMTRITON_TRITON_WAIT_QUEUE": "2"})

    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        _tell(plane, _down(1))
        held = [asyncio.ensure_future(invoke(plane, b"{}")) for _ in range(2)]
        await asyncio.sleep(0.1)
        full = await asyncio.wait_for(invoke(plane, b"{}"), 1)
        assert full.status == 503
        assert "2 requests already wait for Triton" in error_of(full)
        _tell(plane, _up(triton, 2))
        assert [reply.status for reply in await asyncio.gather(*held)] == [200, 200]

    run(scenario, settings=settings)


def test_a_request_waits_no_longer_than_its_own_timeout():
    settings = Settings.from_env({"SMTRITON_REQUEST_TIMEOUT_S": "0.3"})

    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        _tell(plane, _down(1))
        reply = await asyncio.wait_for(invoke(plane, b"{}"), 5)
        assert reply.status == 503
        assert "Triton was not back in time" in error_of(reply)

    run(scenario, settings=settings)


def test_a_request_in_flight_when_triton_died_is_sent_again_once_the_next_one_serves():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        triton.die_on_infer = 1
        triton.on_death = lambda: _tell(plane, _down(1))

        async def restart() -> None:
            await asyncio.sleep(0.3)
            _tell(plane, _up(triton, 2))

        restarting = asyncio.ensure_future(restart())
        reply = await asyncio.wait_for(invoke(plane, b'{"inputs":[]}'), 5)
        await restarting
        assert reply.status == 200
        assert [path for path, _, _ in triton.requests] == ["/v2/models/m/infer"] * 2  # sent again, once

    run(scenario)


def test_a_request_in_flight_at_two_deaths_in_a_row_is_answered_500_and_not_sent_again(caplog):
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        triton.die_on_infer = 2
        generation = iter(range(1, 10))

        def death() -> None:
            _tell(plane, _down(next(generation)))
            asyncio.get_running_loop().call_later(0.2, lambda: _tell(plane, _up(triton, next(generation))))

        triton.on_death = death
        reply = await asyncio.wait_for(invoke(plane, b'{"inputs":[]}'), 5)
        assert reply.status == 500
        assert "Triton died twice in a row while running this request" in error_of(reply)
        assert len(triton.requests) == 2  # never a third time
        assert (await invoke(plane, b'{"inputs":[]}')).status == 200  # the next request is served

    caplog.set_level("ERROR")
    run(scenario)
    assert "in flight at two Triton deaths in a row" in caplog.text
    assert "inputs" not in caplog.text  # its size and model are logged, never its body


def test_a_connection_that_fails_while_triton_lives_is_503_as_before():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        triton.die_on_infer = 1  # the connection dies, but the owner says nothing of a death
        reply = await asyncio.wait_for(invoke(plane, b"{}"), 10)
        assert reply.status == 503
        assert len(triton.requests) == 1

    run(scenario)


class _Desk(RecordingOwner):
    """The owner's side of turns on probation: it records whether Triton served when a turn was asked
    for, and grants it at once (``hold``: never, so only the asker's own timeout ends the wait)."""

    def __init__(self, plane: DataPlane, hold: bool = False) -> None:
        super().__init__()
        self.plane = plane
        self.hold = hold
        self.serving_when_asked: list[bool] = []
        self.on_grant: Callable[[], None] | None = None  # what happens as a turn comes

    async def call(self, message: Message, timeout: float | None = None) -> object:
        await super().call(message, timeout)
        if not isinstance(message, Probation):
            return None
        self.serving_when_asked.append(self.plane.mirror.state.serving)
        if self.hold:
            await asyncio.wait_for(asyncio.Event().wait(), timeout)
        if self.on_grant is not None:
            self.on_grant()
        return True


def _restarts_after_one_death(triton: TritonStandIn, plane: DataPlane) -> None:
    """The next request finds Triton dying under it; a new one serves 0.3 s later."""
    triton.die_on_infer = 1

    def death() -> None:
        _tell(plane, _down(1))
        asyncio.get_running_loop().call_later(0.3, lambda: _tell(plane, _up(triton, 2)))

    triton.on_death = death


def test_a_request_sent_again_asks_its_turn_on_probation_once_triton_serves_and_gives_it_back():
    """A turn asked for while Triton restarts would run out its lease before Triton is back."""

    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        owner = _Desk(plane)
        plane.owner.channel = owner  # type: ignore[assignment]
        _restarts_after_one_death(triton, plane)
        reply = await asyncio.wait_for(invoke(plane, b'{"inputs":[]}'), 5)
        assert reply.status == 200
        assert owner.serving_when_asked == [True]
        assert owner.said == [("call", "probation"), ("notice", "probation_over")]
        asked, over = owner.messages
        assert isinstance(asked, Probation)
        assert isinstance(over, ProbationOver)
        assert (over.worker, over.ticket) == (asked.worker, asked.ticket)

    run(scenario)


def test_a_turn_that_comes_once_triton_died_again_goes_back_and_the_request_waits_for_the_next_triton():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        owner = _Desk(plane)
        plane.owner.channel = owner  # type: ignore[assignment]
        _restarts_after_one_death(triton, plane)

        def dies_again() -> None:  # another request on probation killed it while this one waited
            owner.on_grant = None
            _tell(plane, _down(3))
            asyncio.get_running_loop().call_later(0.3, lambda: _tell(plane, _up(triton, 4)))

        owner.on_grant = dies_again
        reply = await asyncio.wait_for(invoke(plane, b'{"inputs":[]}'), 5)
        assert reply.status == 200
        assert owner.said == [("call", "probation"), ("notice", "probation_over")] * 2
        assert owner.serving_when_asked == [True, True]
        assert len(triton.requests) == 2  # not sent while Triton was down: the turn went back unused

    run(scenario)


def test_the_wait_for_a_turn_on_probation_ends_at_the_requests_own_timeout_and_gives_the_turn_back():
    settings = Settings.from_env({"SMTRITON_REQUEST_TIMEOUT_S": "1"})

    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        owner = _Desk(plane, hold=True)  # another request holds the turn for longer than this one may wait
        plane.owner.channel = owner  # type: ignore[assignment]
        _restarts_after_one_death(triton, plane)
        reply = await asyncio.wait_for(invoke(plane, b'{"inputs":[]}'), 5)
        assert reply.status == 503
        assert "turn to be sent again" in error_of(reply)
        assert owner.said == [("call", "probation"), ("notice", "probation_over")]
        assert len(triton.requests) == 1

    run(scenario, settings=settings)


SEQUENCE_STEP = b'{"inputs":[],"parameters":{"sequence_id":5}}'


def test_a_request_of_its_own_sequence_in_flight_at_a_death_is_503_and_not_sent_again():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        _restarts_after_one_death(triton, plane)
        reply = await asyncio.wait_for(invoke(plane, SEQUENCE_STEP), 5)
        assert reply.status == 503
        assert SEQUENCE_LOST in error_of(reply)
        await asyncio.sleep(0.5)  # Triton serves again meanwhile: still sent once
        assert len(triton.requests) == 1

    run(scenario)


def test_a_request_of_its_own_sequence_that_meets_triton_restarting_is_503_at_once():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        _tell(plane, _down(1))
        reply = await asyncio.wait_for(invoke(plane, SEQUENCE_STEP), 1)
        assert reply.status == 503
        assert error_of(reply) == f"Triton is restarting: {SEQUENCE_LOST}"
        assert plane.waiting.waiting == 0
        assert triton.requests == []

    run(scenario)


def test_large_json_goes_to_triton_binary_and_custom_attributes_as_a_parameter():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        data = list(range(20_000))
        body = orjson.dumps({"inputs": [{"name": "X", "shape": [len(data)], "datatype": "INT64", "data": data}]})
        await invoke(plane, body, "application/json", custom_attributes="trace=7")
        _, sent, headers = triton.requests[-1]
        size = int(headers[HEADER_LENGTH])
        header = orjson.loads(sent[:size])
        assert header["inputs"][0]["parameters"]["binary_data_size"] == 8 * len(data)
        assert header["parameters"] == {"sagemaker_custom_attributes": "trace=7"}
        assert len(sent) == size + 8 * len(data)

    run(scenario)


def in_pieces(body: bytes, *cuts: int) -> BodyPieces:
    """The body as the reader holds one that arrived in pieces, cut at ``cuts``."""
    edges = [0, *cuts, len(body)]
    return BodyPieces([body[start:end] for start, end in itertools.pairwise(edges)])


def test_a_body_held_in_pieces_reaches_triton_as_sent_and_a_binary_one_is_never_joined(monkeypatch):
    header = orjson.dumps(
        {"inputs": [{"name": "X", "shape": [3], "datatype": "INT32", "parameters": {"binary_data_size": 12}}]}
    )
    raw = bytes(range(12))
    binary = header + raw
    json_body = orjson.dumps({"inputs": [{"name": "X", "shape": [2], "datatype": "INT32", "data": [1, 2]}]})
    joined: list[int] = []
    real_joined = BodyPieces.joined
    monkeypatch.setattr(BodyPieces, "joined", lambda self: joined.append(len(self)) or real_joined(self))

    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        binary_type = f"{BINARY_JSON};json-header-size={len(header)}"
        cases = [  # (the body as held, content type, custom attributes, what Triton must get)
            (in_pieces(binary, 10, len(header) + 3), binary_type, None, binary),  # its JSON part cut in two
            (in_pieces(binary, 20, len(header) + 5), binary_type, "a=1", None),  # the binary part cut from a piece
            (in_pieces(raw, 4), f"{BINARY_JSON};json-header-size=0", None, raw),
        ]
        for body, content_type, attributes, expected in cases:
            reply = await plane.invoke(pieces_request(body, content_type, custom_attributes=attributes))
            assert reply.status == 200, reply.body
            _, sent, headers = triton.requests[-1]
            if expected is not None:
                assert sent == expected
            else:  # the parameter added to the JSON part, the binary part as it came
                size = int(headers[HEADER_LENGTH])
                assert orjson.loads(sent[:size])["parameters"] == {"sagemaker_custom_attributes": "a=1"}
                assert sent[size:] == raw
        assert joined == []  # no binary body was joined on its way
        reply = await plane.invoke(pieces_request(in_pieces(json_body, 7, 20), "application/json"))
        assert (reply.status, triton.requests[-1][1]) == (200, json_body)
        zipped = gzip.compress(json_body)
        reply = await plane.invoke(pieces_request(in_pieces(zipped, 5), "application/json", encoding="gzip"))
        assert (reply.status, triton.requests[-1][1]) == (200, json_body)
        assert joined == [len(json_body), len(zipped)]  # what is read whole is joined, once

    run(scenario)


def test_a_large_body_read_whole_is_gathered_beside_the_event_loop(monkeypatch):
    """Past JOIN_ON_LOOP_BYTES a body in pieces that is read whole (JSON here) is gathered in a thread,
    so the loop serves meanwhile; below it, joined on the loop."""
    import threading

    from smtriton.serve.dataplane.reading import body as body_module

    json_body = orjson.dumps({"inputs": [{"name": "X", "shape": [2], "datatype": "INT32", "data": [1, 2]}]})
    gathered_in: list[str] = []
    real_gathered = BodyPieces.gathered

    def gathered(self: BodyPieces) -> bytearray:
        gathered_in.append(threading.current_thread().name)
        return real_gathered(self)

    monkeypatch.setattr(BodyPieces, "gathered", gathered)
    monkeypatch.setattr(body_module, "JOIN_ON_LOOP_BYTES", len(json_body) - 1)

    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        reply = await plane.invoke(pieces_request(in_pieces(json_body, 9, 30), "application/json"))
        assert (reply.status, triton.requests[-1][1]) == (200, json_body)

    run(scenario)
    assert len(gathered_in) == 1
    assert gathered_in[0] != threading.main_thread().name


def pieces_request(body: BodyPieces, content_type: str, **fields: Any) -> Request:
    async def read_body() -> BodyPieces:
        return body

    return Request(None, read_body, content_type, **fields)


def test_custom_attributes_longer_than_invoke_endpoint_takes_are_refused():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        reply = await invoke(plane, b"{}", custom_attributes="a" * 1025)
        assert reply.status == 400
        assert "at most 1024" in error_of(reply)
        assert (await invoke(plane, b"{}", custom_attributes="a" * 1024)).status == 200
        assert len(triton.requests) == 1

    run(scenario)


def test_execution_parameters_take_the_instance_count_from_the_models_config():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        assert (await plane.execution_parameters())["MaxConcurrentTransforms"] == 2

    run(scenario)


def test_how_a_model_merges_is_asked_once_without_holding_its_first_request_and_forgotten_when_it_changes():
    triton = TritonStandIn()
    triton.max_batch_size["m"] = 4
    triton.config_delay_s = 0.3

    async def main() -> None:
        async with triton.running():
            plane = serving_plane(triton, Settings())
            try:
                assert (await invoke(plane, b"{}")).status == 200
                assert (triton.configs_asked, triton.configs_answered) == (1, 0)  # the request did not wait
                assert await plane.upstream.batching("m") == ModelBatching(max_batch_size=4, instances=2, outputs=())
                for _ in range(3):
                    assert (await invoke(plane, b"{}")).status == 200
                assert triton.configs_asked == 1
                plane.upstream.model_changed("m")
                triton.max_batch_size["m"] = 2
                assert (await invoke(plane, b"{}")).status == 200
                assert await plane.upstream.batching("m") == ModelBatching(max_batch_size=2, instances=2, outputs=())
                assert triton.configs_asked == 2
            finally:
                await plane.close()

    asyncio.run(main())


def test_with_merging_off_no_request_waits_and_no_configuration_is_asked():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        assert plane.upstream.coalescer is None
        triton.max_batch_size["m"] = 4
        assert (await invoke(plane, b"{}")).status == 200
        assert triton.configs_asked == 0

    run(scenario, settings=Settings(merge_requests=False))


class WatchedEvent(asyncio.Event):
    """An event that says when something began to wait for it."""

    def __init__(self) -> None:
        super().__init__()
        self.awaited = asyncio.Event()

    async def wait(self) -> Literal[True]:
        self.awaited.set()
        return await super().wait()


def test_mme_invokes_resolve_through_the_owners_records_and_an_unload_waits_for_them():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        assert plane.handle(ModelAdded(RECORD)) is None
        mirror = plane.mirror
        invoke = mirror.begin_invoke("shown", "a.tar.gz")
        model = invoke.model
        with pytest.raises(BadRequest, match="does not match"):
            mirror.begin_invoke("shown", "other.tar.gz")
        model.idle = idle = WatchedEvent()  # unset, as the running invoke left it
        drained = plane.handle(ModelDraining("shown", 30))
        assert drained is not None
        waiting = asyncio.ensure_future(drained)
        with pytest.raises(ModelNotFound):  # new invokes are refused from the start of the drain
            mirror.begin_invoke("shown", None)
        await asyncio.wait_for(idle.awaited.wait(), 1)  # the unload now waits for the invoke to end
        assert not waiting.done()  # the running invoke holds the unload
        invoke.end()
        invoke.end()  # only the first end counts
        await asyncio.wait_for(waiting, 1)
        assert model.inflight == 0
        assert plane.handle(ModelRemoved("shown")) is None

    run(scenario, default_model=None)


def test_an_mme_invoke_runs_through_the_record_and_is_no_longer_in_flight_after_its_answer():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        triton.models["a.tar.gz"] = "READY"
        plane.handle(ModelAdded(RECORD))
        reply = await plane.invoke(request(b"{}", model="shown", target_model="a.tar.gz"))
        assert reply.status == 200
        assert triton.requests[-1][0] == "/v2/models/a.tar.gz/infer"
        assert plane.mirror.models["shown"].inflight == 0
        missing = await plane.invoke(request(b"{}", model="nothing"))
        assert (missing.status, error_of(missing)) == (404, "model 'nothing' is not loaded")

    run(scenario, default_model=None)


def test_a_drain_that_outlasts_its_bound_gives_up_waiting():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        plane.handle(ModelAdded(RECORD))
        plane.mirror.begin_invoke("shown", None)  # never ends
        drained = plane.handle(ModelDraining("shown", 0.1))
        assert drained is not None
        await asyncio.wait_for(drained, 2)

    run(scenario, default_model=None)


def test_the_mme_api_is_the_owners_and_an_sme_has_none():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        with pytest.raises(BadRequest, match="SAGEMAKER_MULTI_MODEL=true"):
            await plane.load(b"{}", None)
        with pytest.raises(BadRequest, match="SAGEMAKER_MULTI_MODEL=true"):
            await plane.list_models(None, None)

    run(scenario)

    async def alone(triton: TritonStandIn, plane: DataPlane) -> None:
        with pytest.raises(NotReady, match="owner is not reachable"):  # a plane without its main process
            await plane.describe("m")

    run(alone, default_model=None)


def test_an_image_body_becomes_the_one_element_of_a_bytes_input_and_is_asked_for_once():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        triton.inputs["m"] = [{"name": "IMAGE", "datatype": "BYTES", "shape": [-1, 1]}]
        jpeg = b"\xff\xd8\xff\xe0 not really a JPEG"
        for _ in range(2):
            assert (await invoke(plane, jpeg, "image/jpeg", custom_attributes="a=1")).status == 200
        _, sent, headers = triton.requests[-1]
        size = int(headers[HEADER_LENGTH])
        header = orjson.loads(sent[:size])
        assert header["inputs"] == [
            {"name": "IMAGE", "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": 4 + len(jpeg)}}
        ]
        assert header["parameters"] == {"sagemaker_custom_attributes": "a=1"}
        assert sent[size:] == len(jpeg).to_bytes(4, "little") + jpeg
        assert sum(1 for path, _, _ in triton.requests if path == "/v2/models/m") == 1  # metadata asked once

    run(scenario)


@pytest.mark.parametrize(
    "inputs",
    [
        [{"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]}],
        [{"name": "A", "datatype": "BYTES", "shape": [1]}, {"name": "B", "datatype": "BYTES", "shape": [1]}],
        [{"name": "TEXTS", "datatype": "BYTES", "shape": [-1, 3]}],
    ],
    ids=["not-bytes", "two-inputs", "three-elements"],
)
def test_an_image_body_to_a_model_that_cannot_take_it_is_415_saying_what_it_takes(inputs):
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        triton.inputs["m"] = inputs
        reply = await invoke(plane, b"\x89PNG...", "image/png")
        assert reply.status == 415
        assert f"({inputs[0]['datatype']} {inputs[0]['shape']})" in error_of(reply)
        assert not [path for path, _, _ in triton.requests if path.endswith("/infer")]

    run(scenario)


START: dict[str, str | int | bool] = {"sequence_id": 7, "sequence_start": True}
END: dict[str, str | int | bool] = {"sequence_id": 7, "sequence_end": True}


@pytest.mark.parametrize(
    ("step", "answered", "said"),
    [
        # The first answer of a sequence is a call: the caller's next request may reach another worker,
        # and the owner must know by then that the sequence started, or it would start it again.
        (SessionStep("s", START, [], opened=True), True, [("call", "session_answered")]),
        (SessionStep("s", START, []), True, [("call", "session_answered")]),  # first after {"requestType": ...}
        (SessionStep("s", {"sequence_id": 7}, []), True, [("notice", "session_answered")]),
        (SessionStep("s", START, [], opened=True), False, [("call", "session_close")]),
        (SessionStep("s", END, [], closes=True), True, [("call", "session_close")]),
        (SessionStep("s", {"sequence_id": 7}, []), False, []),
    ],
)  # fmt: skip
def test_the_owner_hears_how_a_sessions_inference_went(step, answered, said):
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        owner = RecordingOwner()
        plane.owner.channel = owner  # type: ignore[assignment]
        await plane.sessions.done(step, answered)
        assert owner.said == said

    run(scenario)


# ----- a streamed answer in a session: however it ends, Triton's stream is closed and the owner told once

LATER: dict[str, str | int | bool] = {"sequence_id": 7}
CLOSING = SessionStep("s", END, [], closes=True)
FIRST = SessionStep("s", START, [])  # the sequence's first inference: the owner hears of its answer in a call
NEXT = SessionStep("s", LATER, [])  # a later one: a notice is enough
CLOSED = [("call", "session_close")]


def heard(step: SessionStep) -> list[tuple[str, str]]:
    """What the owner hears, once, of a streamed answer in ``step`` that Triton answered."""
    if step.closes:
        return CLOSED
    assert step.parameters is not None
    return [("call" if step.parameters.get("sequence_start") else "notice", "session_answered")]


ERROR = {"error": "the model failed"}


def in_session(scenario: Callable[[DataPlane, RecordingOwner], Awaitable[None]]) -> None:
    """``scenario`` with a data plane whose owner records what it hears (no Triton needed)."""

    async def main() -> None:
        plane = DataPlane(Settings(), Metrics(enabled=False), "m")
        owner = RecordingOwner()
        plane.owner.channel = owner  # type: ignore[assignment]
        await scenario(plane, owner)

    asyncio.run(main())


@pytest.mark.parametrize(
    ("step", "said"), [(CLOSING, CLOSED), (FIRST, []), (NEXT, [])], ids=["closing", "first", "next"]
)
def test_a_session_stream_nobody_iterated_closes_triton_and_a_closing_session_once(step, said):
    """The client left before the answer began: nothing iterates the responses, the clean-up still runs."""

    async def scenario(plane: DataPlane, owner: RecordingOwner) -> None:
        triton = TritonStream([OUT, OUT])
        stream = plane.sessions.stream(step, triton.generator)
        await stream.close()
        await stream.close()  # a second close does nothing
        assert triton.closed
        assert not triton.started  # never dialed Triton, and never will
        assert await anext(stream.responses, None) is None
        assert owner.said == said

    in_session(scenario)


@pytest.mark.parametrize("step", [CLOSING, FIRST, NEXT], ids=["closing", "first", "next"])
def test_a_session_stream_read_to_the_end_passes_every_response_and_tells_the_owner_once(step):
    async def scenario(plane: DataPlane, owner: RecordingOwner) -> None:
        triton = TritonStream([OUT, OUT, OUT])
        stream = plane.sessions.stream(step, triton.generator)
        assert await anext(stream.responses) == OUT
        # Triton's first response: the owner has heard the sequence was answered before the caller sees it.
        assert owner.said == ([] if step.closes else heard(step))
        assert [response async for response in stream.responses] == [OUT, OUT]
        # The stream ended: a closing step has closed the session before the answer's last chunk goes out.
        assert owner.said == heard(step)
        await stream.close()
        assert triton.ended
        assert triton.closed
        assert owner.said == heard(step)

    in_session(scenario)


@pytest.mark.parametrize("step", [CLOSING, FIRST], ids=["closing", "first"])
@pytest.mark.parametrize("where", ["between-responses", "awaiting-triton"])
def test_a_client_that_leaves_mid_stream_closes_triton_and_the_owner_hears_once(step, where):
    """The answer began, then the client left: between two chunks (the responses closed at a ``yield``),
    or while Triton's next response was awaited (the task streaming the answer cancelled)."""

    async def scenario(plane: DataPlane, owner: RecordingOwner) -> None:
        triton = TritonStream([OUT, OUT], hold=True)
        stream = plane.sessions.stream(step, triton.generator)
        if where == "between-responses":
            assert await anext(stream.responses) == OUT
            assert not triton.ended  # left at its yield: only closing it ends it
        else:
            got: list[dict[str, Any]] = []

            async def read() -> None:
                async for response in stream.responses:
                    got.append(response)

            reading = asyncio.ensure_future(read())
            await asyncio.wait_for(triton.waiting.wait(), 1)
            reading.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reading
            assert got == [OUT, OUT]  # the cancellation went through Triton's stream, ending it
        await stream.close()
        assert triton.ended
        assert triton.closed
        assert owner.said == heard(step)
        await stream.close()
        assert owner.said == heard(step)

    in_session(scenario)


@pytest.mark.parametrize(
    ("items", "step", "said"),
    [
        ([OUT, ERROR], CLOSING, CLOSED),
        ([OUT, ERROR], FIRST, heard(FIRST)),
        ([ERROR], FIRST, []),  # never answered: the sequence did not start
        ([ERROR], NEXT, []),
        ([ERROR], CLOSING, CLOSED),  # a closing answer closes the session however it ends
    ],
    ids=["closing-after-a-response", "first-after-a-response", "first-at-once", "next-at-once", "closing-at-once"],
)
def test_a_triton_error_mid_stream_is_the_answers_last_response_and_the_owner_hears_once(items, step, said):
    """Triton's stream reports its failure as one last ``{"error": ...}`` response, then ends."""

    async def scenario(plane: DataPlane, owner: RecordingOwner) -> None:
        triton = TritonStream(items)
        stream = plane.sessions.stream(step, triton.generator)
        assert [response async for response in stream.responses] == items
        await stream.close()
        assert triton.closed
        assert owner.said == said

    in_session(scenario)


@pytest.mark.parametrize("step", [CLOSING, FIRST], ids=["closing", "first"])
def test_a_triton_stream_that_breaks_mid_stream_is_closed_and_the_owner_hears_once(step):
    async def scenario(plane: DataPlane, owner: RecordingOwner) -> None:
        triton = TritonStream([OUT], then=ConnectionResetError("Triton went away"))
        stream = plane.sessions.stream(step, triton.generator)
        assert await anext(stream.responses) == OUT
        with pytest.raises(ConnectionResetError, match="Triton went away"):
            await anext(stream.responses)
        await stream.close()
        assert triton.ended
        assert triton.closed
        assert owner.said == heard(step)

    in_session(scenario)


# ----- bodies of several records (batch transform's mini-batches) -------------------------------------------


def test_an_mme_body_of_records_answers_a_line_each_with_the_callers_model_name_and_ends_the_invoke():
    answer = b'{"model_name":"a.tar.gz","model_version":"1","outputs":[]}'
    renamed = ModelRecord("shown", "/opt/ml/models/a", "a.tar.gz", "a.tar.gz", ["a.tar.gz"], "a")

    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        triton.models["a.tar.gz"] = "READY"
        triton.answer = (200, answer)
        plane.handle(ModelAdded(renamed))
        body = b'{"inputs": []}\n{"inputs": [], "id": "2"}\n'
        reply = await plane.invoke(request(body, "application/jsonlines", model="shown", target_model="a.tar.gz"))
        assert (reply.status, reply.content_type) == (200, "application/jsonlines")
        assert reply.body == b'{"model_name":"a","model_version":"1","outputs":[]}\n' * 2
        assert [path for path, _, _ in triton.requests] == ["/v2/models/a.tar.gz/infer"] * 2
        assert plane.mirror.models["shown"].inflight == 0

    run(scenario, default_model=None)


def test_records_are_neither_sent_in_a_session_nor_to_a_model_that_streams():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        lines = b'{"inputs": []}\n{"inputs": []}'
        reply = await invoke(plane, lines, "application/jsonlines", session="s-1")
        assert (reply.status, error_of(reply)) == (
            400,
            "a body of several records cannot be sent in a stateful session: send one request a session step",
        )
        reply = await invoke(plane, b"1,2\n", "text/csv", session="s-1")
        assert reply.status == 400
        assert triton.requests == []

    run(scenario)


# A body's records, each its own Triton request, in order, one at a time.
ONE_AT_A_TIME = Settings.from_env({"SMTRITON_RECORDS_IN_FLIGHT": "1"})
RECORDS = [b'{"inputs":[],"id":"%d"}' % n for n in range(1, 4)]


def test_a_body_of_records_that_meets_triton_restarting_waits_and_is_answered_once_it_serves():
    """What its records need of the model's configuration is asked of the next Triton, and its records go
    to it: the body costs the restart's time, not a 503."""

    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        _tell(plane, _down(1))
        answer = asyncio.ensure_future(invoke(plane, b"\n".join(RECORDS), "application/jsonlines"))
        await asyncio.sleep(0.2)
        assert not answer.done()
        assert (triton.configs_asked, triton.requests) == (0, [])  # nothing reaches a Triton that is down
        _tell(plane, _up(triton, 2))
        reply = await asyncio.wait_for(answer, 5)
        assert (reply.status, reply.body) == (200, b"\n".join(RECORDS) + b"\n")
        assert plane.waiting.waiting == 0

    run(scenario, settings=ONE_AT_A_TIME)


def test_a_record_in_flight_at_a_death_is_sent_again_once_on_probation_and_those_answered_are_kept():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        owner = _Desk(plane)
        plane.owner.channel = owner  # type: ignore[assignment]
        _restarts_after_one_death(triton, plane)
        triton.die_after = 1  # the first record is answered; Triton dies under the second
        reply = await asyncio.wait_for(invoke(plane, b"\n".join(RECORDS), "application/jsonlines"), 5)
        assert (reply.status, reply.body) == (200, b"\n".join(RECORDS) + b"\n")
        sent = [body for path, body, _ in triton.requests if path.endswith("/infer")]
        assert sent == [RECORDS[0], RECORDS[1], RECORDS[1], RECORDS[2]]  # only the unanswered one again
        assert owner.said == [("call", "probation"), ("notice", "probation_over")]  # on probation, alone
        assert owner.serving_when_asked == [True]

    run(scenario, settings=ONE_AT_A_TIME)


def _dies_twice(triton: TritonStandIn, plane: DataPlane) -> None:
    """The next two requests each find Triton dying under them; a new one serves 0.2 s after each."""
    triton.die_on_infer = 2
    generation = iter(range(1, 10))

    def death() -> None:
        _tell(plane, _down(next(generation)))
        asyncio.get_running_loop().call_later(0.2, lambda: _tell(plane, _up(triton, next(generation))))

    triton.on_death = death


@pytest.mark.parametrize("failed_record", ["fail", "error-line"])
def test_records_merged_in_flight_at_two_deaths_in_a_row_are_500_and_not_sent_again(failed_record):
    """A merged group is a suspect like any request: sent again once, and at its second death each of its
    records fails (the body with it, or an error line each), never split nor sent a third time."""
    settings = Settings.from_env({"SMTRITON_FAILED_RECORD": failed_record})
    record = b'{"inputs":[{"name":"INPUT0","shape":[1,2],"datatype":"INT32","data":[%d,2]}]}'
    body = b"\n".join(record % n for n in range(3))
    killed = "Triton died twice in a row while running this request"

    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        triton.max_batch_size["m"] = 8
        _dies_twice(triton, plane)
        reply = await asyncio.wait_for(invoke(plane, body, "application/jsonlines"), 5)
        sent = [body for path, body, _ in triton.requests if path.endswith("/infer")]
        assert len(sent) == 2  # sent again once, never a third time, never split
        assert sent[0] == sent[1]
        assert b"[0,2,1,2,2,2]" in sent[0]  # the three records merged
        if failed_record == "fail":
            assert reply.status == 500
            assert error_of(reply).startswith(f"line 1 of 3: {killed}")
        else:
            assert reply.status == 200
            assert [orjson.loads(line)["error"].startswith(killed) for line in reply.body.splitlines()] == [True] * 3

    run(scenario, settings=settings)


def test_csv_rows_meet_triton_restarting_and_dying_under_them_and_cost_only_time():
    """A CSV body waits for a Triton that serves (its model's configuration asked of it), and a request
    of its rows in flight at a death is sent again once, the rows already answered kept."""
    rows = [b"1,2", b"3,4", b"5,6"]

    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        triton.config_extra["m"] = {
            "max_batch_size": 1,
            "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [2]}],
        }
        triton.answer = (200, b'{"outputs":[{"name":"OUT","datatype":"INT32","shape":[1,1],"data":[7]}]}')
        _tell(plane, _down(0))
        answer = asyncio.ensure_future(invoke(plane, b"\n".join(rows), "text/csv"))
        await asyncio.sleep(0.2)
        assert not answer.done()
        assert (triton.configs_asked, triton.requests) == (0, [])
        _restarts_after_one_death(triton, plane)
        triton.die_after = 1  # the first row is answered; Triton dies under the second
        _tell(plane, _up(triton, 1))
        reply = await asyncio.wait_for(answer, 5)
        assert (reply.status, reply.body) == (200, b"7\n7\n7\n")
        sent = [body for path, body, _ in triton.requests if path.endswith("/infer")]
        assert len(sent) == 4
        assert sent[1] == sent[2]  # only the unanswered row again
        assert len({sent[0], sent[1], sent[3]}) == 3

    run(scenario, settings=ONE_AT_A_TIME)
