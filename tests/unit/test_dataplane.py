"""A worker's real data plane in front of a stand-in speaking Triton's HTTP API: it answers from the
owner's state, follows Triton to new ports, counts the invokes an unload waits for, and sends requests
on as SageMaker sent them (large JSON re-encoded binary, custom attributes as a parameter)."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from smtriton.serve.channel import STARTING, EndpointState
from smtriton.serve.dataplane import DataPlane, SessionStep
from smtriton.serve.errors import BadRequest, ModelNotFound, NotReady, UnsupportedMediaType
from smtriton.serve.metrics import Metrics
from smtriton.serve.records import ModelRecord
from smtriton.serve.settings import Settings
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


def test_before_the_owner_says_anything_it_is_not_healthy_and_refuses_with_the_reason():
    plane = DataPlane(Settings(), Metrics(enabled=False), "m")
    assert plane.state == STARTING
    assert not plane.healthy

    async def scenario() -> None:
        with pytest.raises(NotReady, match="Triton is starting"):
            await plane.infer("m", b"{}", None)

    asyncio.run(scenario())


def test_the_owners_state_decides_ping_and_a_drain_fails_it_at_once():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        assert plane.healthy
        plane.begin_drain()  # this worker's SIGTERM, before the owner says so
        assert not plane.healthy
        assert (await plane.infer("m", b"{}", None)).status == 200  # accepted requests are still served

    run(scenario)


def test_new_ports_after_a_restart_mean_a_new_client_and_the_old_one_closed():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        first = plane.client
        assert first is not None
        restarting = plane.apply(EndpointState(False, False, "Triton is restarting", None, None))
        assert restarting is not None
        await restarting
        assert plane.client is None
        with pytest.raises(NotReady, match="Triton is restarting"):
            await plane.infer("m", b"{}", None)
        assert plane.apply(EndpointState(True, True, "", triton.port, 9)) is None  # nothing left to close
        assert plane.client is not None
        assert plane.client is not first
        assert (await plane.infer("m", b"{}", None)).status == 200

    run(scenario)


def test_large_json_goes_to_triton_binary_and_custom_attributes_as_a_parameter():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        data = list(range(20_000))
        body = orjson.dumps({"inputs": [{"name": "X", "shape": [len(data)], "datatype": "INT64", "data": data}]})
        await plane.infer("m", body, "application/json", custom_attributes="trace=7")
        _, sent, headers = triton.requests[-1]
        size = int(headers[HEADER_LENGTH])
        header = orjson.loads(sent[:size])
        assert header["inputs"][0]["parameters"]["binary_data_size"] == 8 * len(data)
        assert header["parameters"] == {"sagemaker_custom_attributes": "trace=7"}
        assert len(sent) == size + 8 * len(data)

    run(scenario)


def test_instance_count_comes_from_the_models_config():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        assert await plane.instance_count() == 2

    run(scenario)


def test_mme_invokes_resolve_through_the_owners_records_and_an_unload_waits_for_them():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        assert plane.handle("model_added", {"record": RECORD.to_wire()}) is None
        model = plane.begin_invoke("shown", "a.tar.gz")
        with pytest.raises(BadRequest, match="does not match"):
            plane.begin_invoke("shown", "other.tar.gz")
        drained = plane.handle("model_draining", {"name": "shown", "seconds": 30})
        assert drained is not None
        waiting = asyncio.ensure_future(drained)
        with pytest.raises(ModelNotFound):  # new invokes are refused from the start of the drain
            plane.begin_invoke("shown", None)
        await asyncio.sleep(0.05)
        assert not waiting.done()  # the running invoke holds the unload
        plane.end_invoke(model)
        await asyncio.wait_for(waiting, 1)
        assert plane.handle("model_removed", {"name": "shown"}) is None

    run(scenario, default_model=None)


def test_a_drain_that_outlasts_its_bound_gives_up_waiting():
    async def scenario(triton: TritonStandIn, plane: DataPlane) -> None:
        plane.handle("model_added", {"record": RECORD.to_wire()})
        plane.begin_invoke("shown", None)  # never ends
        drained = plane.handle("model_draining", {"name": "shown", "seconds": 0.1})
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
            assert (await plane.infer("m", jpeg, "image/jpeg", custom_attributes="a=1")).status == 200
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
        with pytest.raises(UnsupportedMediaType) as refused:
            await plane.infer("m", b"\x89PNG...", "image/png")
        assert refused.value.status == 415
        assert f"({inputs[0]['datatype']} {inputs[0]['shape']})" in refused.value.message
        assert not [path for path, _, _ in triton.requests if path.endswith("/infer")]

    run(scenario)


START: dict[str, str | int | bool] = {"sequence_id": 7, "sequence_start": True}
END: dict[str, str | int | bool] = {"sequence_id": 7, "sequence_end": True}


class RecordingOwner:
    """The owner's side of the channel, recording what a worker tells it and how."""

    def __init__(self) -> None:
        self.said: list[tuple[str, str]] = []

    async def call(self, op: str, timeout: float | None = None, **fields: object) -> None:
        self.said.append(("call", op))

    def notify(self, op: str, **fields: object) -> None:
        self.said.append(("notice", op))


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
        plane.owner = owner  # type: ignore[assignment]
        await plane.session_done(step, answered)
        assert owner.said == said

    run(scenario)
