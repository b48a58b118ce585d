"""Streaming and the generate API (SAGEMAKER_TRITON_INFERENCE_TYPE), with a decoupled model."""

from __future__ import annotations

import json
import shutil
import time

import pytest
import requests

from tests.integration.conftest import TEST_MODELS, start_serve
from tests.integration.harness import ServeProcess

pytestmark = pytest.mark.integration


def _events(response: requests.Response) -> list[dict]:
    events = []
    for line in response.iter_lines():
        if line.startswith(b"data: "):
            events.append(json.loads(line[6:]))
    return events


@pytest.fixture(scope="module")
def tokens_repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("tokens") / "models"
    shutil.copytree(TEST_MODELS / "tokens", repo / "tokens", ignore=shutil.ignore_patterns("__pycache__"))
    return repo


@pytest.fixture(scope="module")
def stream_server(tmp_path_factory, tokens_repository):
    env = {"SAGEMAKER_TRITON_INFERENCE_TYPE": "generate_stream"}
    server = start_serve(tmp_path_factory.mktemp("stream"), tokens_repository, "tokens", env=env)
    yield server
    server.stop()


def test_generate_stream_sends_every_response_in_order_as_it_comes(stream_server):
    started = time.monotonic()
    with requests.post(f"{stream_server.url}/invocations", json={"N": 30}, stream=True, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers.get("transfer-encoding") == "chunked"
        lines = r.iter_lines()
        first = next(line for line in lines if line)
        first_at = time.monotonic() - started
        rest = _events_from(lines)
    assert json.loads(first[6:])["TOKEN"] == 0
    assert [e["TOKEN"] for e in rest] == list(range(1, 30))
    assert first_at < 0.3  # streamed: the first token comes long before the last is made (30 tokens, 20 ms apart)


def _events_from(lines) -> list[dict]:
    return [json.loads(line[6:]) for line in lines if line.startswith(b"data: ")]


def test_a_client_that_disconnects_cancels_the_triton_request(stream_server, tokens_repository):
    marker = tokens_repository / "tokens" / "1" / "cancelled-200"
    with requests.post(f"{stream_server.url}/invocations", json={"N": 200}, stream=True, timeout=30) as r:
        lines = r.iter_lines()
        assert next(line for line in lines if line).startswith(b"data: ")
    deadline = time.monotonic() + 4  # 200 tokens would take 4 s if the request ran on
    while not marker.exists():
        assert time.monotonic() < deadline, "the model never saw the cancellation"
        time.sleep(0.05)
    assert requests.get(f"{stream_server.url}/ping", timeout=5).status_code == 200


def test_generate_stream_errors_are_json(stream_server):
    r = requests.post(f"{stream_server.url}/invocations", json={"N": "x"}, timeout=30)
    assert r.status_code == 400
    assert "error" in r.json()


def test_generate_routes_to_tritons_generate_endpoint(tmp_path, test_repository):
    server = start_serve(tmp_path, test_repository, "ident", env={"SAGEMAKER_TRITON_INFERENCE_TYPE": "generate"})
    try:
        r = requests.post(f"{server.url}/invocations", json={"INPUT0": [1.5, 2.5]}, timeout=30)
        assert r.status_code == 200, r.text
        assert r.json() == {"model_name": "ident", "model_version": "1", "OUTPUT0": [1.5, 2.5]}
    finally:
        server.stop()


def test_an_invalid_inference_type_stops_serve_with_a_clear_message(tmp_path, test_repository):
    server = ServeProcess(
        test_repository, "ident", tmp_path / "serve.log", env={"SAGEMAKER_TRITON_INFERENCE_TYPE": "predict"}
    )
    try:
        assert server.proc.wait(30) == 1
        assert "SAGEMAKER_TRITON_INFERENCE_TYPE='predict' must be one of infer, generate, generate_stream" in (
            server.log_text()
        )
    finally:
        server.stop()


@pytest.fixture(scope="module")
def infer_stream_server(tmp_path_factory, tokens_repository):
    server = start_serve(tmp_path_factory.mktemp("infer-stream"), tokens_repository, "tokens")
    yield server
    server.stop()


def _tokens_request(n: int) -> dict:
    return {"id": "s1", "inputs": [{"name": "N", "shape": [1], "datatype": "INT32", "data": [n]}]}


def test_decoupled_model_streams_json_lines_on_invocations(infer_stream_server):
    with requests.post(f"{infer_stream_server.url}/invocations", json=_tokens_request(6), stream=True, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/jsonlines"
        responses = [json.loads(line) for line in r.iter_lines() if line]
    assert [resp["outputs"][0]["data"] for resp in responses] == [[i] for i in range(6)]
    assert responses[0] == {
        "id": "s1",
        "model_name": "tokens",
        "model_version": "1",
        "outputs": [{"name": "TOKEN", "datatype": "INT32", "shape": [1], "data": [0]}],
    }


def test_decoupled_model_streams_server_sent_events_when_asked(infer_stream_server):
    headers = {"Accept": "text/event-stream"}
    with requests.post(
        f"{infer_stream_server.url}/invocations", json=_tokens_request(4), headers=headers, stream=True, timeout=30
    ) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = _events(r)
    assert [e["outputs"][0]["data"][0] for e in events] == [0, 1, 2, 3]


def test_decoupled_model_takes_binary_json_requests(infer_stream_server):
    import numpy as np

    from tests.integration.contract_client import binary_request

    body, content_type = binary_request({"N": np.array([3], dtype=np.int32)})
    r = requests.post(
        f"{infer_stream_server.url}/invocations", data=body, headers={"Content-Type": content_type}, timeout=30
    )
    assert r.status_code == 200
    assert [json.loads(line)["outputs"][0]["data"] for line in r.content.splitlines()] == [[0], [1], [2]]


def test_streamed_infer_cancels_when_the_client_disconnects(infer_stream_server, tokens_repository):
    marker = tokens_repository / "tokens" / "1" / "cancelled-150"
    with requests.post(
        f"{infer_stream_server.url}/invocations", json=_tokens_request(150), stream=True, timeout=30
    ) as r:
        assert next(line for line in r.iter_lines() if line)
    deadline = time.monotonic() + 3  # 150 tokens would take 3 s if the request ran on
    while not marker.exists():
        assert time.monotonic() < deadline, "the model never saw the cancellation"
        time.sleep(0.05)


def test_bad_streaming_requests_are_400_before_any_stream(infer_stream_server):
    r = requests.post(f"{infer_stream_server.url}/invocations", data=b"{nope", timeout=30)
    assert r.status_code == 400
    assert "error" in r.json()
    bad = {"inputs": [{"name": "N", "shape": [1], "datatype": "INT32", "data": ["x"]}]}
    r = requests.post(f"{infer_stream_server.url}/invocations", json=bad, timeout=30)
    assert r.status_code == 400
