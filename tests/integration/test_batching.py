"""Requests merged along the batch dimension, on the real Triton: every client gets the answer Triton
gives its request alone. Generated requests (every datatype, JSON and binary data, outputs asked for
in JSON or binary, ids, wrong rows) are merged as serve merges them and sent to Triton, and each part of
the split answer is compared, byte for byte, with Triton's answer to that part alone; then serve
itself, with clients at once, merging what waits and answering an error in a merged request as each
client's own. A Python model that pads each request to its longest text is never merged (it does not
declare its rows its own), and an ONNX model is, each client's answer what it gets alone. A model whose
rows take long to execute stops merging once Triton's statistics say so, while a fast one merges on."""

from __future__ import annotations

import json
import shutil
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import requests
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from smtriton.serve.dataplane.batching import mergeable, merging, row_time, rule
from smtriton.serve.dataplane.reading.inference import read
from smtriton.serve.triton.client import UpstreamResponse
from tests.integration.conftest import start_serve
from tests.integration.harness import ServeProcess, free_port, metric_samples, triton_key, triton_url, wait_for

MODELS = Path(__file__).parent / "models_batching"
HEADER_LENGTH = "Inference-Header-Content-Length"
BINARY_JSON = "application/vnd.sagemaker-triton.binary+json;json-header-size="
OUTPUTS = ("F2", "FSUM", "I2", "S2", "B2")
TRITON = requests.Session()  # to Triton directly: keep-alive


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """serve in front of the `rows` model, one worker keeping one request in flight before it merges (the
    tests make its executions long so that requests queue: it merges whatever its time per row)."""
    env = {
        "SAGEMAKER_MODEL_SERVER_WORKERS": "1",
        "SMTRITON_MERGE_IN_FLIGHT": "1",
        "SMTRITON_MERGE_MAX_ROW_MS": "0",
        "SMTRITON_METRICS_PORT": str(free_port()),
    }
    started = start_serve(tmp_path_factory.mktemp("batching"), MODELS, "rows", env=env)
    try:
        yield started
    finally:
        started.stop()


# ----- requests -------------------------------------------------------------------------------------------
class Tensor:
    """One input of a request: its rows, and whether it travels binary."""

    def __init__(self, name: str, datatype: str, rows: list[list[Any]], binary: bool, text: list[str] | None = None):
        self.name, self.datatype, self.rows, self.binary = name, datatype, rows, binary
        self.text = text  # FP32 only: how each number is written in JSON

    def shape(self) -> list[int]:
        return [len(self.rows), len(self.rows[0])]

    def raw(self) -> bytes:
        flat = [value for row in self.rows for value in row]
        if self.datatype == "BYTES":
            return b"".join(struct.pack("<I", len(v)) + v for v in flat)
        dtype = {"FP32": np.float32, "INT64": np.int64, "BOOL": np.bool_}[self.datatype]
        return np.array(flat, dtype=dtype).tobytes()

    def json_data(self, nested: bool) -> bytes:
        if self.datatype == "FP32" and self.text is not None:
            items = list(self.text)
        elif self.datatype == "BYTES":
            items = [orjson.dumps(v.decode()).decode() for row in self.rows for v in row]
        else:
            items = [orjson.dumps(v).decode() for row in self.rows for v in row]
        if not nested:
            return ("[" + ",".join(items) + "]").encode()
        width = len(self.rows[0])
        rows = [items[r * width : (r + 1) * width] for r in range(len(self.rows))]
        return ("[" + ", ".join("[" + ",".join(row) + "]" for row in rows) + "]").encode()


