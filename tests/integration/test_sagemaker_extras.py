"""Contract parts NVIDIA's front end lacks (docs/contract.md §7): batch transform, custom attributes,
compressed requests."""

from __future__ import annotations

import gzip
import json
import zlib

import numpy as np
import pytest
import requests

from tests.integration.conftest import start_serve
from tests.integration.contract_client import BJ

pytestmark = pytest.mark.integration

ATTRS_HEADER = "X-Amzn-SageMaker-Custom-Attributes"


def _body(values: list[float]) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [len(values)], "datatype": "FP32", "data": values}]}
    ).encode()


@pytest.fixture(scope="module")
def attrs_server(tmp_path_factory, test_repository):
    server = start_serve(
        tmp_path_factory.mktemp("attrs"), test_repository, "attrs", env={"SMTRITON_MAX_PAYLOAD_BYTES": "1048576"}
    )
    yield server
    server.stop()


def test_custom_attributes_reach_the_model_as_a_request_parameter(attrs_server):
    r = requests.post(
        f"{attrs_server.url}/invocations", data=_body([1.0]), headers={ATTRS_HEADER: "trace=abc;tenant=7"}, timeout=30
    )
    assert r.status_code == 200, r.text
    outputs = {o["name"]: o["data"] for o in r.json()["outputs"]}
    assert outputs["SEEN"] == ["trace=abc;tenant=7"]
    assert ATTRS_HEADER not in r.headers  # never the request's own value echoed back


def test_custom_attributes_on_a_binary_request(attrs_server):
    from tests.integration.contract_client import binary_request, parse

    body, content_type = binary_request({"INPUT0": np.array([4.0, 5.0], dtype=np.float32)})
    headers = {"Content-Type": content_type, ATTRS_HEADER: "k=v"}
    r = requests.post(f"{attrs_server.url}/invocations", data=body, headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    result = parse(r)
    assert result.as_numpy("SEEN").tolist() == [b"k=v"]
    assert result.as_numpy("OUTPUT0").tolist() == [4.0, 5.0]


def test_custom_attributes_on_a_binary_request_whose_json_part_is_large_and_holds_keys_triton_ignores(attrs_server):
    """Past 16 KiB the JSON part is read by simdjson, and the keys Triton does not read are not carried
    into the request the attributes are added to: served as the small one is."""
    values = np.array([4.0, 5.0], dtype=np.float32)
    header = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": 8}, "note": 1}
            ],
            "comment": "c" * 20_000,
        }
    ).encode()
    headers = {"Content-Type": f"{BJ};json-header-size={len(header)}", ATTRS_HEADER: "k=v"}
    r = requests.post(f"{attrs_server.url}/invocations", data=header + values.tobytes(), headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    outputs = {o["name"]: o["data"] for o in r.json()["outputs"]}
    assert outputs == {"OUTPUT0": [4.0, 5.0], "SEEN": ["k=v"]}


def test_request_attributes_are_not_echoed_when_the_model_sets_none(attrs_server):
    r = requests.post(f"{attrs_server.url}/invocations", data=_body([1.0]), timeout=30)
    assert r.status_code == 200
    assert ATTRS_HEADER not in r.headers
    assert {o["name"]: o["data"] for o in r.json()["outputs"]}["SEEN"] == [""]


@pytest.mark.parametrize(
    ("encoding", "compress"),
    [("gzip", gzip.compress), ("deflate", zlib.compress), ("deflate", lambda b: zlib.compress(b)[2:-4])],
)
def test_compressed_requests_are_accepted(attrs_server, encoding, compress):
    r = requests.post(
        f"{attrs_server.url}/invocations",
        data=compress(_body([1.5, 2.5])),
        headers={"Content-Encoding": encoding},
        timeout=30,
    )
    assert r.status_code == 200, r.text
    assert {o["name"]: o["data"] for o in r.json()["outputs"]}["OUTPUT0"] == [1.5, 2.5]


def test_a_zip_bomb_is_413_and_bad_encodings_are_4xx(attrs_server):
    bomb = gzip.compress(b" " * (64 * 1024 * 1024))  # 64 MiB of spaces in ~64 KiB, limit is 1 MiB
    assert len(bomb) < 1024 * 1024
    r = requests.post(f"{attrs_server.url}/invocations", data=bomb, headers={"Content-Encoding": "gzip"}, timeout=30)
    assert r.status_code == 413
    assert "limit" in r.json()["error"]
    r = requests.post(
        f"{attrs_server.url}/invocations", data=b"not gzip", headers={"Content-Encoding": "gzip"}, timeout=30
    )
    assert r.status_code == 400
    r = requests.post(
        f"{attrs_server.url}/invocations", data=_body([1.0]), headers={"Content-Encoding": "br"}, timeout=30
    )
    assert r.status_code == 415
    assert requests.get(f"{attrs_server.url}/ping", timeout=5).status_code == 200


def test_execution_parameters_default_to_the_models_instance_count(attrs_server):
    r = requests.get(f"{attrs_server.url}/execution-parameters", timeout=5)
    assert r.status_code == 200
    assert r.json() == {"MaxConcurrentTransforms": 3, "BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": 6}


def test_batch_transform_values_win_and_raise_the_payload_limit(tmp_path, test_repository):
    env = {
        "SAGEMAKER_BATCH": "true",
        "SAGEMAKER_MAX_PAYLOAD_IN_MB": "4",
        "SAGEMAKER_BATCH_STRATEGY": "SINGLE_RECORD",
        "SAGEMAKER_MAX_CONCURRENT_TRANSFORMS": "5",
        "SMTRITON_MAX_PAYLOAD_BYTES": "1048576",
    }
    server = start_serve(tmp_path, test_repository, "attrs", env=env)
    try:
        r = requests.get(f"{server.url}/execution-parameters", timeout=5)
        assert r.json() == {"MaxConcurrentTransforms": 5, "BatchStrategy": "SINGLE_RECORD", "MaxPayloadInMB": 4}
        big = _body([0.5] * 400_000)  # ~2 MB: above the real-time limit of this test, within the batch one
        assert 1024 * 1024 < len(big) < 4 * 1024 * 1024
        r = requests.post(f"{server.url}/invocations", data=big, timeout=60)
        assert r.status_code == 200, r.text[:300]
    finally:
        server.stop()


def test_a_batch_sized_request_is_413_without_batch_transform(attrs_server):
    big = _body([0.5] * 400_000)
    r = requests.post(f"{attrs_server.url}/invocations", data=big, timeout=60)
    assert r.status_code == 413
