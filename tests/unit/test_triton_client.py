"""The Triton client against a stand-in speaking Triton's HTTP API: what it sends, and how each way a
call can fail maps onto the error tree (unreachable 503, out of time its own error, refusals as
Triton worded them)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from smtriton.serve.errors import ModelLoadFailed, TritonUnavailable, UpstreamError, UpstreamTimeout
from smtriton.serve.triton.client import TritonClient
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


def test_a_slow_inference_is_504_and_an_unreachable_triton_503():
    async def scenario(triton: TritonStandIn, client: TritonClient) -> None:
        triton.infer_delay_s = 2.0  # past the client's 1 s
        with pytest.raises(UpstreamTimeout, match="inference on model 'm' did not finish in time"):
            await client.infer("m", b"{}", None)
        gone = TritonClient(f"http://127.0.0.1:{_closed_port()}", request_timeout_s=1.0)
        try:
            with pytest.raises(TritonUnavailable, match="Triton is not reachable: ClientConnectorError"):
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