def body_of(tensors: list[Tensor], binary: bool, nested: bool, **extra: Any) -> tuple[bytes, int | None]:
    """A KServe v2 request (JSON, or binary+json), and its JSON part's length (None: JSON)."""
    inputs, chunks, texts = [], [], {}
    marker = uuid.uuid4().hex
    for index, tensor in enumerate(tensors):
        spec: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": tensor.shape()}
        if binary and tensor.binary:
            raw = tensor.raw()
            spec["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            spec["data"] = f"{marker}{index}"
            texts[f'"{marker}{index}"'.encode()] = tensor.json_data(nested)
        inputs.append(spec)
    head = orjson.dumps({**extra, "inputs": inputs})
    for placeholder, text in texts.items():
        head = head.replace(placeholder, text)
    if not binary:
        return head, None
    return head + b"".join(chunks), len(head)


def float_text(value: float, style: int) -> str:
    """One FP32 number as clients write them: shortest, nine digits, exponent, many decimals."""
    if style == 0:
        return repr(value)
    if style == 1:
        return f"{value:.9g}"
    if style == 2:
        return f"{value:.17e}"
    return f"{value:.30f}" if abs(value) < 1e6 else repr(value)


@st.composite
def templates(draw: st.DrawFn) -> dict[str, Any]:
    """What requests that may merge share: width, encodings, outputs asked for, parameters."""
    binary = draw(st.booleans())
    outputs = None
    if draw(st.booleans()):
        names = draw(st.lists(st.sampled_from(OUTPUTS), min_size=1, max_size=5, unique=True))
        outputs = [
            {
                "name": n,
                **(
                    {"parameters": {"binary_data": b}}
                    if (b := draw(st.sampled_from([None, True, False]))) is not None
                    else {}
                ),
            }
            for n in names
        ]
    return {
        "binary": binary,
        "width": draw(st.sampled_from([1, 3])),
        "encodings": draw(st.lists(st.booleans(), min_size=4, max_size=4)),  # per input: binary (in binary requests)
        "nested": draw(st.booleans()),
        "outputs": outputs,
        "parameters": draw(st.sampled_from([None, {"binary_data_output": True}, {"note": "same"}])),
    }


@st.composite
def requests_of(draw: st.DrawFn, template: dict[str, Any]) -> tuple[bytes, int | None]:
    rows, width, binary = draw(st.integers(1, 3)), template["width"], template["binary"]
    in_binary = binary and template["encodings"][0]  # JSON has no NaN or Infinity (the front refuses them)
    floats = st.floats(width=32, allow_nan=in_binary, allow_infinity=in_binary)
    f = [[draw(floats) for _ in range(width)] for _ in range(rows)]
    f_text = [float_text(v, draw(st.integers(0, 3))) for row in f for v in row]
    ints = st.one_of(st.integers(-(2**62), 2**62), st.integers(0, 20))  # 13 fails the request
    text = st.text(st.characters(exclude_categories=("Cs",)), max_size=5).map(str.encode)
    strings = st.binary(max_size=6) if binary and template["encodings"][2] else text
    tensors = [
        Tensor("F", "FP32", f, template["encodings"][0], f_text),
        Tensor("I", "INT64", [[draw(ints), draw(ints)] for _ in range(rows)], template["encodings"][1]),
        Tensor("S", "BYTES", [[draw(strings)] for _ in range(rows)], template["encodings"][2]),
        Tensor("B", "BOOL", [[draw(st.booleans())] for _ in range(rows)], template["encodings"][3]),
    ]
    extra: dict[str, Any] = {}
    request_id = draw(st.sampled_from([None, "", "client-a", "ç-b"]))
    if request_id is not None:
        extra["id"] = request_id
    if template["outputs"] is not None:
        extra["outputs"] = template["outputs"]
    if template["parameters"] is not None:
        extra["parameters"] = template["parameters"]
    return body_of(tensors, binary, template["nested"], **extra)


@st.composite
def batches(draw: st.DrawFn) -> list[tuple[bytes, int | None]]:
    shared = draw(st.lists(templates(), min_size=1, max_size=2))
    return [draw(requests_of(draw(st.sampled_from(shared)))) for _ in range(draw(st.integers(2, 5)))]


# ----- answers --------------------------------------------------------------------------------------------
def post_to_triton(url: str, body: bytes, header_length: int | None) -> UpstreamResponse:
    headers = {"Accept-Encoding": "identity", "Content-Type": "application/json"}
    if header_length is not None:
        headers = {"Accept-Encoding": "identity", "Content-Type": "application/octet-stream"}
        headers[HEADER_LENGTH] = str(header_length)
    answer = TRITON.post(f"{url}/v2/models/rows/infer", data=body, headers=headers, timeout=30)
    length = answer.headers.get(HEADER_LENGTH)
    return UpstreamResponse(answer.status_code, "", int(length) if length else None, answer.content)


def check_merged_against_alone(url: str, bodies: list[tuple[bytes, int | None]], model: rule.ModelBatching) -> int:
    """Merge ``bodies`` as serve does, send each group to Triton, and compare every part of the split
    answer with Triton's answer to the part alone; the number of requests that went merged."""
    alone = [post_to_triton(url, body, length) for body, length in bodies]
    parts = [mergeable.part(read(body, length), model) for body, length in bodies]
    merged_requests = 0
    for group in merging.groups(parts, model.max_batch_size):
        if len(group) < 2:
            continue
        merged = merging.merge([part for index in group if (part := parts[index]) is not None])
        answers = merged.split(post_to_triton(url, merged.inference.body, merged.inference.header_length), model)
        if any(alone[index].status != 200 for index in group):
            assert answers is None  # sent again alone: each gets the answer above, its own error included
            continue
        assert answers is not None
        merged_requests += len(group)
        for index, answer in zip(group, answers, strict=True):
            assert answer.body == alone[index].body  # Triton's own text and bytes
            assert answer.header_length == alone[index].header_length
    return merged_requests


@pytest.fixture(scope="module")
def rows_model(server: ServeProcess) -> rule.ModelBatching:
    url = f"{triton_url(server)}/v2/models/rows/config"
    config = requests.get(url, headers=triton_key(server), timeout=10).json()
    model = rule.model_batching(config)
    assert (model.max_batch_size, model.instances) == (8, 1)
    assert model.outputs == (("F2", (-1,)), ("FSUM", (1,)), ("I2", (2,)), ("S2", (1,)), ("B2", (1,)))
    return model


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bodies=batches())
def test_merged_requests_get_what_triton_gives_each_alone(server, rows_model, bodies):
    merged = check_merged_against_alone(triton_url(server), bodies, rows_model)
    event(f"{'some' if merged else 'none'} merged")


