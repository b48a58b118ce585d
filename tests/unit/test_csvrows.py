"""text/csv bodies: which models take them (and the 415 of the others, saying what they take), rows read
into one tensor split by max_batch_size, and Triton's answers as one line a row, CSV or JSON lines."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from smtriton.serve.dataplane import csvrows
from smtriton.serve.dataplane.answers import to_sagemaker
from smtriton.serve.dataplane.csvrows import CsvInput
from smtriton.serve.dataplane.multirecord import Failure
from smtriton.serve.errors import BadRequest, NotReady, UnsupportedMediaType
from smtriton.serve.triton.client import UpstreamResponse

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


def test_rows_go_in_one_tensor_split_by_max_batch_size_with_binary_outputs_asked_for():
    batches = csvrows.requests(b"1,2\n3, 4\r\n5,6\n7,8\n9,10\n\n", ROWS, {"sagemaker_custom_attributes": "a"})
    assert [(b.first, b.count) for b in batches] == [(0, 2), (2, 2), (4, 1)]
    last = batches[-1].inference
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
        (b"1,2\n3,x\n", ROWS, "line 2 of 2: 'x' is not a value of FP32 (model input 'INPUT0')"),
        (b"1,2.5\n", CsvInput("x", "INT32", None, 8), "'2.5' is not a value of INT32"),
        (b"1,300\n", CsvInput("x", "INT8", None, 8), "'300' is not a value of INT8"),
        (b"1,-1\n", CsvInput("x", "UINT64", None, 8), "'-1' is not a value of UINT64"),
        (b"\n\n", ROWS, "holds no rows"),
    ],
)
def test_a_row_that_is_not_n_numbers_is_400_naming_its_line(body, to, message):
    with pytest.raises(BadRequest, match=message.replace("(", r"\(").replace(")", r"\)")):
        csvrows.requests(body, to, {})


NUMERIC_TYPES = ["INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64", "FP16", "FP32", "FP64"]


@pytest.mark.parametrize("datatype", NUMERIC_TYPES)
def test_values_are_plain_decimal_numbers_by_one_rule_for_every_type(datatype):
    """Python's int() and float() read ``1_0`` as 10; no CSV writer puts it, and no type takes it."""
    to = CsvInput("x", datatype, None, 8)
    assert csvrows.parse(b'1,"2", 3 ,+4\n', to).tolist() == [[1, 2, 3, 4]]
    for value in (b"1_0", b"1_000", b"0x10", b"1 0"):
        with pytest.raises(BadRequest, match=f"line 2 of 2: '{value.decode()}' is not a value of {datatype}"):
            csvrows.parse(b"1,2\n3," + value + b"\n", to)


def test_a_byte_order_mark_before_the_first_row_is_skipped():
    """Excel's UTF-8 CSV export begins with one."""
    assert csvrows.parse(b"\xef\xbb\xbf1,2\r\n3,4\r\n", ROWS).tolist() == [[1.0, 2.0], [3.0, 4.0]]
    assert csvrows.parse(b'\xef\xbb\xbf"1","2"\n', CsvInput("x", "UINT8", 2, 8)).tolist() == [[1, 2]]
    with pytest.raises(BadRequest, match="line 2 of 2"):  # only before the first row
        csvrows.parse(b"1,2\n\xef\xbb\xbf3,4\n", ROWS)


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
    batches = csvrows.requests(b"1,2\n3,4\n5,6\n", ROWS, {})
    first = binary_answer({"y": np.array([[0.5, 1.0], [1.5, 2.0]], np.float32), "n": np.array([[1], [2]], np.int64)})
    second = binary_answer({"y": np.array([[2.5, 0.1]], np.float32), "n": np.array([[3]], np.int64)})
    lines = csvrows.lines(batches, [first, second], to_sagemaker, False, "m")
    assert lines == [b"0.5,1.0,1", b"1.5,2.0,2", b"2.5,0.1,3"]
    json_lines = csvrows.lines(batches, [first, second], to_sagemaker, True, "shown")
    assert [orjson.loads(line) for line in json_lines][2] == {
        "model_name": "shown",
        "model_version": "3",
        "outputs": [
            {"name": "y", "datatype": "FP32", "shape": [1, 2], "data": [2.5, 0.1]},
            {"name": "n", "datatype": "INT64", "shape": [1, 1], "data": [3]},
        ],
    }


def test_the_rows_of_a_failed_triton_request_each_get_its_failure_naming_the_rows():
    batches = csvrows.requests(b"1,2\n3,4\n5,6\n", ROWS, {})
    refused = UpstreamResponse(400, "application/json", None, b'{"error":"the model refuses"}')
    lines = csvrows.lines(batches, [refused, NotReady("restarting")], to_sagemaker, False, "m")
    assert lines == [
        Failure(400, "the model refuses (lines 1-2 went to Triton together)"),
        Failure(400, "the model refuses (lines 1-2 went to Triton together)"),
        Failure(503, "restarting"),
    ]


def test_bytes_outputs_and_json_outputs_are_read_too():
    element = b"caf\xc3\xa9, ok"
    raw = len(element).to_bytes(4, "little") + element
    head = orjson.dumps({"outputs": [
        {"name": "s", "datatype": "BYTES", "shape": [1, 1], "parameters": {"binary_data_size": len(raw)}},
        {"name": "j", "datatype": "INT32", "shape": [1, 2], "data": [7, 8]},
    ]})  # fmt: skip
    answer = UpstreamResponse(200, "", len(head), head + raw)
    batches = csvrows.requests(b"1,2\n", ROWS, {})
    assert csvrows.lines(batches, [answer], to_sagemaker, False, "m") == ['"café, ok",7,8'.encode()]
    (line,) = csvrows.lines(batches, [answer], to_sagemaker, True, "m")
    assert orjson.loads(line)["outputs"][0]["data"] == ["café, ok"]
