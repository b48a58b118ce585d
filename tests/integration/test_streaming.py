"""Streaming and the generate API (SAGEMAKER_TRITON_INFERENCE_TYPE), with a decoupled model."""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

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
        last_at = time.monotonic() - started
    assert json.loads(first[6:])["TOKEN"] == 0
    assert [e["TOKEN"] for e in rest] == list(range(1, 30))
    # Streamed: the first token arrives while the model still makes the other 29 (20 ms apart), not with them.
    assert last_at - first_at > 0.4


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
        assert server.wait(30) == 1
        # NVIDIA's words first (their tests look for them), then which values would do.
        log = server.log_text()
        assert "ERROR: Invalid SAGEMAKER_TRITON_INFERENCE_TYPE 'predict': must be 'infer', 'generate'" in log
        assert "generate_stream" in log
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


def _rss(pid: int) -> int:
    """Resident bytes of a process, from /proc (what the kernel charges it, Python or C alike)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _dechunk(raw: bytes) -> tuple[bytes, bytes]:
    """Head and body of an HTTP/1.1 response with chunked transfer encoding."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    body, at = bytearray(), 0
    while True:
        end = rest.index(b"\r\n", at)
        size = int(rest[at:end].split(b";")[0], 16)
        if size == 0:
            return head, bytes(body)
        body += rest[end + 2 : end + 2 + size]
        at = end + 2 + size + 2


def _firehose(n: int, size: int, gap_ms: int) -> dict:
    """A tokens request for N responses of `size` padding bytes each, `gap_ms` apart."""
    request = _tokens_request(n)
    request["inputs"] += [
        {"name": "SIZE", "shape": [1], "datatype": "INT32", "data": [size]},
        {"name": "GAP_MS", "shape": [1], "datatype": "INT32", "data": [gap_ms]},
    ]
    return request


def _raw_post(port: int, request: dict) -> socket.socket:
    """POST /invocations on a socket with a tiny receive buffer, so serve's writes block early."""
    body = json.dumps(request).encode()
    head = (
        "POST /invocations HTTP/1.1\r\nHost: serve\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small TCP window
    sock.settimeout(20)
    sock.connect(("127.0.0.1", port))
    sock.sendall(head + body)
    return sock


def test_a_stalled_client_holds_the_stream_back_and_serve_does_not_buffer_it(infer_stream_server, tokens_repository):
    """2000 responses of 64 KiB each, made as fast as the model can, to a client that reads nothing until the
    model has sent them all: serve must pass flow control on to Triton, not soak the stream up."""
    count, size = 2000, 64 * 1024
    marker = tokens_repository / "tokens" / "1" / f"sent-{count}"
    pid = infer_stream_server.pid
    warm = requests.post(f"{infer_stream_server.url}/invocations", json=_firehose(50, size, 0), timeout=30)
    assert [json.loads(line)["outputs"][0]["data"] for line in warm.content.splitlines()] == [[i] for i in range(50)]
    baseline = peak = _rss(pid)
    received = bytearray()
    with _raw_post(infer_stream_server.port, _firehose(count, size, 0)) as sock:
        deadline = time.monotonic() + 20
        while not marker.exists():  # the whole stream is out of the model and piles up upstream of us
            assert time.monotonic() < deadline, "the model never finished sending"
            peak = max(peak, _rss(pid))
            time.sleep(0.05)
        time.sleep(0.5)  # time for whatever serve would buffer to arrive
        stalled = peak = max(peak, _rss(pid))
        while chunk := sock.recv(1 << 16):
            received += chunk
            if len(received) % (1 << 20) < len(chunk):  # about every MiB
                peak = max(peak, _rss(pid))
    head, text = _dechunk(bytes(received))
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    responses = [json.loads(line) for line in text.splitlines()]
    assert [r["outputs"][0]["data"] for r in responses] == [[i] for i in range(count)]  # complete, in order
    assert all(
        r["outputs"][1] == {"name": "PADDING", "datatype": "BYTES", "shape": [1], "data": ["x" * size]}
        for r in responses
    )
    assert len(text) > 120 * 2**20
    # ~125 MiB went through; serve held at most a few windows of it, stalled or draining.
    assert stalled - baseline < 16 * 2**20, f"serve grew {(stalled - baseline) >> 20} MiB while the client stalled"
    assert peak - baseline < 16 * 2**20, f"serve grew {(peak - baseline) >> 20} MiB while the client drained"


def test_a_stalled_client_that_goes_away_cancels_the_triton_request(infer_stream_server, tokens_repository):
    """Serve is parked on a full socket when the client closes it: the Triton request must end too."""
    count = 400  # 10 ms apart: 4 s if it ran on
    version = tokens_repository / "tokens" / "1"
    with _raw_post(infer_stream_server.port, _firehose(count, 64 * 1024, 10)) as sock:
        assert sock.recv(64).startswith(b"HTTP/1.1 200")
        time.sleep(0.5)  # reads nothing more: serve's writes block on the full socket
    deadline = time.monotonic() + 3
    while not (version / f"cancelled-{count}").exists():
        assert time.monotonic() < deadline, "the model never saw the cancellation"
        time.sleep(0.05)
    assert not (version / f"sent-{count}").exists()
    assert requests.get(f"{infer_stream_server.url}/ping", timeout=5).status_code == 200
