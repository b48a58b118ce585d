"""Large JSON requests re-encoded binary in the front: Triton's answer must be the one it gives to the
JSON request itself. Two servers on the same model, one re-encoding every JSON body of 1 KiB or more,
one never; every request goes to both and the answers are compared byte for byte."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.integration.conftest import start_serve
from tests.integration.harness import ServeProcess, free_port, metric_samples, triton_key, triton_url


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, test_repository: Path) -> Iterator[dict[str, ServeProcess]]:
    metrics_port = free_port()
    started: dict[str, ServeProcess] = {}
    try:
        started["transcoding"] = start_serve(
            tmp_path_factory.mktemp("transcoding"),
            test_repository,
            "ident",
            env={"SMTRITON_TRANSCODE_JSON_MIN_BYTES": "1024", "SMTRITON_METRICS_PORT": str(metrics_port)},
        )
        started["plain"] = start_serve(
            tmp_path_factory.mktemp("plain"), test_repository, "ident", env={"SMTRITON_TRANSCODE_JSON_MIN_BYTES": "0"}
        )
        yield started
    finally:
        for server in started.values():
            server.stop()


def transcoded(server: ServeProcess) -> float:
    return metric_samples(server.metrics_url)[("smtriton_transcoded_requests_total", ())]


def both(servers: dict[str, ServeProcess], body: bytes, content_type: str = "application/json") -> requests.Response:
    answers = [
        requests.post(f"{s.url}/invocations", data=body, headers={"Content-Type": content_type}, timeout=30)
        for s in (servers["transcoding"], servers["plain"])
    ]
    mine, native = answers
    assert (mine.status_code, mine.headers["Content-Type"], mine.content) == (
        native.status_code,
        native.headers["Content-Type"],
        native.content,
    )
    return mine


def large(data: list, shape: list[int] | None = None, **spec) -> bytes:
    tensor = {"name": "INPUT0", "shape": shape or [len(data)], "datatype": "FP32", "data": data, **spec}
    return json.dumps({"id": "r1", "inputs": [tensor]}).encode()


def test_a_large_fp32_request_is_re_encoded_and_answered_as_triton_answers_its_json(servers):
    values = np.random.default_rng(1).standard_normal(4096).astype(np.float32).tolist()
    values[:4] = [1, -7, 0, 3.4e38]  # JSON integers and a value near FP32's limit
    before = transcoded(servers["transcoding"])
    answer = both(servers, large(values))
    assert answer.status_code == 200
    assert json.loads(answer.content)["outputs"][0]["data"] == np.array(values, dtype=np.float32).tolist()
    both(servers, large(values), "application/octet-stream")
    assert transcoded(servers["transcoding"]) == before + 2


def test_binary_outputs_asked_for_in_json_still_come_back_binary(servers):
    body = json.loads(large([0.5] * 2048))
    body["outputs"] = [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]
    answer = both(servers, json.dumps(body).encode())
    assert "json-header-size=" in answer.headers["Content-Type"]


@pytest.mark.parametrize(
    "body",
    [
        large([0.5] * 2048, name="NOPE"),  # an input the model lacks: re-encoded, Triton's own error
        large([0.5] * 2048, shape=[2, 1024]),  # a rank the model refuses
        large([0.5] * 2048, datatype="INT32"),  # floats as INT32: left to Triton
        large([0.5] * 2048, shape=[2047]),  # count does not match the shape: left to Triton
        large([0.5] * 2047 + [True]),  # a boolean among numbers: left to Triton
    ],
)
def test_errors_are_tritons_own_whichever_path_the_request_took(servers, body):
    assert both(servers, body).status_code == 400


def test_small_requests_go_untouched(servers):
    before = transcoded(servers["transcoding"])
    assert both(servers, large([1.0, 2.0])).status_code == 200
    assert transcoded(servers["transcoding"]) == before


def sliced_request(data: bytes, count: int) -> bytes:
    """A JSON request past 8 MiB (read in slices by the front) whose data is ``data`` as written."""
    return (
        b'{"inputs":[{"name":"INPUT0","shape":[%d],"datatype":"FP32","data":%s}],'
        b'"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]}' % (count, data)
    )


@pytest.mark.parametrize(
    "tail",
    [b"]]]]", b"],[1]", b"]5]"],
    ids=["brackets-that-close-too-soon", "a-second-array", "garbage-after-the-value"],
)
def test_a_json_request_past_8_mib_whose_data_is_no_json_array_is_400_as_triton_answers_it(servers, tail):
    count = 4_500_000
    values = b"[" + b",".join([b"1"] * count)
    assert len(values) > 8 << 20
    server = servers["plain"]
    served = requests.post(f"{server.url}/invocations", data=sliced_request(values + b"]", count), timeout=120)
    assert served.status_code == 200, served.text[:300]
    body = sliced_request(values + tail, count + (tail == b"],[1]"))  # as many values as the slices once read
    answer = requests.post(f"{server.url}/invocations", data=body, timeout=120)
    assert answer.status_code == 400, answer.text[:300]
    assert answer.json()["error"].startswith("failed to parse the request JSON buffer: input 'INPUT0': its data is")
    native = requests.post(
        f"{triton_url(server)}/v2/models/ident/infer", data=body, headers=triton_key(server), timeout=120
    )
    assert native.status_code != 200
    assert native.json()["error"].startswith("failed to parse the request JSON buffer")