def test_requests_of_every_datatype_and_encoding_merge_and_match_alone(server, rows_model):
    def request(seed: int, binary: bool, **extra: Any) -> tuple[bytes, int | None]:
        tensors = [
            Tensor("F", "FP32", [[0.1 * seed, -2.5e-7], [1e30, 3.0]], True, ["0.1", "-2.5E-7", "1e30", "3"]),
            Tensor("I", "INT64", [[seed, -(2**62)], [2**62, 0]], False),
            Tensor("S", "BYTES", [['é,"]'.encode()], [b""]], True),
            Tensor("B", "BOOL", [[True], [False]], False),
        ]
        return body_of(tensors, binary, nested=seed % 2 == 0, **extra)

    json_outputs = [{"name": n} for n in OUTPUTS]
    binary_outputs = [{"name": n, "parameters": {"binary_data": True}} for n in OUTPUTS]
    for binary in (False, True):
        for outputs in (json_outputs, binary_outputs):
            bodies = [request(seed, binary, id=f"r{seed}", outputs=outputs) for seed in range(3)]
            assert check_merged_against_alone(triton_url(server), bodies, rows_model) == 3


# ----- through serve ---------------------------------------------------------------------------------------
def rows_request(value: int, **extra: Any) -> bytes:
    tensors = [
        Tensor("F", "FP32", [[float(value)]], False, [str(value)]),
        Tensor("I", "INT64", [[value, 1]], False),
        Tensor("S", "BYTES", [[str(value).encode()]], False),
        Tensor("B", "BOOL", [[value % 2 == 0]], False),
    ]
    return body_of(tensors, binary=False, nested=False, **extra)[0]


def invoke(server: ServeProcess, body: bytes) -> requests.Response:
    return requests.post(
        f"{server.url}/invocations", data=body, headers={"Content-Type": "application/json"}, timeout=60
    )


def triton_stats(server: ServeProcess) -> tuple[int, int]:
    """Triton's count of requests and of executions of `rows` so far."""
    stats = requests.get(f"{triton_url(server)}/v2/models/rows/stats", timeout=10).json()["model_stats"][0]
    return stats["inference_stats"]["success"]["count"], stats["execution_count"]


