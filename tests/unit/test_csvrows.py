"""text/csv bodies: which models take them (and the 415 of the others, saying what they take), rows read
into one tensor split by max_batch_size, and Triton's answers as one line a row, CSV or JSON lines."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import orjson
import pytest

from smtriton.serve.dataplane.answers import to_sagemaker
from smtriton.serve.dataplane.records import csv_values, csvrows
from smtriton.serve.dataplane.records.csvrows import CsvInput
from smtriton.serve.dataplane.records.record_answers import Failure, RecordFailed
from smtriton.serve.errors import BadRequest, NotReady, PayloadTooLarge, UnsupportedMediaType
from smtriton.serve.host import cgroups
from smtriton.serve.triton.client import UpstreamResponse
from tests.unit.loop_gaps import gaps_while

ROWS = CsvInput("INPUT0", "FP32", None, 2)


def config(max_batch_size: int, *inputs: tuple[str, str, list[int | str]]) -> dict[str, object]:
    return {
        "max_batch_size": max_batch_size,
        "input": [{"name": name, "data_type": f"TYPE_{dtype}", "dims": dims} for name, dtype, dims in inputs],
    }


def test_a_model_of_one_numeric_batched_row_input_takes_csv():
    assert csvrows.csv_input("m", config(8, ("x", "FP32", ["-1"]))) == CsvInput("x", "FP32", None, 8)
    assert csvrows.csv_input("m", config(4, ("x", "INT64", [13]))) == CsvInput("x", "INT64", 13, 4)


@pytest.mark.parametrize(
    ("model_config", "takes"),
    [
        (config(8, ("a", "INT32", [16]), ("b", "INT32", [16])), "a (INT32 [-1, 16]), b (INT32 [-1, 16])"),
        (config(0, ("x", "FP32", [-1])), "x (FP32 [-1]) without a batch dimension"),
        (config(8, ("x", "BYTES", [1])), "x (BYTES [-1, 1])"),
        (config(8, ("x", "FP32", [3, 224, 224])), "x (FP32 [-1, 3, 224, 224])"),
        ({"max_batch_size": 8}, "no inputs"),
    ],
)
def test_other_models_answer_415_saying_what_they_take(model_config, takes):
    with pytest.raises(UnsupportedMediaType) as caught:
        csvrows.csv_input("m", model_config)
    assert caught.value.status == 415
    assert "does not take text/csv: that needs exactly one numeric input of shape [batch, n]" in caught.value.message
    assert takes in caught.value.message
    assert "application/jsonlines" in caught.value.message


def test_a_json_object_sent_as_text_csv_is_read_as_json_as_native_reads_it():
    assert csvrows.is_csv("text/csv; charset=utf-8", b"1,2\n3,4\n")
    assert not csvrows.is_csv("text/csv", b'  {"inputs": []}')
    assert not csvrows.is_csv("application/json", b"1,2")


def parse(body: bytes, to: CsvInput = ROWS):
    return asyncio.run(csvrows.read(body, to))


def test_rows_go_in_one_tensor_sent_in_requests_with_binary_outputs_asked_for():
    values = parse(b"1,2\n3, 4\r\n5,6\n7,8\n9,10\n\n")
    assert values.tolist() == [[1, 2], [3, 4], [5, 6], [7, 8], [9, 10]]
    last = csvrows.request(values[4:], ROWS, {"sagemaker_custom_attributes": "a"})
    assert last.header == {
        "inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 8}}],
        "parameters": {"sagemaker_custom_attributes": "a", "binary_data_output": True},
    }
    assert last.header_length is not None
    assert np.frombuffer(last.body[last.header_length :], np.float32).tolist() == [9.0, 10.0]
    assert orjson.loads(last.body[: last.header_length]) == last.header


@pytest.mark.parametrize(
    ("body", "to", "message"),
    [
        (b"1,2\n3\n", ROWS, "line 2 of 2 has 1 values: line 1 has 2"),
        (b"1,2,3\n", CsvInput("x", "FP32", 2, 8), "line 1 of 1 has 3 values: model input 'x' takes 2"),
        (b"1,2\n\n3,4\n", ROWS, "line 2 of 3: the line is empty"),
        (b"1\n \n3\n", CsvInput("x", "FP32", None, 8), "line 2 of 3: the line is empty"),
        (b"1,2\n3,x\n", ROWS, "line 2 of 2: 'x' is not a value of FP32 (model input 'INPUT0')"),
        (b"1,2.5\n", CsvInput("x", "INT32", None, 8), "'2.5' is not a value of INT32"),
        (b"1,300\n", CsvInput("x", "INT8", None, 8), "'300' is out of INT8's range"),
        (b"1,-1\n", CsvInput("x", "UINT64", None, 8), "'-1' is not a value of UINT64"),
        (b"\n\n", ROWS, "holds no rows"),
    ],
)
def test_a_row_that_is_not_n_numbers_is_400_naming_its_line(body, to, message):
    with pytest.raises(BadRequest, match=re.escape(message)):
        parse(body, to)


NUMERIC_TYPES = ["INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64", "FP16", "FP32", "FP64"]


@pytest.mark.parametrize("datatype", NUMERIC_TYPES)
def test_values_are_plain_decimal_numbers_by_one_rule_for_every_type(datatype):
    """Python's int() and float() read ``1_0`` as 10 and ``nan`` as a number; no type here takes them."""
    to = CsvInput("x", datatype, None, 8)
    assert parse(b"1,2, 3 ,+4\n", to).tolist() == [[1, 2, 3, 4]]
    for value in (b"1_0", b"1_000", b"0x10", b"1 0", b'"2"', b"'2'", b"nan", b"inf", b"-Infinity", b"2\x00", b""):
        with pytest.raises(BadRequest) as caught:
            parse(b"1,2\n3," + value + b"\n", to)
        said = repr(value.decode())
        assert caught.value.message.startswith(f"line 2 of 2: {said} is not a value of {datatype} (model input 'x'): ")


