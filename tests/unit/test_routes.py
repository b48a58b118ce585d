"""Contract rules of the routes that need no Triton, in-process on the ASGI app with a fake data plane."""

from __future__ import annotations

import gzip
import json

import pytest

from tests.unit.fake_plane import FakePlane, call


@pytest.mark.parametrize(("healthy", "status"), [(True, 200), (False, 503)])
def test_ping_answers_health_with_an_empty_body(healthy, status):
    assert call(FakePlane(healthy=healthy), "GET", "/ping")[::2] == (status, b"")


@pytest.mark.parametrize(
    ("method", "path"), [("POST", "/ping"), ("HEAD", "/ping"), ("GET", "/invocations"), ("PUT", "/invocations")]
)
def test_wrong_methods_on_the_data_routes_are_405_in_json(method, path):
    status, headers, payload = call(FakePlane(), method, path)
    assert (status, headers[b"content-type"], json.loads(payload)) == (
        405,
        b"application/json",
        {"error": "Method Not Allowed"},
    )


def test_invocations_forward_the_decompressed_body_and_custom_attributes_both_ways():
    plane = FakePlane()
    body = b'{"inputs":[]}'
    headers = [
        (b"content-type", b"application/json"),
        (b"content-encoding", b"gzip"),
        (b"x-amzn-sagemaker-custom-attributes", b"trace=1"),
    ]
    status, response_headers, _ = call(plane, "POST", "/invocations", gzip.compress(body), headers)
    assert status == 200
    assert plane.seen == [("m", body, "application/json", "trace=1")]
    assert response_headers[b"x-amzn-sagemaker-custom-attributes"] == b"back"


def test_limits_are_413_and_431_before_anything_is_forwarded():
    plane = FakePlane()
    assert call(plane, "POST", "/invocations", b"x" * 1025)[0] == 413
    declared = [(b"content-length", b"5000")]
    assert call(plane, "POST", "/invocations", b"", declared)[0] == 413
    assert call(plane, "POST", "/invocations", b"{}", [(b"x-big", b"y" * 3000)])[0] == 431
    assert plane.seen == []


def test_invocations_on_a_multi_model_endpoint_and_invoke_on_a_single_model_one_are_refused():
    status, _, payload = call(FakePlane(default_model=None), "POST", "/invocations", b"{}")
    assert (status, json.loads(payload)["error"]) == (400, "this is a multi-model endpoint")
    status, _, payload = call(FakePlane(), "POST", "/models/m/invoke", b"{}")
    assert (status, json.loads(payload)) == (404, {"error": "model 'm' is not loaded"})


def test_unrouted_paths_are_400_as_native_answers_them():
    status, _, payload = call(FakePlane(), "GET", "/nowhere")
    assert (status, json.loads(payload)) == (400, {"error": "no route for GET /nowhere"})
