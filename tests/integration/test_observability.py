"""/metrics on its own port, and logs as JSON lines without request bodies."""

from __future__ import annotations

import json
import time

import pytest
import requests

from tests.integration.conftest import start_serve
from tests.integration.harness import free_port, metric_samples

pytestmark = pytest.mark.integration

MARKER = "obs-body-marker-5123"
GOOD = {
    "id": MARKER,
    "inputs": [
        {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
        {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
    ],
}


@pytest.fixture(scope="module")
def observed_server(tmp_path_factory, test_repository):
    port = free_port()
    server = start_serve(
        tmp_path_factory.mktemp("obs"),
        test_repository,
        "addsub",
        env={"SMTRITON_METRICS_PORT": str(port), "SMTRITON_ACCESS_LOG": "true"},
    )
    yield server
    server.stop()


def test_metrics_count_what_was_sent(observed_server):
    for _ in range(5):
        assert requests.post(f"{observed_server.url}/invocations", json=GOOD, timeout=10).status_code == 200
    for _ in range(2):
        assert requests.post(f"{observed_server.url}/invocations", data=b"{bad", timeout=10).status_code == 400
    samples = metric_samples(observed_server.metrics_url)
    ok = ("smtriton_requests_total", (("model", "addsub"), ("route", "invocations"), ("status", "200")))
    bad = ("smtriton_requests_total", (("model", "addsub"), ("route", "invocations"), ("status", "400")))
    assert samples[ok] == 5
    assert samples[bad] == 2
    latency = ("smtriton_request_seconds_count", (("model", "addsub"), ("route", "invocations")))
    assert samples[latency] == 7
    assert samples[("smtriton_inflight_requests", (("route", "invocations"),))] == 0
    # Triton's own metrics, re-exported (prometheus_client names counters with _total).
    triton = [v for (name, labels), v in samples.items() if name == "nv_inference_request_success_total"]
    assert triton
    assert max(triton) >= 5


def test_logs_are_json_lines_without_bodies_and_without_pings(observed_server):
    for _ in range(3):
        requests.get(f"{observed_server.url}/ping", timeout=5)
    requests.post(f"{observed_server.url}/invocations", json=GOOD, timeout=10)
    requests.post(
        f"{observed_server.url}/invocations",
        data=b"{bad " + MARKER.encode(),
        headers={"X-Amzn-SageMaker-Inference-Id": "inf-42"},
        timeout=10,
    )
    deadline = time.monotonic() + 10  # the last request's failure is logged: everything before it too
    while '"inf-42"' not in observed_server.log_text():
        assert time.monotonic() < deadline, "the failed request was never logged"
        time.sleep(0.05)
    lines = [line for line in observed_server.log_text().splitlines() if line.strip()]
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all({"time", "level", "logger", "message"} <= set(e) for e in entries)
    assert MARKER not in observed_server.log_text()
    access = [e for e in entries if e["logger"] == "uvicorn.access"]
    assert access
    assert not any("/ping" in e["message"] for e in access)
    assert any(e.get("inference_id") == "inf-42" and e.get("status") == 400 for e in entries)
