"""Large multi-record and CSV bodies (batch transform's mini-batches) on the real serve and Triton, one
worker: each is read and checked beside the event loop (``/ping``, asked every 20 ms on a connection of its
own meanwhile, answers within a second on these 2 cores) in memory bounded by the body, not by its records'
parsed values (the worker's peak resident memory is measured); every record is checked before the first
reaches Triton, so a record Triton could not read costs no Triton request, and a body that fails stops
sending; error lines are short, one a failed record; CSV values are read by one strict rule."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import requests

from tests.integration import harness
from tests.integration.conftest import start_serve
from tests.integration.harness import ServeProcess, wait_for, worker_pids
from tests.integration.test_batch_transform import JSON_LINES, record

pytestmark = pytest.mark.integration

SLOWEST_PING_S = 1.0  # on this 2-core machine, shared with Triton and the client


def _server(tmp_path_factory, repository: Path, failed_record: str):
    env = {
        "SAGEMAKER_BATCH": "true",
        "SAGEMAKER_MODEL_SERVER_WORKERS": "1",
        "SMTRITON_FAILED_RECORD": failed_record,
        "SAGEMAKER_TRITON_LOG_VERBOSE": "1",  # a line for each request Triton is sent: they are counted
    }
    return start_serve(tmp_path_factory.mktemp(failed_record), repository, "rows", env=env)


@pytest.fixture(scope="module")
def failing_server(tmp_path_factory, test_repository):
    """A record that fails fails the body (SMTRITON_FAILED_RECORD=fail, the default)."""
    server = _server(tmp_path_factory, test_repository, "fail")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def error_line_server(tmp_path_factory, test_repository):
    server = _server(tmp_path_factory, test_repository, "error-line")
    yield server
    server.stop()


def post(server: ServeProcess, body: bytes, content_type: str = JSON_LINES, timeout: float = 60) -> requests.Response:
    return requests.post(
        f"{server.url}/invocations", data=body, headers={"Content-Type": content_type}, timeout=timeout
    )


class Watch(harness.Watch):
    """The harness's watch, with a moment around the body for the pings to be under way."""

    def __enter__(self) -> Watch:
        super().__enter__()
        time.sleep(0.1)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.1)
        super().__exit__(*exc)

    def check(self, most_bytes: int) -> None:
        """The worker answered /ping throughout, within the bound, and grew less than ``most_bytes``."""
        assert worker_pids(self.server) == [self.worker], "the worker was replaced"
        assert len(self.pings) >= 5
        assert self.slowest < SLOWEST_PING_S, f"/ping took {self.slowest:.2f} s while the body was worked on"
        assert self.grew < most_bytes, f"the worker grew {self.grew >> 20} MiB"


def _records(count: int, seed: int = 3) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [record(rng.integers(0, 100, int(n)).astype(float).tolist()) for n in rng.integers(1, 5, count)]


def _triton_requests(server: ServeProcess) -> int:
    """The inference requests Triton was sent so far (its verbose log's line for each: its own metrics
    count none that it refused before its model saw them), once the log has them all."""
    counts = [-1]

    def settled() -> bool:
        counts.append(server.log_text().count("HTTP request: 2 /v2/models/rows/infer"))
        return counts[-1] == counts[-2]

    assert wait_for(settled, 30, interval=0.3)
    return counts[-1]


# ----- item: records off the loop, in bounded memory ---------------------------------------------------------
def test_a_body_of_many_records_is_read_beside_ping_in_memory_bounded_by_the_body(failing_server):
    lines = _records(30_000)
    body = b"\n".join(lines) + b"\n"  # ~2.5 MB
    with Watch(failing_server) as watch:
        r = post(failing_server, body, timeout=120)
    watch.check(most_bytes=40 * len(body))  # before: ~230 times the body (75,000 records: +1.3 GiB)
    assert r.status_code == 200, r.text[:300]
    answers = r.content.split(b"\n")
    assert len(answers) == len(lines) + 1
    for index in (0, 1, 17_777, len(lines) - 1):
        values = json.loads(lines[index])["inputs"][0]["data"]
        assert json.loads(answers[index])["outputs"][0]["data"] == [2 * v for v in values]