def merged_so_far(server: ServeProcess) -> tuple[float, float]:
    samples = metric_samples(server.metrics_url)
    return samples.get(("smtriton_merges_total", ()), 0.0), samples.get(("smtriton_unmerged_again_total", ()), 0.0)


def at_once(server: ServeProcess, bodies: list[bytes], post=invoke) -> list[requests.Response]:
    """Every body posted by its own client (``post(server, body)``), all at the same moment."""
    answers: list[requests.Response | None] = [None] * len(bodies)
    start = threading.Barrier(len(bodies))

    def client(index: int) -> None:
        start.wait()
        answers[index] = post(server, bodies[index])

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert all(answer is not None for answer in answers)
    return answers  # type: ignore[return-value]


def test_a_request_alone_goes_alone_and_clients_at_once_are_merged_each_answered_as_alone(server):
    bodies = [rows_request(v, parameters={"delay_ms": 20}) for v in range(24)]
    expected = [post_to_triton(triton_url(server), body, None) for body in bodies]
    for _ in range(3):  # serve learns the model's configuration on its first requests
        assert invoke(server, rows_request(0)).status_code == 200
    time.sleep(0.2)
    requests_before, merges_before = triton_stats(server)[0], merged_so_far(server)[0]
    for value in range(5):  # one client, one request at a time: each goes to Triton alone
        assert invoke(server, rows_request(value)).status_code == 200
    assert triton_stats(server)[0] - requests_before == 5
    assert merged_so_far(server)[0] == merges_before

    requests_before = triton_stats(server)[0]
    answers = at_once(server, bodies)
    for answer, alone in zip(answers, expected, strict=True):  # 13's is an error, the same as alone
        assert (answer.status_code, json.loads(answer.content)) == (alone.status, json.loads(alone.body))
    sent = triton_stats(server)[0] - requests_before
    assert sent < 24, f"{sent} Triton requests for 24 clients: nothing was merged"
    assert merged_so_far(server)[0] > merges_before


def test_an_error_in_a_merged_request_is_answered_to_each_client_as_its_own(server):
    for _ in range(3):
        assert invoke(server, rows_request(0)).status_code == 200
    time.sleep(0.2)
    retried_before = merged_so_far(server)[1]
    slow = threading.Thread(target=invoke, args=(server, rows_request(1, parameters={"delay_ms": 400})))
    slow.start()  # in flight: the next ones wait, and go merged when it is back
    in_flight = ("smtriton_inflight_requests", (("route", "invocations"),))
    assert wait_for(lambda: metric_samples(server.metrics_url).get(in_flight) == 1, 10)
    try:
        answers = at_once(server, [rows_request(v) for v in (2, 13, 4, 6)])
    finally:
        slow.join(60)
    assert [a.status_code for a in answers] == [200, 500, 200, 200]
    assert answers[1].json() == {"error": "13 in row [0] of a request of 1 rows"}  # its own, as alone
    for value, answer in zip((2, 4, 6), (answers[0], answers[2], answers[3]), strict=True):
        assert answer.json()["outputs"][2]["data"] == [2 * value + 1, 3]
    assert merged_so_far(server)[1] > retried_before  # the merged request failed and was sent again


# ----- only what cannot change an answer is merged ---------------------------------------------------------
def _server_of(tmp: Path, repository: Path, model: str) -> ServeProcess:
    env = {
        "SAGEMAKER_MODEL_SERVER_WORKERS": "1",
        "SMTRITON_MERGE_IN_FLIGHT": "1",
        "SMTRITON_METRICS_PORT": str(free_port()),
    }
    return start_serve(tmp, repository, model, env=env)


@pytest.fixture(scope="module")
def pad_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    started = _server_of(tmp_path_factory.mktemp("pad"), MODELS, "pad")
    try:
        yield started
    finally:
        started.stop()


def text_request(text: str) -> bytes:
    return orjson.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": [text]}]})


