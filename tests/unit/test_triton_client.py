"""The Triton client against a stand-in speaking Triton's HTTP API: what it sends, and how each way a
call can fail maps onto the error tree (unreachable 503, out of time its own error, refusals as
Triton worded them)."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from smtriton.serve.errors import ModelLoadFailed, TritonUnavailable, UpstreamError, UpstreamTimeout
from smtriton.serve.triton.client import TritonClient, without_repeated_parameters
from tests.unit.triton_stand_in import HEADER_LENGTH, TritonStandIn


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(scenario) -> None:
    async def main() -> None:
        async with TritonStandIn().running() as triton:
            client = TritonClient(f"http://127.0.0.1:{triton.port}", request_timeout_s=1.0)
            try:
                await scenario(triton, client)
            finally:
                await client.close()

    asyncio.run(main())


def test_infer_passes_the_body_through_and_reads_the_binary_header_length():
    async def scenario(triton: TritonStandIn, client: TritonClient) -> None:
        binary = await client.infer("m", b'{"inputs":[]}RAW', 13)
        assert (binary.status, binary.header_length, binary.body) == (200, 13, b'{"inputs":[]}RAW')
        path, body, headers = triton.requests[-1]
        assert (path, body, headers[HEADER_LENGTH]) == ("/v2/models/m/infer", b'{"inputs":[]}RAW', "13")
        assert headers["Content-Type"] == "application/octet-stream"
        plain = await client.infer("m", b'{"inputs":[]}', None)
        assert (plain.header_length, triton.requests[-1][2]["Content-Type"]) == (None, "application/json")
        unknown = await client.infer("nope", b"{}", None)
        assert unknown.status == 400  # Triton's own answer is passed on, not raised

    run(scenario)


# What Triton 2.5x answers for an ensemble with two outputs: its ensemble scheduler adds the sequence
# parameters once per output tensor.
ENSEMBLE_ANSWER = (
    b'{"model_name":"ens","model_version":"1","parameters":{"sequence_id":0,"sequence_start":false,'
    b'"sequence_end":false,"sequence_id":0,"sequence_start":false,"sequence_end":false},"outputs":['
    b'{"name":"DIFF","datatype":"INT32","shape":[1,1],"parameters":{"binary_data_size":4}},'
    b'{"name":"SUM","datatype":"INT32","shape":[1,1],"parameters":{"binary_data_size":4}}]}'
)
ONCE = b'"parameters":{"sequence_id":0,"sequence_start":false,"sequence_end":false},"outputs":['


def test_an_answer_says_each_of_its_parameters_once():
    tensors = b"\x01\x00\x00\x00\x02\x00\x00\x00"
    body, length = without_repeated_parameters(ENSEMBLE_ANSWER + tensors, len(ENSEMBLE_ANSWER))
    assert length is not None
    assert ONCE in body[:length]
    assert body[length:] == tensors  # the binary tensors after the header are untouched
    header = json.loads(body[:length], object_pairs_hook=_no_repeated_key)
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 4}  # an output's own stay
    json_body, none = without_repeated_parameters(ENSEMBLE_ANSWER, None)
    assert none is None
    assert json_body == body[:length]


def test_an_answer_without_repeated_parameters_is_passed_on_as_the_same_bytes():
    for answer in (
        b'{"model_name":"m","model_version":"1","outputs":[{"name":"y","parameters":{"binary_data_size":4}}]}',
        b'{"model_name":"m","model_version":"1","parameters":{"sequence_id":3},"outputs":[]}',
        b'{"parameters":{"a":"\xff","a":2},"outputs":[]}',  # no UTF-8: no answer of Triton's to touch
        b'{"parameters":{"a":1,"a":2,"outputs":[]}',  # no JSON object: the same
        b"not json at all",
    ):
        assert without_repeated_parameters(answer, None)[0] is answer


def _no_repeated_key(pairs: list[tuple[str, object]]) -> dict[str, object]:
    keys = [key for key, _ in pairs]
    assert len(keys) == len(set(keys)), keys
    return dict(pairs)


def test_the_client_hands_on_an_ensembles_answer_with_its_parameters_once():
    async def scenario(triton: TritonStandIn, client: TritonClient) -> None:
        echoed = await client.infer("m", ENSEMBLE_ANSWER + b"RAW", len(ENSEMBLE_ANSWER))
        assert echoed.header_length == len(echoed.body) - len(b"RAW") < len(ENSEMBLE_ANSWER)
        assert echoed.body.endswith(b"]}RAW")
        assert ONCE in echoed.body

    run(scenario)


def test_a_slow_inference_is_504_and_an_unreachable_triton_503():
    async def scenario(triton: TritonStandIn, client: TritonClient) -> None:
        triton.infer_delay_s = 2.0  # past the client's 1 s
        with pytest.raises(UpstreamTimeout, match="inference on model 'm' did not finish in time"):
            await client.infer("m", b"{}", None)
        gone = TritonClient(f"http://127.0.0.1:{_closed_port()}", request_timeout_s=1.0)
        try:
            with pytest.raises(TritonUnavailable, match="Triton is not reachable: ConnectionRefusedError"):
                await gone.infer("m", b"{}", None)
            with pytest.raises(TritonUnavailable):
                await gone.model_states()
            with pytest.raises(TritonUnavailable):
                await gone.load_model("m", 5)
            assert await gone.server_live() is False
            assert await gone.model_ready("m") is None  # no verdict when Triton does not answer
        finally:
            await gone.close()

    run(scenario)


def test_model_control_reads_and_changes_the_repository():
    async def scenario(triton: TritonStandIn, client: TritonClient) -> None:
        assert await client.server_live()
        assert await client.model_state("m") == ("READY", "")
        assert await client.model_state("other") == (None, "")
        await client.load_model("other", 5)
        assert (await client.model_states())["other"] == "READY"
        assert await client.model_ready("other") is True
        await client.unload_model("other")
        assert (await client.model_states())["other"] == "UNAVAILABLE"
        assert await client.model_ready("other") is False
        triton.decoupled.add("m")
        assert await client.is_decoupled("m")
        assert (await client.model_config("m"))["instance_group"] == [{"count": 2, "kind": "KIND_CPU"}]

    run(scenario)


def test_a_refused_load_says_why_in_tritons_words():
    async def scenario(triton: TritonStandIn, client: TritonClient) -> None:
        triton.load_error = "failed to load 'm', no version is available"
        with pytest.raises(ModelLoadFailed, match="failed to load 'm', no version is available"):
            await client.load_model("m", 5)
        with pytest.raises(UpstreamError) as missing:
            await client.model_config("missing")
        assert missing.value.status == 400

    run(scenario)