def test_a_million_empty_objects_fail_at_the_first_before_any_reaches_triton(failing_server):
    sent = _triton_requests(failing_server)
    with Watch(failing_server) as watch:
        r = post(failing_server, b"{}\n" * 1_000_000, timeout=120)
    watch.check(most_bytes=64 << 20)
    assert r.status_code == 400, r.text[:300]
    assert r.json()["error"].startswith("line 1 of 1000000: ")
    assert _triton_requests(failing_server) == sent


# ----- item: every record checked before the first reaches Triton ---------------------------------------------
def test_a_record_triton_could_not_read_fails_the_body_before_any_record_reaches_triton(failing_server):
    valid = _records(100)
    sent = _triton_requests(failing_server)
    for bad, error in [
        (b"{}", "line 101 of 101: the record has no 'inputs' array"),
        (b'{"inputs": [{"name": "NOPE", "shape": [1, 1], "datatype": "FP32", "data": [1]}]}',
         "line 101 of 101: unexpected inference input 'NOPE' for model 'rows'"),
        (b'{"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]}]}',
         "line 101 of 101: inference input 'INPUT0' data-type is 'INT32', but model 'rows' expects 'FP32'"),
        (b'{"inputs": [{"name": "INPUT0", "shape": [9, 1], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6, 7, 8, 9]}]}',
         "line 101 of 101: inference request batch-size must be <= 8 for 'rows'"),
        (b'{"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2]}]}',
         "line 101 of 101: input 'INPUT0': 2 values for its shape [1, 3] (3)"),
        (b'{"inputs": [{"name": "INPUT0", "shape": [1, 1], "datatype": "FP32", "data": ["1"]}]}',
         "line 101 of 101: input 'INPUT0': FP32 data must be numbers"),
    ]:  # fmt: skip
        r = post(failing_server, b"\n".join([*valid, bad]))
        assert (r.status_code, r.json()["error"]) == (400, error)
    assert _triton_requests(failing_server) == sent


