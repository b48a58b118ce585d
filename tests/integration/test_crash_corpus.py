"""Every input known to crash or abort Triton 2.51, sent to the real serve: each is answered with a
JSON 4xx, Triton's process is the same one afterwards, /ping stays 200 and the next valid request is
answered. A new crasher found anywhere belongs in this corpus."""

from __future__ import annotations

import gzip
import http.client
import json
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests

from tests.integration.conftest import TEST_MODELS, start_serve
from tests.integration.contract_client import json_request
from tests.integration.harness import ServeProcess, triton_pids

pytestmark = pytest.mark.integration

A = np.arange(16, dtype=np.int32).reshape(1, 16)
VALID = json.dumps(json_request({"INPUT0": A, "INPUT1": A})).encode()
JSON = {"Content-Type": "application/json"}


def nested(depth: int) -> bytes:
    return b'{"inputs":' + b"[" * depth + b"]" * depth + b"}"


@pytest.fixture(scope="module")
def sme(tmp_path_factory, test_repository) -> Iterator[ServeProcess]:
    server = start_serve(tmp_path_factory.mktemp("corpus-sme"), test_repository, "addsub")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def mme(tmp_path_factory) -> Iterator[ServeProcess]:
    tmp = tmp_path_factory.mktemp("corpus-mme")
    root = tmp / "models"
    shutil.copytree(TEST_MODELS / "addsub", root / "m" / "model")
    server = start_serve(tmp, None, None, args=["--multi-model", "--model-root", str(root)])
    server.root = root  # type: ignore[attr-defined]
    url = str(root / "m" / "model")
    assert requests.post(f"{server.url}/models", json={"model_name": "m", "url": url}, timeout=120).status_code == 200
    yield server
    server.stop()


def assert_unharmed(server: ServeProcess, pid: int, invoke_path: str) -> None:
    assert triton_pids(server.marker) == [pid], "Triton was restarted"
    assert requests.get(f"{server.url}/ping", timeout=10).status_code == 200
    r = requests.post(f"{server.url}{invoke_path}", data=VALID, headers=JSON, timeout=60)
    assert r.status_code == 200, r.text


def assert_json_4xx(response: requests.Response) -> None:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:200])
    assert response.headers["Content-Type"] == "application/json"
    assert "error" in response.json()


# name -> (content type, body, extra headers)
INFERENCE_CRASHERS = {
    "200,000 nested arrays": ("application/json", nested(200_000), {}),
    "200,000 unclosed arrays": ("application/json", b"[" * 200_000, {}),
    "100,000 nested objects": ("application/json", b'{"a":' * 100_000 + b"1" + b"}" * 100_000, {}),
    "nested arrays inside a small request": ("application/json", nested(20_000), {}),
    "64 MiB of [ gzip-compressed": ("application/json", gzip.compress(b"[" * (64 << 20)), {"Content-Encoding": "gzip"}),
    "nested arrays in the binary+json header": (
        f"application/vnd.sagemaker-triton.binary+json;json-header-size={len(nested(50_000))}",
        nested(50_000) + b"\0" * 64,
        {},
    ),
    "nested arrays sent as octet-stream": ("application/octet-stream", nested(200_000), {}),
}


@pytest.mark.parametrize("case", sorted(INFERENCE_CRASHERS))
@pytest.mark.parametrize(("endpoint", "path"), [("sme", "/invocations"), ("mme", "/models/m/invoke")])
def test_inference_refuses_what_would_crash_triton(request, endpoint, path, case):
    server: ServeProcess = request.getfixturevalue(endpoint)
    (pid,) = triton_pids(server.marker)
    content_type, body, headers = INFERENCE_CRASHERS[case]
    r = requests.post(f"{server.url}{path}", data=body, headers={"Content-Type": content_type, **headers}, timeout=120)
    assert_json_4xx(r)
    assert_unharmed(server, pid, path)


@pytest.mark.parametrize(
    "body",
    [b"not json", b'{"model_name": 5, "url": "/x"}', b'{"model_name": null, "url": null}', b"[]", nested(200_000)],
)
def test_malformed_load_bodies_leave_triton_and_the_loaded_model_alone(mme, body):
    (pid,) = triton_pids(mme.marker)
    r = requests.post(f"{mme.url}/models", data=body, headers=JSON, timeout=60)
    assert_json_4xx(r)
    assert_unharmed(mme, pid, "/models/m/invoke")


def test_concurrent_unloads_of_one_model_do_not_crash_triton(mme):
    (pid,) = triton_pids(mme.marker)
    url = mme.root / "twin" / "model"
    shutil.copytree(TEST_MODELS / "addsub", url)
    r = requests.post(f"{mme.url}/models", json={"model_name": "twin", "url": str(url)}, timeout=120)
    assert r.status_code == 200, r.text
    with ThreadPoolExecutor(4) as pool:
        statuses = list(
            pool.map(lambda _: requests.delete(f"{mme.url}/models/twin", timeout=300).status_code, range(4))
        )
    assert sorted(statuses) == [200, 404, 404, 404]
    assert_unharmed(mme, pid, "/models/m/invoke")


def test_a_body_in_100000_tiny_chunks_is_answered_and_triton_survives(sme):
    (pid,) = triton_pids(sme.marker)
    host, port = sme.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=120)
    chunks = [VALID[i : i + 1] for i in range(len(VALID))]
    chunks += [b" "] * (100_000 - len(chunks))
    connection.putrequest("POST", "/invocations")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Transfer-Encoding", "chunked")
    connection.endheaders()
    for chunk in chunks:
        connection.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    connection.send(b"0\r\n\r\n")
    response = connection.getresponse()
    assert response.status == 200, response.read()[:200]
    connection.close()
    assert_unharmed(sme, pid, "/invocations")


@pytest.mark.parametrize(("inference_type", "model"), [("generate", "ident"), ("generate_stream", "tokens")])
def test_the_generate_apis_refuse_what_would_crash_triton(tmp_path, test_repository, inference_type, model):
    env = {"SAGEMAKER_TRITON_INFERENCE_TYPE": inference_type}
    server = start_serve(tmp_path, test_repository, model, env=env)
    try:
        (pid,) = triton_pids(server.marker)
        for body in (nested(200_000), b"[" * 200_000):
            r = requests.post(f"{server.url}/invocations", data=body, headers=JSON, timeout=120)
            assert_json_4xx(r)
        assert triton_pids(server.marker) == [pid], "Triton was restarted"
        assert requests.get(f"{server.url}/ping", timeout=10).status_code == 200
        valid = {"INPUT0": [1.5, 2.5]} if model == "ident" else {"N": 2}
        assert requests.post(f"{server.url}/invocations", json=valid, timeout=60).status_code == 200
    finally:
        server.stop()