def test_a_python_model_that_pads_to_its_request_is_never_merged_and_answers_as_alone(pad_server):
    texts = [" ".join(["w" * (1 + n % 5)] * (1 + 3 * n)) for n in range(16)]  # 1 word to 46 words
    bodies = [text_request(text) for text in texts]
    bodies[7] = bodies[7].replace(b'"BYTES"', b'"INT32"')  # one member Triton refuses: its failure is its own
    alone = [(answer.status_code, answer.content) for answer in (invoke(pad_server, body) for body in bodies)]
    assert orjson.loads(alone[0][1])["outputs"][0]["shape"] == [1, 1]
    assert alone[7][0] == 400
    assert [status for status, _ in alone].count(200) == 15
    merges_before = merged_so_far(pad_server)[0]
    for _ in range(5):  # 16 clients at once, behind a 20-ms execution: merged, 1 word would become [1, 46]
        answers = at_once(pad_server, bodies)
        assert [(answer.status_code, answer.content) for answer in answers] == alone
    assert merged_so_far(pad_server)[0] == merges_before


DENSE_CONFIG = """name: "dense"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [{ name: "X", data_type: TYPE_FP32, dims: [4] }, { name: "IDS", data_type: TYPE_INT64, dims: [2] }]
output [{ name: "Y", data_type: TYPE_FP32, dims: [3] }, { name: "IDS2", data_type: TYPE_INT64, dims: [2] }]
instance_group [{ kind: KIND_CPU, count: 1 }]
dynamic_batching {}
"""


def _dense_onnx(path: Path) -> None:
    """Y = tanh(X W + b) with seeded weights, and IDS2 = IDS * 2: each row computed from its own row."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    weights = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W")
    bias = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "B")
    two = numpy_helper.from_array(np.array(2, dtype=np.int64), "TWO")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["X", "W"], ["XW"]),
            helper.make_node("Add", ["XW", "B"], ["Z"]),
            helper.make_node("Tanh", ["Z"], ["Y"]),
            helper.make_node("Mul", ["IDS", "TWO"], ["IDS2"]),
        ],
        "dense",
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("IDS", TensorProto.INT64, ["batch", 2]),
        ],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 3]),
            helper.make_tensor_value_info("IDS2", TensorProto.INT64, ["batch", 2]),
        ],
        [weights, bias, two],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)


@pytest.fixture(scope="module")
def dense_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    repository = tmp_path_factory.mktemp("dense_repository")
    (repository / "dense" / "1").mkdir(parents=True)
    (repository / "dense" / "config.pbtxt").write_text(DENSE_CONFIG)
    _dense_onnx(repository / "dense" / "1" / "model.onnx")
    started = _server_of(tmp_path_factory.mktemp("dense"), repository, "dense")
    try:
        yield started
    finally:
        started.stop()


def test_an_onnx_model_is_merged_and_each_client_gets_its_answer_alone(dense_server):
    rng = np.random.default_rng(3)
    bodies = []
    for n in range(16):
        rows = 1 + n % 3
        x = rng.standard_normal((rows, 4)).astype(np.float32)
        inputs = [
            {"name": "X", "datatype": "FP32", "shape": [rows, 4], "data": x.ravel().tolist()},
            {"name": "IDS", "datatype": "INT64", "shape": [rows, 2], "data": list(range(n, n + 2 * rows))},
        ]
        bodies.append(orjson.dumps({"id": f"c{n}", "inputs": inputs}))
    alone = [invoke(dense_server, body).json() for body in bodies]
    merges_before = merged_so_far(dense_server)[0]
    for _ in range(5):
        for answer, expected in zip(at_once(dense_server, bodies), alone, strict=True):
            got = answer.json()
            assert got["id"] == expected["id"]
            y, expected_y = got["outputs"][0], expected["outputs"][0]
            assert (y["name"], y["shape"]) == (expected_y["name"], expected_y["shape"])
            # floats as Triton's own batching computes them: a batch may round the last bit otherwise
            np.testing.assert_allclose(y["data"], expected_y["data"], rtol=1e-6, atol=1e-7)
            assert got["outputs"][1] == expected["outputs"][1]  # integers exactly
    assert merged_so_far(dense_server)[0] > merges_before, "nothing was merged"


# ----- only while merging pays ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mme_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    """A multi-model serve with `long` (5 ms of execution a row) and `rows` loaded, one worker keeping one
    request of each in flight before it merges, and the default bound on the time per row."""
    tmp = tmp_path_factory.mktemp("paying")
    root = tmp / "models"
    for name, model in (("long", "long_rows"), ("rows", "rows")):
        shutil.copytree(MODELS / model, root / name / "model", ignore=shutil.ignore_patterns("__pycache__"))
    env = {
        "SAGEMAKER_MODEL_SERVER_WORKERS": "1",
        "SMTRITON_MERGE_IN_FLIGHT": "1",
        "SMTRITON_METRICS_PORT": str(free_port()),
    }
    started = start_serve(tmp, None, None, env=env, args=["--multi-model", "--model-root", str(root)])
    try:
        for name in ("long", "rows"):
            load = {"model_name": name, "url": str(root / name / "model")}
            assert requests.post(f"{started.url}/models", json=load, timeout=120).status_code == 200
        yield started
    finally:
        started.stop()


def post_to(name: str):
    def post(server: ServeProcess, body: bytes) -> requests.Response:
        headers = {"Content-Type": "application/json"}
        return requests.post(f"{server.url}/models/{name}/invoke", data=body, headers=headers, timeout=60)

    return post


def requests_to(server: ServeProcess, triton_name: str) -> int:
    """Triton's count of the requests `triton_name` answered so far."""
    stats = requests.get(f"{triton_url(server)}/v2/models/{triton_name}/stats", timeout=10).json()
    return sum(version["inference_stats"]["success"]["count"] for version in stats["model_stats"])


