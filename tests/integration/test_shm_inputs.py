"""Large binary inputs through the worker's shared memory (smtriton/serve/triton/input_arena.py), on the
real Triton: the answer byte for byte what the HTTP body gives, the region registered with Triton and
gone from ``/dev/shm``, a new one after Triton restarts, and a client that names it refused."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.integration.conftest import start_serve
from tests.integration.harness import (
    ServeProcess,
    free_port,
    metric_samples,
    triton_key,
    triton_pids,
    triton_url,
    wait_for,
)

BINARY_JSON = "application/vnd.sagemaker-triton.binary+json;json-header-size={}"
ELEMENTS = 200_000  # 800 KB of FP32: between the arena's smallest and largest binary part


def binary_request(values: np.ndarray) -> tuple[bytes, str]:
    header = (
        b'{"inputs":[{"name":"INPUT0","shape":[%d],"datatype":"FP32","parameters":{"binary_data_size":%d}}],'
        b'"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]}' % (values.size, values.nbytes)
    )
    return header + values.tobytes(), BINARY_JSON.format(len(header))


def post(server: ServeProcess, body: bytes, content_type: str) -> requests.Response:
    return requests.post(f"{server.url}/invocations", data=body, headers={"Content-Type": content_type}, timeout=30)


def output_bytes(response: requests.Response) -> bytes:
    assert response.status_code == 200, response.text
    length = int(response.headers["Content-Type"].rsplit("=", 1)[1])
    return response.content[length:]


def through_shared_memory(server: ServeProcess) -> float:
    return metric_samples(server.metrics_url).get(("smtriton_shared_memory_requests_total", ()), 0.0)


def our_regions(server: ServeProcess) -> list[str]:
    status = requests.get(f"{triton_url(server)}/v2/systemsharedmemory/status", headers=triton_key(server), timeout=5)
    assert status.status_code == 200, status.text
    return [region["name"] for region in status.json() if region["name"].startswith("smtriton_inputs_")]


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory, test_repository: Path) -> Iterator[dict[str, ServeProcess]]:
    started: dict[str, ServeProcess] = {}
    try:
        started["shm"] = start_serve(
            tmp_path_factory.mktemp("shm"), test_repository, "ident", env={"SMTRITON_METRICS_PORT": str(free_port())}
        )
        started["body"] = start_serve(
            tmp_path_factory.mktemp("body"),
            test_repository,
            "ident",
            env={"SMTRITON_WORKER_SHM_INPUT_BYTES": "0"},
        )
        yield started
    finally:
        for server in started.values():
            server.stop()


def test_a_large_binary_input_goes_through_shared_memory_and_is_answered_as_through_the_body(servers):
    values = np.random.default_rng(0).standard_normal(ELEMENTS, dtype=np.float32)
    body, content_type = binary_request(values)
    shm, plain = servers["shm"], servers["body"]
    first = post(shm, body, content_type)
    assert output_bytes(first) == values.tobytes()  # went in the body while the arena was being made
    assert wait_for(lambda: our_regions(shm) != [], 10)
    before = through_shared_memory(shm)
    answers = [post(shm, body, content_type) for _ in range(3)]
    alone = post(plain, body, content_type)
    assert [output_bytes(answer) for answer in answers] == [values.tobytes()] * 3
    assert output_bytes(alone) == values.tobytes()
    assert [answer.headers["Content-Type"] for answer in answers] == [alone.headers["Content-Type"]] * 3
    assert through_shared_memory(shm) == before + 3  # each of the three through the region
    regions = our_regions(shm)
    assert len(regions) == 1  # one worker, one region
    assert not (Path("/dev/shm") / regions[0]).exists()  # mapped, and its name taken away
    assert our_regions(plain) == []


def test_a_large_json_part_with_keys_triton_does_not_read_goes_through_shared_memory_too(servers):
    """The JSON part that names the slot is written from the request's reading, which leaves out the keys
    Triton does not read (read by simdjson past 16 KiB)."""
    values = np.random.default_rng(2).standard_normal(ELEMENTS, dtype=np.float32)
    body, content_type = binary_request(values)
    shm = servers["shm"]
    post(shm, body, content_type)  # the arena is made on the first request that could use it
    assert wait_for(lambda: our_regions(shm) != [], 10)
    length = int(content_type.rsplit("=", 1)[1])
    header = body[: length - 1] + b',"comment":"' + b"c" * 20_000 + b'"}'
    body, content_type = header + body[length:], BINARY_JSON.format(len(header))
    before = through_shared_memory(shm)
    answer = post(shm, body, content_type)
    assert output_bytes(answer) == values.tobytes()
    assert through_shared_memory(shm) == before + 1
    assert output_bytes(post(servers["body"], body, content_type)) == values.tobytes()


def test_inputs_that_do_not_fill_the_body_exactly_go_in_the_body_with_tritons_own_error(servers):
    values = np.ones(ELEMENTS, np.float32)
    body, content_type = binary_request(values)
    shorter = body[:-4]  # the binary part says 800,000 bytes and 799,996 follow
    before = through_shared_memory(servers["shm"])
    answers = [post(server, shorter, content_type) for server in (servers["shm"], servers["body"])]
    assert through_shared_memory(servers["shm"]) == before
    assert answers[0].status_code == answers[1].status_code == 400
    assert answers[0].json() == answers[1].json()


def test_a_request_that_names_the_fronts_region_is_refused(servers):
    shm = servers["shm"]
    values = np.ones(ELEMENTS, np.float32)
    body, content_type = binary_request(values)
    post(shm, body, content_type)
    (region,) = our_regions(shm)
    for where in ("inputs", "outputs"):
        spec = {"name": "INPUT0" if where == "inputs" else "OUTPUT0"}
        parameters = {"shared_memory_region": region, "shared_memory_byte_size": 64}
        request = {"inputs": [{**spec, "shape": [16], "datatype": "FP32", "parameters": parameters}]}
        if where == "outputs":
            request = {
                "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}],
                "outputs": [{**spec, "parameters": parameters}],
            }
        answer = requests.post(f"{shm.url}/invocations", json=request, timeout=30)
        assert answer.status_code == 400
        assert "is not registered" in answer.json()["error"]


def test_a_new_triton_gets_a_new_region(tmp_path, test_repository):
    server = start_serve(tmp_path, test_repository, "ident")
    values = np.arange(ELEMENTS, dtype=np.float32)
    body, content_type = binary_request(values)
    try:
        post(server, body, content_type)
        assert wait_for(lambda: our_regions(server) != [], 10)
        (before,) = our_regions(server)
        (pid,) = triton_pids(server.marker)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while requests.get(f"{server.url}/ping", timeout=2).status_code == 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        server.wait_healthy(120)
        first = post(server, body, content_type)
        assert output_bytes(first) == values.tobytes()
        assert wait_for(lambda: our_regions(server) != [], 10)
        answers = [post(server, body, content_type) for _ in range(3)]
        assert [output_bytes(answer) for answer in answers] == [values.tobytes()] * 3
        (after,) = our_regions(server)
        assert after != before
    finally:
        server.stop()
