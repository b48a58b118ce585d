"""Triton's answers mapped to SageMaker's, and streamed responses framed (dataplane/answers.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import orjson

from smtriton.serve.dataplane import answers
from smtriton.serve.dataplane.reading import codec
from smtriton.serve.multimodel.records import ModelRecord
from smtriton.serve.triton.client import UpstreamResponse

BINARY = "application/vnd.sagemaker-triton.binary+json;json-header-size="


def test_a_success_keeps_the_body_and_moves_the_header_length_into_the_content_type():
    assert answers.to_sagemaker(UpstreamResponse(200, "", None, b'{"outputs":[]}')) == (
        200,
        "application/json",
        b'{"outputs":[]}',
    )
    assert answers.to_sagemaker(UpstreamResponse(200, "", 14, b'{"outputs":[]}BIN')) == (
        200,
        BINARY + "14",
        b'{"outputs":[]}BIN',
    )


def test_tritons_500_for_a_request_it_cannot_parse_is_a_client_error_saying_what_a_body_may_be():
    body = b'{"error":"failed to parse the request JSON buffer: Invalid value. at 0"}'
    status, content_type, answer = answers.to_sagemaker(UpstreamResponse(500, "", None, body))
    assert (status, content_type) == (400, "application/json")
    message = orjson.loads(answer)["error"]
    assert message == f"failed to parse the request JSON buffer: Invalid value. at 0; {codec.ACCEPTED_BODIES}"
    other = b'{"error":"model crashed"}'
    assert answers.to_sagemaker(UpstreamResponse(500, "", None, other))[0] == 500


def test_onnx_runtime_refusing_the_requests_data_is_a_client_error():
    gather = b'{"error":"onnx runtime error 2: Non-zero status code returned while running Gather node."}'
    assert answers.to_sagemaker(UpstreamResponse(500, "", None, gather)) == (400, "application/json", gather)
    broadcast = b'{"error":"onnx runtime error 1: ... Attempting to broadcast an axis by a dimension other than 1."}'
    assert answers.to_sagemaker(UpstreamResponse(500, "", None, broadcast))[0] == 400
    other_failure = b'{"error":"onnx runtime error 1: CUDA failure 700: an illegal memory access"}'
    assert answers.to_sagemaker(UpstreamResponse(500, "", None, other_failure))[0] == 500
    torch_failure = b'{"error":"PyTorch execute failure: RuntimeError: index out of range in self"}'
    assert answers.to_sagemaker(UpstreamResponse(500, "", None, torch_failure))[0] == 500


def test_repository_paths_are_stripped_and_non_json_errors_wrapped():
    leaky = b'{"error":"Request for unknown model: \'/opt/ml/model::addsub\'"}'
    assert answers.to_sagemaker(UpstreamResponse(400, "", None, leaky))[2] == (
        b'{"error":"Request for unknown model: \'addsub\'"}'
    )
    assert answers.to_sagemaker(UpstreamResponse(502, "", None, b"bad gateway"))[2] == b'{"error":"bad gateway"}'


def test_mme_answers_put_the_clients_model_name_back_and_map_errors():
    record = ModelRecord("team/m.tar.gz", "/opt/ml/models/x", None, "safe-1", ["safe-1"], "team/m.tar.gz")
    header = b'{"model_name":"safe-1","outputs":[]}'
    status, content_type, body = answers.to_mme_response(record, UpstreamResponse(200, "", len(header), header + b"B"))
    renamed = b'{"model_name":"team/m.tar.gz","outputs":[]}'
    assert (status, content_type, body) == (200, f"{BINARY}{len(renamed)}", renamed + b"B")
    gone = UpstreamResponse(404, "", None, b'{"error":"unknown model"}')
    assert answers.to_mme_response(record, gone)[0] == 404
    oom = UpstreamResponse(500, "", None, b'{"error":"CUDA out of memory"}')
    assert answers.may_be_out_of_memory(oom)
    assert answers.to_mme_response(record, oom, out_of_memory=True)[0] == 507
    down = UpstreamResponse(503, "", None, b'{"error":"down"}')
    assert not answers.may_be_out_of_memory(down)
    assert answers.to_mme_response(record, down)[0] == 503
    assert answers.to_mme_response(record, UpstreamResponse(500, "", None, b'{"error":"bad input"}'))[0] == 400
    unread = UpstreamResponse(500, "", None, b'{"error":"failed to parse the request JSON buffer: Invalid value."}')
    status, _, body = answers.to_mme_response(record, unread)
    assert status == 400
    assert orjson.loads(body)["error"].endswith(f"Invalid value.; {codec.ACCEPTED_BODIES}")


def test_custom_attributes_come_back_only_from_a_successful_response():
    body = b'{"parameters":{"sagemaker_custom_attributes":"trace=1"},"outputs":[]}'
    assert answers.custom_attributes(UpstreamResponse(200, "", None, body)) == "trace=1"
    assert answers.custom_attributes(UpstreamResponse(400, "", None, body)) is None


def test_streamed_responses_are_framed_as_json_lines_or_server_sent_events():
    async def responses() -> AsyncIterator[dict[str, Any]]:
        yield {"outputs": [1]}
        yield {"error": "stop"}

    async def collect(media_type: str) -> list[bytes]:
        return [chunk async for chunk in answers.framed(responses(), media_type)]

    assert answers.stream_media_type("text/event-stream") == answers.SSE
    assert answers.stream_media_type(None) == answers.JSON_LINES
    lines = asyncio.run(collect(answers.JSON_LINES))
    assert [orjson.loads(line) for line in lines] == [{"outputs": [1]}, {"error": "stop"}]
    assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in lines)
    events = asyncio.run(collect(answers.SSE))
    assert events == [b'data: {"outputs":[1]}\n\n', b'data: {"error":"stop"}\n\n']
