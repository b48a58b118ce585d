"""SageMaker single-model contract (docs/contract.md §2, §3) against the real serve + Triton."""

from __future__ import annotations

import json

import numpy as np
import pytest
import requests

from tests.integration.conftest import start_serve
from tests.integration.contract_client import BJ, binary_request, json_request, parse

pytestmark = pytest.mark.integration

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)
ADDSUB_JSON = json.dumps(json_request({"INPUT0": A, "INPUT1": B})).encode()


def _invoke(server, body: bytes, content_type: str | None = "application/json", **headers: str):
    if content_type is not None:
        headers["Content-Type"] = content_type
    return requests.post(f"{server.url}/invocations", data=body, headers=headers, timeout=30)


def _assert_addsub(result) -> None:
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_ping_is_200_with_an_empty_plain_body(addsub_server):
    r = requests.get(f"{addsub_server.url}/ping", timeout=5)
    assert r.status_code == 200
    assert r.content == b""
    assert r.headers["content-type"] == "text/plain"
    assert requests.get(f"{addsub_server.url}/ping?x=1", timeout=5).status_code == 200


@pytest.mark.parametrize(
    ("method", "path"), [("HEAD", "/ping"), ("POST", "/ping"), ("GET", "/invocations"), ("PUT", "/invocations")]
)
def test_wrong_method_is_405_with_json_error(addsub_server, method, path):
    r = requests.request(method, f"{addsub_server.url}{path}", timeout=5)
    assert r.status_code == 405
    if method != "HEAD":
        assert r.json() == {"error": "Method Not Allowed"}


@pytest.mark.parametrize("path", ["/ping/", "//ping", "/foo", "/v2/health/ready", "/invocations/"])
def test_unrouted_paths_are_404_with_json_error(addsub_server, path):
    method = "POST" if "invocations" in path else "GET"
    r = requests.request(method, f"{addsub_server.url}{path}", timeout=5)
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/json"
    assert "error" in r.json()


def test_triton_model_control_api_is_not_reachable_through_the_front(addsub_server):
    r = requests.post(f"{addsub_server.url}/v2/repository/models/addsub/unload", timeout=5)
    assert r.status_code == 404
    assert requests.get(f"{addsub_server.url}/ping", timeout=5).status_code == 200


def test_sme_lists_no_multi_model_models(addsub_server):
    r = requests.get(f"{addsub_server.url}/models", timeout=5)
    assert (r.status_code, r.json()) == (200, {"models": []})


@pytest.mark.parametrize("content_type", ["application/json", None, "application/octet-stream", "text/csv"])
def test_json_body_with_any_content_type_gets_the_native_json_response(addsub_server, content_type):
    r = _invoke(addsub_server, ADDSUB_JSON, content_type)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in r.headers
    body = r.json()
    assert list(body) == ["model_name", "model_version", "outputs"]
    assert body["model_name"] == "addsub"
    _assert_addsub(parse(r))


def test_request_id_is_echoed_first_and_parameters_are_not(addsub_server):
    body = json.dumps(json_request({"INPUT0": A, "INPUT1": B}, id="req-42", parameters={"foo": "bar"}))
    r = _invoke(addsub_server, body.encode())
    assert r.status_code == 200
    assert r.content.startswith(b'{"id":"req-42","model_name":"addsub"')
    assert "foo" not in r.json()


def test_binary_data_output_returns_the_binary_json_type(addsub_server):
    body = json.dumps(json_request({"INPUT0": A, "INPUT1": B}, parameters={"binary_data_output": True}))
    r = _invoke(addsub_server, body.encode())
    assert r.status_code == 200
    json_size = int(r.headers["content-type"].removeprefix(f"{BJ};json-header-size="))
    assert len(r.content) == json_size + 2 * 64
    _assert_addsub(parse(r))


def test_tritonclient_binary_request_mixed_outputs(addsub_server):
    body, content_type = binary_request(
        {"INPUT0": A, "INPUT1": B}, binary_outputs={"OUTPUT0": True, "OUTPUT1": False}, request_id="tc-1"
    )
    r = _invoke(addsub_server, body, content_type)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith(f"{BJ};json-header-size=")
    result = parse(r)
    _assert_addsub(result)
    assert result.get_response()["id"] == "tc-1"


def test_tritonclient_binary_request_with_json_outputs_answers_json(addsub_server):
    body, content_type = binary_request({"INPUT0": A, "INPUT1": B}, binary_outputs={"OUTPUT0": False})
    r = _invoke(addsub_server, body, content_type)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    outputs = r.json()["outputs"]
    assert [o["name"] for o in outputs] == ["OUTPUT0"]
    assert outputs[0]["data"] == (A + B).flatten().tolist()


def test_classification_extension_passes_through(addsub_server):
    request = json_request({"INPUT0": A, "INPUT1": B})
    request["outputs"] = [{"name": "OUTPUT0", "parameters": {"classification": 3}}]
    r = _invoke(addsub_server, json.dumps(request).encode())
    assert r.status_code == 200
    assert r.json()["outputs"][0]["data"] == ["18:15", "17:14", "16:13"]