@pytest.mark.parametrize(
    ("value", "datatype", "why"),
    [
        (b'"1"', "FP32", "write plain decimal numbers, unquoted"),
        (b"1_000", "INT32", "write plain decimal integers, without digit separators"),
        (b"nan", "FP64", "write plain decimal numbers"),
        (b"1" * 101, "FP64", "write plain decimal numbers, of at most 100 characters"),
    ],
)
def test_a_value_that_is_none_says_how_to_write_it(value, datatype, why):
    with pytest.raises(BadRequest) as caught:
        parse(value + b"\n", CsvInput("x", datatype, None, 8))
    assert caught.value.message.endswith(f"(model input 'x'): {why}")


@pytest.mark.parametrize(
    ("value", "datatype"),
    [
        (b"1e309", "FP64"),
        (b"-1e309", "FP64"),
        (b"1e39", "FP32"),
        (b"3.5e38", "FP32"),
        (b"70000", "FP16"),
        (b"128", "INT8"),
        (b"-129", "INT8"),
        (b"256", "UINT8"),
        (b"2147483648", "INT32"),
        (b"9223372036854775808", "INT64"),
        (b"18446744073709551616", "UINT64"),
        (b"99999999999999999999999", "INT16"),
    ],
)
def test_a_value_out_of_the_inputs_range_is_400_not_wrapped_or_infinite(value, datatype):
    with pytest.raises(BadRequest) as caught:
        parse(b"1,2\n3," + value + b"\n", CsvInput("x", datatype, None, 8))
    assert caught.value.message == f"line 2 of 2: {value.decode()!r} is out of {datatype}'s range (model input 'x')"


def test_the_edges_of_each_range_are_values():
    assert parse(b"127,-128\n", CsvInput("x", "INT8", None, 8)).tolist() == [[127, -128]]
    big = parse(b"18446744073709551615,0\n", CsvInput("x", "UINT64", None, 8))
    assert big.tolist() == [[2**64 - 1, 0]]
    assert parse(b"3.4028234e38,1e-50\n", CsvInput("x", "FP32", None, 8)).tolist()[0][1] == 0.0