def stopped_so_far(server: ServeProcess) -> float:
    return metric_samples(server.metrics_url).get(("smtriton_merging_stopped_total", ()), 0.0)


def long_request(value: int) -> bytes:
    return orjson.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [value]}]})


def four_rows_request(value: int) -> bytes:
    """4 rows of `rows`, executed in 4 ms: 1 ms a row alone, less merged."""
    tensors = [
        Tensor("F", "FP32", [[float(value + r)] for r in range(4)], False, [str(value + r) for r in range(4)]),
        Tensor("I", "INT64", [[value + r, 1] for r in range(4)], False),
        Tensor("S", "BYTES", [[str(value + r).encode()] for r in range(4)], False),
        Tensor("B", "BOOL", [[r % 2 == 0] for r in range(4)], False),
    ]
    return body_of(tensors, binary=False, nested=False, parameters={"delay_ms": 4})[0]


def test_a_model_whose_rows_execute_long_stops_merging_once_triton_says_so_and_a_fast_one_merges_on(mme_server):
    server = mme_server
    long, fast = post_to("long"), post_to("rows")
    for _ in range(3):  # the first request asks for the model's configuration; the next opens its lane and
        assert long(server, long_request(1)).status_code == 200  # takes the first reading of its statistics
        assert fast(server, four_rows_request(1)).status_code == 200
    opened = time.monotonic()
    merges_before = merged_so_far(server)[0]
    bodies = [long_request(value) for value in range(8)]
    while stopped_so_far(server) == 0 and time.monotonic() < opened + row_time.READ_EVERY_S + 5:
        for answer, value in zip(at_once(server, bodies, long), range(8), strict=True):
            assert answer.json()["outputs"][0]["data"] == [2.0 * value]
    assert stopped_so_far(server) == 1, "no reading of Triton's statistics stopped merging `long`"
    assert merged_so_far(server)[0] > merges_before, "`long` was never merged before the reading"

    merges_before, sent_before = merged_so_far(server)[0], requests_to(server, "long")
    for _ in range(3):  # each request goes to Triton at once, alone, however many are in flight
        assert all(answer.status_code == 200 for answer in at_once(server, bodies, long))
    assert requests_to(server, "long") - sent_before == 24
    assert merged_so_far(server)[0] == merges_before

    sent_before = requests_to(server, "rows")
    for n, answer in enumerate(at_once(server, [four_rows_request(20 + 10 * n) for n in range(12)], fast)):
        assert answer.json()["outputs"][2]["data"] == [
            value for r in range(4) for value in (2 * (20 + 10 * n + r) + 1, 3)
        ]
    assert requests_to(server, "rows") - sent_before < 12, "`rows` was not merged"
    assert merged_so_far(server)[0] > merges_before
    assert stopped_so_far(server) == 1