def _bad_requests() -> list[tuple[str, bytes, str | None, int, str]]:
    valid = json_request({"INPUT0": A, "INPUT1": B})
    body, bj_type = binary_request({"INPUT0": A, "INPUT1": B})
    json_size = int(bj_type.split("=")[-1])
    wrong_name = json.loads(json.dumps(valid))
    wrong_name["inputs"][0]["name"] = "NOPE"
    wrong_dtype = json.loads(json.dumps(valid))
    wrong_dtype["inputs"][0]["datatype"] = "FP32"
    wrong_shape = json_request({"INPUT0": A[:, :15], "INPUT1": B[:, :15]})
    missing = {"inputs": valid["inputs"][:1]}
    too_many = json_request({"INPUT0": np.zeros((9, 16), np.int32), "INPUT1": np.zeros((9, 16), np.int32)})
    short_data = json.loads(json.dumps(valid))
    short_data["inputs"][0]["data"] = [1, 2, 3]
    return [
        ("malformed json", b"{not json", "application/json", 400, "failed to parse the request JSON buffer"),
        (
            "a csv body to a model of two inputs",
            b"1,2,3\n4,5,6\n",
            "text/csv",
            415,
            "does not take text/csv: that needs exactly one numeric input of shape [batch, n]",
        ),
        (
            "a body that is no JSON",
            b"1,2,3\n4,5,6\n",
            "application/octet-stream",
            400,
            "; serve takes KServe v2 JSON (application/json; a body of a type not named here is read as JSON too), "
            "binary+json (application/vnd.sagemaker-triton.binary+json;json-header-size=N), JSON Lines of such "
            "requests (application/jsonlines), CSV rows (text/csv) or an encoded image",
        ),
        ("no inputs", b"{}", "application/json", 400, "Unable to parse 'inputs'"),
        ("unknown input", json.dumps(wrong_name).encode(), None, 400, "unexpected inference input 'NOPE'"),
        ("missing input", json.dumps(missing).encode(), None, 400, "expected 2 inputs but got 1"),
        ("wrong dtype", json.dumps(wrong_dtype).encode(), None, 400, "data-type is 'FP32'"),
        ("wrong shape", json.dumps(wrong_shape).encode(), None, 400, "unexpected shape for input"),
        ("batch too large", json.dumps(too_many).encode(), None, 400, "batch-size must be <= 8"),
        ("data count mismatch", json.dumps(short_data).encode(), None, 400, "Unable to parse 'data'"),
        ("header size not a number", body, f"{BJ};json-header-size=abc", 400, "invalid json-header-size 'abc'"),
        ("negative header size", body, f"{BJ};json-header-size=-123", 400, "invalid json-header-size '-123'"),
        ("header size past body", body, f"{BJ};json-header-size={len(body) + 1}", 400, "should be in range"),
        ("missing header size", body, BJ, 400, "json-header-size"),
        ("binary body sent as json", body, "application/json", 400, "expecting 64 additional bytes"),
        ("header size cuts the json", body, f"{BJ};json-header-size={json_size - 10}", 400, "failed to parse"),
        ("raw mode on a two-input model", b"\x00" * 64, f"{BJ};json-header-size=0", 400, "Raw request"),
        ("oversized body", b"{" + b" " * 70_000 + b"}", "application/json", 413, "larger than the limit"),
    ]


@pytest.fixture(scope="module")
def limited_server(tmp_path_factory, test_repository):
    server = start_serve(
        tmp_path_factory.mktemp("limited"), test_repository, "addsub", env={"SMTRITON_MAX_PAYLOAD_BYTES": "65536"}
    )
    yield server
    server.stop()


@pytest.mark.parametrize(
    ("label", "body", "content_type", "status", "message"), _bad_requests(), ids=[case[0] for case in _bad_requests()]
)
def test_bad_input_is_4xx_json_and_the_next_request_succeeds(
    limited_server, label, body, content_type, status, message
):
    r = _invoke(limited_server, body, content_type)
    assert r.status_code == status, (label, r.status_code, r.text)
    assert r.headers["content-type"] == "application/json"
    assert message in r.json()["error"]
    ok = _invoke(limited_server, ADDSUB_JSON)
    assert ok.status_code == 200
    assert requests.get(f"{limited_server.url}/ping", timeout=5).status_code == 200


@pytest.fixture(scope="module")
def ident_server(tmp_path_factory, test_repository):
    server = start_serve(tmp_path_factory.mktemp("ident"), test_repository, "ident")
    yield server
    server.stop()


def test_raw_mode_sends_the_body_as_the_only_input(ident_server):
    data = np.array([1.5, -2.0, 3.25], dtype=np.float32)
    r = _invoke(ident_server, data.tobytes(), f"{BJ};json-header-size=0")
    assert r.status_code == 200, r.text
    result = parse(r)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def test_empty_body_is_an_empty_raw_tensor(ident_server):
    r = _invoke(ident_server, b"", "application/json")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json()["outputs"][0]["shape"] == [0]


def test_raw_bytes_not_a_multiple_of_the_element_size_are_refused(ident_server):
    r = _invoke(ident_server, b"\x00" * 5, f"{BJ};json-header-size=0")
    assert r.status_code == 400
    assert "input byte size mismatch" in r.json()["error"]