def test_a_byte_order_mark_before_the_first_row_is_skipped():
    """Excel's UTF-8 CSV export begins with one."""
    assert parse(b"\xef\xbb\xbf1,2\r\n3,4\r\n").tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert parse(b"\xef\xbb\xbf1,2\n", CsvInput("x", "UINT8", 2, 8)).tolist() == [[1, 2]]
    with pytest.raises(BadRequest, match="line 2 of 2"):  # only before the first row
        parse(b"1,2\n\xef\xbb\xbf3,4\n")


def test_rows_are_read_a_window_at_a_time_and_a_row_longer_than_a_window_a_window_of_values_at_a_time():
    rng = np.random.default_rng(5)
    rows = rng.integers(-1000, 1000, (60_000, 7))
    text = "\n".join(",".join(map(str, row)) for row in rows).encode()
    assert len(text) > 4 * csv_values._WINDOW
    assert (parse(text, CsvInput("x", "INT32", 7, 8)) == rows).all()
    wide = rng.integers(0, 10, (3, 200_000))  # each row ~400 KB
    text = b"\r\n".join(b",".join(b"%d" % v for v in row) for row in wide)
    assert (parse(text, CsvInput("x", "INT64", None, 8)) == wide).all()
    with pytest.raises(BadRequest, match="line 3 of 3: 'x' is not a value of INT64"):
        parse(text[:-1] + b"x", CsvInput("x", "INT64", None, 8))


def test_a_row_of_the_wrong_width_is_refused_by_its_count_before_it_is_split(monkeypatch):
    splits = []
    real = csv_values._Reading._numbers

    def numbers(self, fields, row_of):
        splits.append(len(fields))
        return real(self, fields, row_of)

    monkeypatch.setattr(csv_values._Reading, "_numbers", numbers)
    with pytest.raises(BadRequest) as caught:
        parse(b"1,2\n" + b"1," * 1_000_000 + b"1\n")
    assert caught.value.message == "line 2 of 2 has 1000001 values: line 1 has 2"
    assert splits == [2]  # the first row's values: none of the second's read


def test_rows_that_claim_more_values_than_the_body_holds_are_refused_at_the_short_row_without_the_tensor():
    body = b",".join([b"1"] * 5000) + b"\n" + b"2\n" * 3000
    with pytest.raises(BadRequest, match="line 2 of 3001 has 1 values: line 1 has 5000"):
        parse(body)


def test_the_event_loop_is_served_while_many_rows_are_read():
    _, gaps = asyncio.run(gaps_while(csvrows.read(b"0.25,1.5,-3\n" * 200_000, CsvInput("x", "FP32", None, 8))))
    assert len(gaps) > 5
    assert max(gaps) < 0.25  # windows of a few milliseconds (generous: this machine is shared)


def test_rows_whose_tensor_cannot_fit_the_memory_free_are_413_before_they_are_read(monkeypatch):
    monkeypatch.setattr(cgroups, "available_memory", lambda group: 8 << 20)
    needs = r"^this body \(9000000 rows of 1 values\) needs about 171 MiB .* 8 MiB free"
    with pytest.raises(PayloadTooLarge, match=needs):
        parse(b"1\n" * 9_000_000, CsvInput("x", "FP64", 1, 8))


def binary_answer(outputs: dict[str, np.ndarray]) -> UpstreamResponse:
    specs, raws = [], []
    for name, array in outputs.items():
        raw = array.tobytes()
        specs.append({"name": name, "datatype": "FP32" if array.dtype == np.float32 else "INT64",
                      "shape": list(array.shape), "parameters": {"binary_data_size": len(raw)}})  # fmt: skip
        raws.append(raw)
    head = orjson.dumps({"model_name": "m", "model_version": "3", "outputs": specs})
    return UpstreamResponse(200, "application/octet-stream", len(head), head + b"".join(raws))


