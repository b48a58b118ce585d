"""Batch transform as SageMaker runs it, on the real serve and Triton: what it asks (/execution-parameters)
and what it posts with SplitType=Line — MultiRecord mini-batches of JSON Lines (several lines in one
body, also sent as application/json) and of CSV rows, SingleRecord lines — answered one line a record, in
order, each what the record alone gets; a failing record named by its line, or written as an error line;
a body past MaxPayloadInMB refused with 413 naming the limit."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
import requests

from tests.integration.conftest import start_serve
from tests.integration.harness import free_port, metric_samples

pytestmark = pytest.mark.integration

JSON_LINES = "application/jsonlines"


def record(values: list[float]) -> bytes:
    """One line of a JSON Lines input file: a KServe v2 request of the rows model (a batch of one row)."""
    return json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1, len(values)], "datatype": "FP32", "data": values}]}
    ).encode()


@pytest.fixture(scope="module")
def batch_server(tmp_path_factory, test_repository):
    """serve as a batch transform job starts it: SAGEMAKER_BATCH=true and nothing else the job did not set."""
    env = {"SAGEMAKER_BATCH": "true", "SMTRITON_METRICS_PORT": str(free_port())}
    server = start_serve(tmp_path_factory.mktemp("batch"), test_repository, "rows", env=env)
    yield server
    server.stop()


def post(server, body: bytes, content_type: str | None = JSON_LINES, **headers: str) -> requests.Response:
    if content_type is not None:
        headers["Content-Type"] = content_type
    return requests.post(f"{server.url}/invocations", data=body, headers=headers, timeout=60)


def alone(server, line: bytes) -> dict:
    """What a record gets sent by itself (SingleRecord), as plain JSON."""
    r = post(server, line, "application/json")
    assert r.status_code == 200, r.text
    return r.json()


def test_a_job_without_a_strategy_gets_multi_record_and_the_payload_it_is_held_to(batch_server):
    r = requests.get(f"{batch_server.url}/execution-parameters", timeout=5)
    assert r.json() == {"MaxConcurrentTransforms": 1, "BatchStrategy": "MULTI_RECORD", "MaxPayloadInMB": 6}


@pytest.mark.parametrize("lengths", ["mixed", "equal"], ids=["lengths-differ", "all-can-merge"])
@pytest.mark.parametrize("content_type", [JSON_LINES, "application/x-ndjson", "application/json", None])
def test_a_multi_record_mini_batch_is_answered_a_line_a_record_in_order(batch_server, lengths, content_type):
    rng = np.random.default_rng(7)
    sizes = rng.integers(1, 9, 40) if lengths == "mixed" else np.full(40, 4)
    lines = [record(rng.normal(size=int(n)).round(3).tolist()) for n in sizes]
    body = b"\n".join(lines) + b"\n"  # as SageMaker packs whole lines of a file
    r = post(batch_server, body, content_type)
    assert r.status_code == 200, r.text[:500]
    assert r.headers["content-type"] == JSON_LINES
    answers = r.text.split("\n")
    assert answers[-1] == ""  # every line ended by a newline, none more
    assert len(answers) == len(lines) + 1
    for line, answer in zip(lines, answers, strict=False):
        got = json.loads(answer)
        assert got == alone(batch_server, line)
        values = json.loads(line)["inputs"][0]["data"]
        outputs = {o["name"]: o["data"] for o in got["outputs"]}
        assert outputs["OUTPUT0"] == pytest.approx([2 * v for v in values])


def triton_counts(server) -> tuple[float, float]:
    """Triton's own count of the rows model's requests and of the rows (inferences) in them."""
    samples = metric_samples(server.metrics_url)

    def total(name: str) -> float:
        return sum(v for (n, labels), v in samples.items() if n == name and ("model", "rows") in labels)

    return total("nv_inference_request_success_total"), total("nv_inference_count_total")


@pytest.mark.parametrize("lengths", [[4] * 40, [1, 2, 2, 3, 1, 3, 3, 2] * 5], ids=["all-can-merge", "lengths-differ"])
def test_records_that_agree_reach_triton_merged_as_max_batch_size_allows(batch_server, lengths):
    requests_before, rows_before = triton_counts(batch_server)
    r = post(batch_server, b"\n".join(record([float(i)] * n) for i, n in enumerate(lengths)))
    assert r.status_code == 200, r.text[:300]
    assert [json.loads(line)["outputs"][1]["data"] for line in r.text.splitlines()] == [
        [float(i * n)] for i, n in enumerate(lengths)
    ]
    requests_after, rows_after = triton_counts(batch_server)
    assert rows_after - rows_before == len(lengths)
    # one Triton request per 8 records (max_batch_size) of one length: 5, or 2 + 2 + 2 of lengths 1, 2, 3
    assert requests_after - requests_before == sum(math.ceil(n / 8) for n in Counter(lengths).values())


def test_single_record_sends_a_line_a_request_and_gets_a_line(batch_server):
    line = record([1.0, 2.0])
    r = post(batch_server, line + b"\n")
    assert r.status_code == 200
    assert r.text.endswith("\n")
    assert json.loads(r.text) == alone(batch_server, line)


def test_a_failing_record_fails_the_mini_batch_naming_its_line(batch_server):
    lines = [record([1.0]), record([2.0, 3.0]), record([-999.0]), b'{"inputs": [{"name": "NOPE"}]}']
    r = post(batch_server, b"\n".join(lines))
    assert r.status_code == 400, r.text  # every record is checked before the first reaches Triton
    assert r.json() == {"error": "line 4 of 4: input 'NOPE' has no 'datatype'"}
    r = post(batch_server, b"\n".join([*lines[:3], record([4.0])]))
    assert r.status_code == 500, r.text
    assert r.json() == {"error": "line 3 of 4: the model refuses -999"}
    r = post(batch_server, b"\n".join([lines[0], lines[3], lines[2]]))
    assert r.status_code == 400
    assert r.json()["error"].startswith("line 2 of 3: ")
    assert requests.get(f"{batch_server.url}/ping", timeout=5).status_code == 200


def test_csv_rows_are_one_tensor_split_by_max_batch_size_and_answer_a_line_a_row(batch_server):
    rows = np.arange(60, dtype=np.float32).reshape(20, 3) / 4  # 20 rows: three Triton requests of at most 8
    body = "".join(",".join(str(v) for v in row) + "\n" for row in rows).encode()
    r = post(batch_server, body, "text/csv")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "text/csv"
    got = np.array([[float(v) for v in line.split(",")] for line in r.text.splitlines()])
    expected = np.concatenate([rows * 2, rows.sum(axis=1, keepdims=True)], axis=1)  # OUTPUT0, then TOTAL
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    r = post(batch_server, body, "text/csv", Accept=JSON_LINES)
    assert r.headers["content-type"] == JSON_LINES
    first = json.loads(r.text.splitlines()[0])
    assert first["model_name"] == "rows"
    assert first["outputs"][0] == {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 3], "data": [0.0, 0.5, 1.0]}
    assert first["outputs"][1] == {"name": "TOTAL", "datatype": "FP32", "shape": [1, 1], "data": [0.75]}


def test_csv_errors_name_the_line_and_a_model_that_cannot_take_csv_is_415(batch_server, addsub_server):
    r = post(batch_server, b"1,2\n3\n", "text/csv")
    assert (r.status_code, r.json()["error"]) == (400, "line 2 of 2 has 1 values: line 1 has 2")
    r = post(addsub_server, b"1,2,3\n4,5,6\n", "text/csv")
    assert r.status_code == 415
    assert r.json()["error"].startswith(
        "model 'addsub' does not take text/csv: that needs exactly one numeric input of shape [batch, n] "
        "(max_batch_size > 0), a row a line, and it takes INPUT0 (INT32 [-1, 16]), INPUT1 (INT32 [-1, 16])"
    )


def test_csv_values_are_plain_decimal_numbers_after_an_excel_byte_order_mark(batch_server):
    r = post(batch_server, b"\xef\xbb\xbf1,2\r\n3,4\r\n", "text/csv")  # Excel's "CSV UTF-8" export
    assert r.status_code == 200, r.text
    assert r.text.splitlines() == ["2.0,4.0,3.0", "6.0,8.0,7.0"]
    r = post(batch_server, b"1,2\n1_000,4\n", "text/csv")
    assert (r.status_code, r.json()["error"]) == (
        400,
        "line 2 of 2: '1_000' is not a value of FP32 (model input 'INPUT0'): write plain decimal numbers, "
        "without digit separators",
    )


def test_a_body_past_max_payload_in_mb_is_413_naming_the_limit(batch_server):
    line = record([0.5] * 1000)
    body = b"\n".join([line] * (7 * 1024 * 1024 // len(line)))  # 7 MB: SageMaker would never send it
    r = post(batch_server, body)
    assert r.status_code == 413
    assert r.json()["error"] == (
        "request body is larger than the limit of 6291456 bytes: batch transform's MaxPayloadInMB of 6 MB "
        "(SageMaker's default, which /execution-parameters answers); send smaller mini-batches"
    )


def test_error_lines_keep_each_record_in_its_place(tmp_path, test_repository):
    env = {"SAGEMAKER_BATCH": "true", "SAGEMAKER_MAX_PAYLOAD_IN_MB": "1", "SMTRITON_FAILED_RECORD": "error-line"}
    server = start_serve(tmp_path, test_repository, "rows", env=env)
    try:
        lines = [record([1.0]), record([-999.0]), b"{broken", record([4.0, 5.0])]
        r = post(server, b"\n".join(lines) + b"\n", "application/json")
        assert r.status_code == 200, r.text
        answers = [json.loads(a) for a in r.text.splitlines()]
        assert answers[1] == {"error": "the model refuses -999"}
        assert answers[2]["error"].startswith("failed to parse the request JSON buffer")
        assert [a["outputs"][0]["data"] for a in (answers[0], answers[3])] == [[2.0], [8.0, 10.0]]
        r = post(server, b"1,2\n-999,1\n", "text/csv")
        assert r.text.splitlines() == ['{"error":"the model refuses -999 (lines 1-2 went to Triton together)"}'] * 2
        line = record([1.0])
        r = post(server, b"\n".join([line] * (1536 * 1024 // len(line))))  # 1.5 MB
        assert r.status_code == 413
        assert "MaxPayloadInMB of 1 MB (SAGEMAKER_MAX_PAYLOAD_IN_MB=1, the job's)" in r.json()["error"]
    finally:
        server.stop()