def test_records_cost_triton_requests_by_their_batches_not_their_lines(error_line_server):
    valid = _records(80)
    lines = [line for pair in zip(valid, [b"{}"] * 80, strict=True) for line in pair]
    sent = _triton_requests(error_line_server)
    r = post(error_line_server, b"\n".join(lines))
    assert r.status_code == 200, r.text[:300]
    answers = [json.loads(line) for line in r.content.splitlines()]
    assert [("error" in answer) for answer in answers] == [False, True] * 80
    requests_made = _triton_requests(error_line_server) - sent
    lengths = [len(json.loads(line)["inputs"][0]["data"]) for line in valid]
    assert requests_made == sum(-(-lengths.count(n) // 8) for n in set(lengths))  # records merged, `{}` none


def test_a_record_the_model_refuses_stops_what_the_body_has_not_sent(failing_server):
    lines = _records(4_000)
    lines[9] = record([-999.0])
    sent = _triton_requests(failing_server)
    r = post(failing_server, b"\n".join(lines), timeout=120)
    assert (r.status_code, r.json()["error"]) == (500, "line 10 of 4000: the model refuses -999")
    # 500 Triton requests at least for all of them; what was sent before the refusal came back is a few windows
    assert _triton_requests(failing_server) - sent < 100


# ----- item: error lines that cost what they say -----------------------------------------------------------
def test_error_lines_are_short_one_a_failed_record_and_the_answer_bounded(error_line_server):
    body = b"[1]\n" * 100_000
    sent = _triton_requests(error_line_server)
    with Watch(error_line_server) as watch:
        r = post(error_line_server, body, timeout=120)
    watch.check(most_bytes=64 << 20)
    assert r.status_code == 200, r.text[:300]
    lines = r.content.split(b"\n")
    assert len(lines) == 100_001
    assert set(lines[:-1]) == {b'{"error":"the record is not a JSON object"}'}
    assert len(r.content) < 50 * 100_000  # before: 38.9 MB, ~390 bytes of help text in each line
    assert _triton_requests(error_line_server) == sent


def test_records_without_inputs_as_error_lines_cost_no_triton_request(error_line_server):
    body = b"".join(b'{"id":"%d"}\n' % i for i in range(200_000))  # each its own: none read the same as another
    sent = _triton_requests(error_line_server)
    with Watch(error_line_server) as watch:
        r = post(error_line_server, body, timeout=120)
    watch.check(most_bytes=64 << 20)
    assert r.status_code == 200, r.text[:300]
    lines = r.content.splitlines()
    assert len(lines) == 200_000
    assert set(lines) == {b'{"error":"the record has no \'inputs\' array"}'}
    assert _triton_requests(error_line_server) == sent  # before: a Triton request each


# ----- item: CSV values as numbers, one rule ------------------------------------------------------------------
def test_csv_rows_are_read_beside_ping_and_checked_before_any_reaches_triton(failing_server):
    rows = b"0.25,1.5,-3\n" * 400_000  # 4.8 MB
    sent = _triton_requests(failing_server)
    with Watch(failing_server) as watch:
        r = post(failing_server, rows + b"1,2,x\n", "text/csv", timeout=120)
    watch.check(most_bytes=64 << 20)
    assert (r.status_code, r.json()["error"]) == (
        400,
        "line 400001 of 400001: 'x' is not a value of FP32 (model input 'INPUT0'): write plain decimal numbers",
    )
    assert _triton_requests(failing_server) == sent


def test_a_body_of_many_csv_rows_is_answered_beside_ping_in_memory_bounded_by_the_body(failing_server):
    rows = np.arange(72_000, dtype=np.float32).reshape(24_000, 3) / 8
    body = "".join(f"{a},{b},{c}\n" for a, b, c in rows.tolist()).encode()
    with Watch(failing_server) as watch:
        r = post(failing_server, body, "text/csv", timeout=120)
    watch.check(most_bytes=40 * len(body))
    assert r.status_code == 200, r.text[:300]
    answers = r.content.splitlines()
    assert len(answers) == len(rows)
    for index in (0, 9_999, len(rows) - 1):
        a, b, c = rows[index].tolist()
        assert answers[index].decode() == f"{2 * a},{2 * b},{2 * c},{a + b + c}"


def test_a_csv_row_of_the_wrong_width_is_refused_before_it_is_split(failing_server):
    with Watch(failing_server) as watch:
        r = post(failing_server, b"1,2\n" + b"1," * 2_500_000 + b"1\n", "text/csv", timeout=120)
    watch.check(most_bytes=32 << 20)
    assert (r.status_code, r.json()["error"]) == (400, "line 2 of 2 has 2500001 values: line 1 has 2")


@pytest.mark.parametrize(
    ("row", "why"),
    [
        (b'1,"2"', "'\"2\"' is not a value of FP32 (model input 'INPUT0'): write plain decimal numbers, unquoted"),
        (b"1,nan", "'nan' is not a value of FP32 (model input 'INPUT0'): write plain decimal numbers"),
        (b"1,inf", "'inf' is not a value of FP32 (model input 'INPUT0'): write plain decimal numbers"),
        (b"1,1e39", "'1e39' is out of FP32's range (model input 'INPUT0')"),
        (b"1,1e309", "'1e309' is out of FP32's range (model input 'INPUT0')"),
        (b"1,2\x00", "'2\\x00' is not a value of FP32 (model input 'INPUT0'): write plain decimal numbers"),
        (b"1,1_0", "'1_0' is not a value of FP32 (model input 'INPUT0'): write plain decimal numbers, "
                   "without digit separators"),
    ],
)  # fmt: skip
def test_csv_values_are_plain_decimal_numbers_within_the_inputs_range(failing_server, row, why):
    r = post(failing_server, b"3,4\n" + row + b"\n", "text/csv")
    assert (r.status_code, r.json()["error"]) == (400, f"line 2 of 2: {why}")


def test_the_server_still_answers_a_small_body_after_the_large_ones(failing_server):
    r = post(failing_server, b"\n".join(_records(20)) + b"\n", JSON_LINES)
    assert r.status_code == 200
    assert requests.get(f"{failing_server.url}/ping", timeout=5).status_code == 200