def test_answers_are_a_line_a_row_every_output_flattened_or_a_kserve_response_each():
    first = binary_answer({"y": np.array([[0.5, 1.0], [1.5, 2.0]], np.float32), "n": np.array([[1], [2]], np.int64)})
    second = binary_answer({"y": np.array([[2.5, 0.1]], np.float32), "n": np.array([[3]], np.int64)})
    assert csvrows.lines(0, 2, first, to_sagemaker, False, "m") == [b"0.5,1.0,1", b"1.5,2.0,2"]
    assert csvrows.lines(2, 1, second, to_sagemaker, False, "m") == [b"2.5,0.1,3"]
    (line,) = csvrows.lines(2, 1, second, to_sagemaker, True, "shown")
    assert orjson.loads(line) == {
        "model_name": "shown",
        "model_version": "3",
        "outputs": [
            {"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [2.5, 0.1]},
            {"name": "n", "datatype": "INT64", "shape": [1, 1], "data": [3]},
        ],
    }


def test_the_rows_of_a_failed_triton_request_each_get_its_failure_naming_the_rows():
    refused = UpstreamResponse(400, "application/json", None, b'{"error":"the model refuses"}')
    assert (
        csvrows.lines(0, 2, refused, to_sagemaker, False, "m")
        == [Failure(400, "the model refuses (lines 1-2 went to Triton together)")] * 2
    )
    assert csvrows.lines(2, 1, NotReady("restarting"), to_sagemaker, False, "m") == [Failure(503, "restarting")]


def test_bytes_outputs_and_json_outputs_are_read_too():
    element = b"caf\xc3\xa9, ok"
    raw = len(element).to_bytes(4, "little") + element
    head = orjson.dumps({"outputs": [
        {"name": "s", "datatype": "BYTES", "shape": [1, 1], "parameters": {"binary_data_size": len(raw)}},
        {"name": "j", "datatype": "INT32", "shape": [1, 2], "data": [7, 8]},
    ]})  # fmt: skip
    answer = UpstreamResponse(200, "", len(head), head + raw)
    assert csvrows.lines(0, 1, answer, to_sagemaker, False, "m") == ['"café, ok",7,8'.encode()]
    (line,) = csvrows.lines(0, 1, answer, to_sagemaker, True, "m")
    assert orjson.loads(line)["outputs"][0]["data"] == ["café, ok"]


class Triton:
    """Answers each request of rows with their sums (as the rows model's TOTAL), failing one holding
    -999; records what it is sent (rows) and how many at once."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.in_flight = self.most = 0

    async def send(self, inference) -> UpstreamResponse:
        rows = np.frombuffer(inference.body[inference.header_length :], np.float32).reshape(
            inference.header["inputs"][0]["shape"]
        )
        self.sent.append(len(rows))
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.001)
        self.in_flight -= 1
        if (rows == -999).any():
            return UpstreamResponse(500, "application/json", None, b'{"error":"the model refuses -999"}')
        return binary_answer({"TOTAL": rows.sum(axis=1, keepdims=True)})


def csv_answer(body: bytes, triton: Triton, error_lines: bool = False, in_flight: int = 2):
    how = csvrows.Work(triton.send, to_sagemaker, error_lines, in_flight, False, "m", {})
    return asyncio.run(csvrows.answer(body, CsvInput("x", "FP32", 1, 4), how))


def test_rows_go_a_bounded_number_of_requests_at_a_time_and_answer_in_order():
    triton = Triton()
    reply = csv_answer(b"".join(b"%d\n" % i for i in range(50)), triton)
    assert (reply.status, reply.content_type) == (200, "text/csv")
    assert bytes(reply.body).splitlines() == [b"%d.0" % i for i in range(50)]
    assert triton.sent == [4] * 12 + [2]
    assert triton.most == 2


def test_a_failed_request_of_rows_stops_what_is_not_sent_or_is_an_error_line_a_row():
    body = b"".join(b"%d\n" % i for i in range(100)).replace(b"\n5\n", b"\n-999\n")
    triton = Triton()
    with pytest.raises(RecordFailed) as caught:
        csv_answer(body, triton, in_flight=1)
    assert caught.value.message == "line 5 of 100: the model refuses -999 (lines 5-8 went to Triton together)"
    assert triton.sent == [4, 4]  # nothing after the failure was sent
    reply = csv_answer(body, Triton(), error_lines=True)
    lines = bytes(reply.body).splitlines()
    assert lines[4:8] == [b'{"error":"the model refuses -999 (lines 5-8 went to Triton together)"}'] * 4
    assert lines[8] == b"8.0"
