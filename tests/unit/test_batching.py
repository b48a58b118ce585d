"""Requests merged along the batch dimension and Triton's answer split back (smtriton/serve/dataplane/batching/:
rule.py, mergeable.py, merging.py): when requests may merge, what the merged request is, and that each
part's answer is what Triton's answer holds for its rows. tests/integration/test_batching.py
compares merged against unmerged answers on the real Triton."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smtriton.serve.dataplane.batching import answer_rows, mergeable, merging, rule
from smtriton.serve.dataplane.batching.mergeable import Part
from smtriton.serve.dataplane.batching.rule import ModelBatching
from smtriton.serve.dataplane.reading.inference import Inference, read
from smtriton.serve.triton.client import UpstreamResponse

MODEL = ModelBatching(max_batch_size=8, instances=1)
CONFIG = {
    "backend": "onnxruntime",
    "max_batch_size": 8,
    "dynamic_batching": {},
    "instance_group": [{"count": 2, "gpus": []}],
}


def json_request(rows: list[list[Any]], **extra: Any) -> Inference:
    header = {"inputs": [{"name": "X", "datatype": "INT32", "shape": [len(rows), 2], "data": rows}], **extra}
    body = orjson.dumps(header)
    return read(body, None)


def binary_request(*tensors: tuple[str, str, np.ndarray], **extra: Any) -> Inference:
    """A binary+json request of numpy tensors (BYTES: an object array of bytes)."""
    inputs, chunks = [], []
    for name, datatype, array in tensors:
        raw = _serialized(datatype, array)
        inputs.append(
            {
                "name": name,
                "datatype": datatype,
                "shape": list(array.shape),
                "parameters": {"binary_data_size": len(raw)},
            }
        )
        chunks.append(raw)
    head = orjson.dumps({"inputs": inputs, **extra})
    return read(head + b"".join(chunks), len(head))


def _serialized(datatype: str, array: np.ndarray) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(item)) + item for item in array.ravel())
    return array.tobytes()


def part_of(inference: Inference) -> Part:
    found = mergeable.part(inference, MODEL)
    assert found is not None
    return found


# ----- which models, which requests --------------------------------------------------------------------
def test_a_model_merges_where_triton_batches_it_and_counts_its_instances_per_gpu():
    assert rule.model_batching(CONFIG) == ModelBatching(8, 2, ())
    on_gpus = {**CONFIG, "instance_group": [{"count": 2, "gpus": [0, 1]}, {"count": 1}]}
    assert rule.model_batching(on_gpus) == ModelBatching(8, 5, ())


def test_the_outputs_declared_dims_are_kept_to_check_the_answers_shape():
    outputs = [{"name": "Y", "dims": [-1, 3]}, {"name": "Z", "dims": ["4"]}, {"name": "W", "dims": ["x"]}]
    assert rule.model_batching({**CONFIG, "output": outputs}) == ModelBatching(8, 2, (("Y", (-1, 3)), ("Z", (4,))))


def merge_rows(value: str) -> dict[str, Any]:
    return {"parameters": {"smtriton_merge_rows": {"string_value": value}}}


@pytest.mark.parametrize(
    ("change", "merges"),
    [
        ({"platform": "onnxruntime_onnx", "backend": ""}, True),
        ({"platform": "pytorch_libtorch", "backend": "pytorch"}, True),
        ({"platform": "tensorrt_plan", "backend": "tensorrt"}, True),
        ({"platform": "tensorflow_savedmodel", "backend": "tensorflow"}, True),
        ({"backend": "openvino"}, True),
        ({"backend": "python"}, False),  # handed a list of requests: it may pad each to the longest
        ({"backend": "custom"}, False),
        ({"backend": "python", **merge_rows("true")}, True),  # declared: each row's answer is its own
        ({"backend": "python", **merge_rows(" TRUE ")}, True),
        ({"backend": "onnxruntime", **merge_rows("false")}, False),  # turned off for one model
        ({"backend": "python", **merge_rows("yes")}, False),  # neither: never merged
    ],
)
def test_a_model_merges_where_its_backend_concatenates_or_its_config_declares_it(change, merges):
    assert (rule.model_batching({**CONFIG, **change}) is not None) is merges


@pytest.mark.parametrize(
    "change",
    [
        {"max_batch_size": 0},
        {"max_batch_size": 1},
        {"dynamic_batching": None},
        {"model_transaction_policy": {"decoupled": True}},
        {"sequence_batching": {}},
        {"batch_input": [{"kind": "BATCH_ELEMENT_COUNT"}]},
        {"input": [{"name": "X", "allow_ragged_batch": False}, {"name": "Y", "allow_ragged_batch": True}]},
    ],
)
def test_a_model_triton_would_not_batch_never_merges(change):
    config = {key: value for key, value in {**CONFIG, **change}.items() if value is not None}
    assert rule.model_batching(config) is None


def test_requests_that_agree_but_on_the_batch_dimension_share_a_key():
    one, two = part_of(json_request([[1, 2]])), part_of(json_request([[3, 4], [5, 6]]))
    assert one.key == two.key
    assert (one.batch, two.batch) == (1, 2)
    assert part_of(json_request([[1, 2]], id="a")).key == one.key  # ids differ per request
    assert part_of(json_request([[1, 2]], parameters={"k": "v"})).key != one.key
    assert part_of(json_request([[1, 2]], outputs=[{"name": "Y"}])).key != one.key
    binary = part_of(binary_request(("X", "INT32", np.zeros((1, 2), np.int32))))
    assert binary.key != one.key  # encodings do not mix


def _json(header: dict[str, Any]) -> Inference:
    return read(orjson.dumps(header), None)


def _x(**spec: Any) -> dict[str, Any]:
    """An input of one request (``data=None``: none)."""
    fields = {"name": "X", "datatype": "INT32", "shape": [1, 2], "data": [1, 2], **spec}
    return {key: value for key, value in fields.items() if value is not None}


@pytest.mark.parametrize(
    ("why", "inference"),
    [
        ("a sequence", _json({"inputs": [_x()], "parameters": {"sequence_id": 3}})),
        ("a priority", _json({"inputs": [_x()], "parameters": {"priority": 1}})),
        ("a timeout", _json({"inputs": [_x()], "parameters": {"timeout": 100}})),
        ("custom attributes", _json({"inputs": [_x()], "parameters": {"sagemaker_custom_attributes": "a"}})),
        ("a float parameter", _json({"inputs": [_x()], "parameters": {"t": 0.5}})),
        ("an id that is no string", _json({"inputs": [_x()], "id": 7})),
        ("too few elements", _json({"inputs": [_x(data=[1])]})),
        ("too many elements", _json({"inputs": [_x(data=[[1, 2], [3]])]})),
        ("rows disagree between inputs", _json({"inputs": [_x(), _x(name="Y", shape=[2, 1])]})),
        ("an input twice", _json({"inputs": [_x(), _x()]})),
        ("no batch dimension", _json({"inputs": [_x(shape=[], data=[])]})),
        ("more rows than the model takes", _json({"inputs": [_x(shape=[9, 1], data=[1] * 9)]})),
        ("no rows", _json({"inputs": [_x(shape=[0, 2], data=[])]})),
        ("half floats in JSON", _json({"inputs": [_x(datatype="FP16")]})),
        ("an unknown datatype", _json({"inputs": [_x(datatype="FP8")]})),
        ("shared memory", _json({"inputs": [_x(data=None, parameters={"shared_memory_region": "r"})]})),
        (
            "an output in shared memory",
            _json({"inputs": [_x()], "outputs": [{"name": "Y", "parameters": {"shared_memory_region": "r"}}]}),
        ),
        ("no inputs", _json({"inputs": []})),
        ("raw binary", Inference(b"\x00" * 8, 0, None)),
    ],
)
def test_requests_triton_could_answer_otherwise_merged_go_alone(why, inference):
    assert mergeable.part(inference, MODEL) is None, why


def _with_sizes(inference: Inference, size: int, extra: bytes = b"") -> Inference:
    """The binary request with its one input's binary_data_size set to ``size`` and ``extra`` bytes after."""
    assert inference.header is not None
    assert inference.header_length is not None
    header = json.loads(bytes(inference.body[: inference.header_length]))
    header["inputs"][0]["parameters"]["binary_data_size"] = size
    head = orjson.dumps(header)
    return read(head + bytes(inference.body[inference.header_length :]) + extra, len(head))


@pytest.mark.parametrize(
    ("why", "change"),
    [
        ("bytes past the last input", lambda r: _with_sizes(r, 8, b"\x00")),
        ("fewer bytes than the shape", lambda r: _with_sizes(r, 4)),
    ],
)
def test_binary_requests_whose_bytes_disagree_with_their_shape_go_alone(why, change):
    good = binary_request(("X", "INT32", np.array([[1, 2]], np.int32)))
    assert mergeable.part(good, MODEL) is not None
    assert mergeable.part(change(good), MODEL) is None, why


def test_bytes_elements_are_counted_by_their_lengths():
    """The same JSON part (two elements, 10 bytes) before two bodies: one holds two elements, the other
    one element of 6 bytes; the second goes alone though the first's part was made (and kept) before."""
    good = binary_request(("S", "BYTES", np.array([[b"ab", b""]], dtype=object)))
    assert good.header_length is not None
    assert mergeable.part(good, MODEL) is not None
    one_element = read(
        bytes(good.body[: good.header_length]) + _serialized("BYTES", np.array([b"ab\0\0\0\0"], object)),
        good.header_length,
    )
    assert one_element.header is good.header
    assert mergeable.part(one_element, MODEL) is None


def test_a_part_kept_for_a_json_part_is_used_only_for_a_body_it_fits():
    """Requests that send the same JSON part share its reading and what their parts are made of; a body
    of another length is checked again (and goes alone here: a byte past the last input)."""
    first = binary_request(("X", "INT32", np.array([[1, 2]], np.int32)))
    assert first.header_length is not None
    head = bytes(first.body[: first.header_length])
    second = read(head + np.array([[3, 4]], np.int32).tobytes(), first.header_length)
    assert second.header is first.header
    made, again = part_of(first), part_of(second)
    assert (again.key, again.batch, again.request_id, again.tensors) == (made.key, made.batch, None, ((len(head), 8),))
    assert again.inference.body == second.body
    assert merging.merge([made, again]).inference.body.endswith(np.array([1, 2, 3, 4], np.int32).tobytes())
    longer = read(bytes(second.body) + b"\x00", first.header_length)
    assert longer.header is first.header
    assert mergeable.part(longer, MODEL) is None


# ----- the merged request ------------------------------------------------------------------------------------
def test_json_data_is_merged_as_the_clients_wrote_it():
    """Triton parses the very characters each client sent (its parser rounds some numbers otherwise
    than a re-encoding would)."""
    spec = b'{"name":"X","datatype":"FP64","shape":'
    first = read(b'{"inputs":[' + spec + b'[1,2],"data":[ 0.1000000000000000055511151231257827 , 2E0 ]}]}', None)
    second = read(b'{"id":"b","inputs":[' + spec + b'[2,2],"data":[[1e-7,-0],[3,4.50]]}]}', None)
    merged = merging.merge([part_of(first), part_of(second)])
    assert merged.inference.header_length is None
    assert merged.inference.body == (
        b'{"inputs":[{"name":"X","datatype":"FP64","shape":[3,2],'
        b'"data":[0.1000000000000000055511151231257827 , 2E0,[1e-7,-0],[3,4.50]]}]}'
    )


def test_binary_tensors_are_concatenated_input_by_input():
    a = binary_request(("X", "INT32", np.array([[1, 2]], np.int32)), ("S", "BYTES", np.array([[b"x"]], dtype=object)))
    b = binary_request(
        ("X", "INT32", np.array([[3, 4], [5, 6]], np.int32)),
        ("S", "BYTES", np.array([[b"yy"], [b""]], dtype=object)),
    )
    merged = merging.merge([part_of(a), part_of(b)]).inference
    assert merged.header_length is not None
    header = orjson.loads(merged.body[: merged.header_length])
    assert header["inputs"] == [
        {"name": "X", "datatype": "INT32", "shape": [3, 2], "parameters": {"binary_data_size": 24}},
        {"name": "S", "datatype": "BYTES", "shape": [3, 1], "parameters": {"binary_data_size": 15}},
    ]
    assert merged.body[merged.header_length :] == (
        np.array([1, 2, 3, 4, 5, 6], np.int32).tobytes() + b"\x01\x00\x00\x00x\x02\x00\x00\x00yy\x00\x00\x00\x00"
    )


def test_the_outputs_and_parameters_the_requests_agree_on_are_asked_once():
    outputs = [{"name": "Y", "parameters": {"binary_data": True}}]
    parts = [part_of(json_request([[1, 2]], outputs=outputs, parameters={"k": "v"})) for _ in range(2)]
    header = orjson.loads(merging.merge(parts).inference.body)
    assert (header["outputs"], header["parameters"]) == (outputs, {"k": "v"})
    assert "id" not in header


def test_groups_keep_order_key_and_the_models_batch_size():
    a = [part_of(json_request([[1, 2]] * rows)) for rows in (3, 4, 2, 1)]
    other = part_of(json_request([[1, 2]], parameters={"k": "v"}))
    assert merging.groups([a[0], other, a[1], None, a[2], a[3]], 8) == [[0, 2], [1], [3], [4, 5]]


# ----- the answer split ---------------------------------------------------------------------------------------
def triton_answer(outputs: list[dict[str, Any]], binary: list[bytes] | None = None, **extra: Any) -> UpstreamResponse:
    head = orjson.dumps({"model_name": "m", "model_version": "1", **extra, "outputs": outputs})
    if binary is None:
        return UpstreamResponse(200, "application/json", None, head)
    return UpstreamResponse(200, "application/octet-stream", len(head), head + b"".join(binary))


def test_each_part_gets_its_rows_its_id_and_tritons_other_fields():
    parts = [part_of(json_request([[1, 2]], id="first")), part_of(json_request([[3, 4], [5, 6]]))]
    merged = merging.merge(parts)
    answer = triton_answer(
        [
            {"name": "Y", "datatype": "FP32", "shape": [3, 2], "data": [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]},
            {"name": "Z", "datatype": "INT32", "shape": [3], "data": [7, 8, 9]},
        ],
        parameters={"p": "q"},
    )
    first, second = merged.split(answer, MODEL) or []
    assert first.header_length is None
    assert first.body == (
        b'{"id":"first","model_name":"m","model_version":"1","parameters":{"p":"q"},"outputs":['
        b'{"name":"Y","datatype":"FP32","shape":[1,2],"data":[0.5,1.0]},{"name":"Z","datatype":"INT32","shape":[1],"data":[7]}]}'
    )
    assert orjson.loads(second.body) == {
        "model_name": "m",
        "model_version": "1",
        "parameters": {"p": "q"},
        "outputs": [
            {"name": "Y", "datatype": "FP32", "shape": [2, 2], "data": [1.5, 2.0, 2.5, 3.0]},
            {"name": "Z", "datatype": "INT32", "shape": [2], "data": [8, 9]},
        ],
    }


def test_binary_outputs_are_cut_at_the_rows_bytes_elements_by_their_lengths():
    parts = [part_of(json_request([[1, 2]] * rows)) for rows in (2, 1)]
    y = np.arange(6, dtype=np.int64)
    s = b"".join(struct.pack("<I", len(x)) + x for x in (b"a", b"bc", b""))
    answer = triton_answer(
        [
            {"name": "Y", "datatype": "INT64", "shape": [3, 2], "parameters": {"binary_data_size": 48}},
            {"name": "S", "datatype": "BYTES", "shape": [3], "parameters": {"binary_data_size": len(s)}},
        ],
        [y.tobytes(), s],
    )
    first, second = merging.merge(parts).split(answer, MODEL) or []
    for answer_part, rows, y_rows, s_rows in ((first, 2, y[:4], s[:11]), (second, 1, y[4:], s[11:])):
        assert answer_part.header_length is not None
        header = orjson.loads(answer_part.body[: answer_part.header_length])
        assert [o["shape"] for o in header["outputs"]] == [[rows, 2], [rows]]
        assert [o["parameters"]["binary_data_size"] for o in header["outputs"]] == [len(y_rows.tobytes()), len(s_rows)]
        assert answer_part.body[answer_part.header_length :] == y_rows.tobytes() + s_rows


def test_nan_and_infinity_are_written_back_as_triton_writes_them():
    parts = [part_of(json_request([[1, 2]])) for _ in range(2)]
    answer = UpstreamResponse(
        200,
        "application/json",
        None,
        b'{"model_name":"m","model_version":"1","outputs":[{"name":"Y","datatype":"FP32","shape":[2],"data":[NaN,-Infinity]}]}',
    )
    first, second = merging.merge(parts).split(answer, MODEL) or []
    assert first.body.endswith(b'"shape":[1],"data":[NaN]}]}')
    assert second.body.endswith(b'"shape":[1],"data":[-Infinity]}]}')


@pytest.mark.parametrize(
    "answer",
    [
        UpstreamResponse(400, "application/json", None, b'{"error":"a row was refused"}'),
        triton_answer([{"name": "Y", "datatype": "INT32", "shape": [2], "data": [1, 2]}]),  # not 3 rows
        triton_answer([{"name": "Y", "datatype": "INT32", "shape": [3], "data": [1, 2]}]),  # too few elements
        triton_answer(
            [{"name": "Y", "datatype": "INT32", "shape": [3], "parameters": {"binary_data_size": 8}}], [b"\x00" * 8]
        ),
        triton_answer(
            [{"name": "Y", "datatype": "INT32", "shape": [3], "parameters": {"binary_data_size": 12}}], [b"\x00" * 13]
        ),
    ],
)
def test_an_answer_that_cannot_be_split_by_rows_is_none(answer):
    parts = [part_of(json_request([[1, 2]] * rows)) for rows in (1, 2)]
    assert merging.merge(parts).split(answer, MODEL) is None


def test_json_data_is_triton_own_text_and_the_id_is_written_as_triton_writes_it():
    parts = [part_of(json_request([[1, 2]], id='a"\\\x01\n')), part_of(json_request([[3, 4], [5, 6]], id="é"))]
    answer = UpstreamResponse(
        200,
        "application/json",
        None,
        b'{"model_name":"m","model_version":"1","outputs":[{"name":"Y","datatype":"FP32","shape":[3],'
        b'"data":[1E-7,2.50,0.10000000149011612]},{"name":"S","datatype":"BYTES","shape":[3,1],'
        b'"data":["a,\\"]","",","]}]}',
    )
    first, second = merging.merge(parts).split(answer, MODEL) or []
    assert first.body == (
        b'{"id":"a\\"\\\\\\u0001\\n","model_name":"m","model_version":"1","outputs":[{"name":"Y","datatype":"FP32",'
        b'"shape":[1],"data":[1E-7]},{"name":"S","datatype":"BYTES","shape":[1,1],"data":["a,\\"]"]}]}'
    )
    assert (
        second.body
        == (
            '{"id":"é","model_name":"m","model_version":"1","outputs":[{"name":"Y","datatype":"FP32",'
            '"shape":[2],"data":[2.50,0.10000000149011612]},{"name":"S","datatype":"BYTES","shape":[2,1],'
            '"data":["",","]}]}'
        ).encode()
    )


DECLARED = ModelBatching(8, 1, (("Y", (-1,)), ("Z", (2,))))


@pytest.mark.parametrize(
    ("outputs", "splits"),
    [
        ([{"name": "Y", "datatype": "INT32", "shape": [3, 1], "data": [1, 2, 3]}], True),
        # as many elements as rows, but no batch dimension: the model's configuration says [batch, -1]
        ([{"name": "Y", "datatype": "INT32", "shape": [3], "data": [1, 2, 3]}], False),
        ([{"name": "Z", "datatype": "INT32", "shape": [3, 3], "data": [0] * 9}], False),  # declared [batch, 2]
        ([{"name": "Q", "datatype": "INT32", "shape": [3, 1], "data": [1, 2, 3]}], False),  # not declared
    ],
)
def test_an_answer_is_split_only_where_each_output_is_the_batch_and_then_its_declared_dims(outputs, splits):
    parts = [part_of(json_request([[1, 2]] * rows)) for rows in (1, 2)]
    answers = merging.merge(parts).split(triton_answer(outputs), DECLARED)
    assert (answers is not None) is splits


@pytest.mark.parametrize(("status", "whole"), [(503, True), (504, True), (429, True), (400, False), (500, False)])
def test_what_triton_refuses_as_a_whole_is_told_apart_from_a_rows_failure(status, whole):
    answer = UpstreamResponse(status, "application/json", None, b'{"error":"Exceeds maximum queue size"}')
    assert merging.refused_as_a_whole(answer) is whole


def test_a_long_json_output_is_cut_at_its_rows_commas_as_a_short_one_is():
    parts = [part_of(json_request([[1, 2]] * rows)) for rows in (2, 1)]
    values = [f"{n}.{n % 7}E-3" for n in range(3 * 700)]  # 3 rows of 700: past the short path's 4 KiB
    answer = UpstreamResponse(
        200,
        "application/json",
        None,
        b'{"model_name":"m","model_version":"1","outputs":[{"name":"Y","datatype":"FP64","shape":[3,700],"data":['
        + ",".join(values).encode()
        + b"]}]}",
    )
    first, second = merging.merge(parts).split(answer, MODEL) or []
    assert first.body.endswith(b'"shape":[2,700],"data":[' + ",".join(values[:1400]).encode() + b"]}]}")
    assert second.body.endswith(b'"shape":[1,700],"data":[' + ",".join(values[1400:]).encode() + b"]}]}")


def test_a_plan_kept_for_a_repeated_header_is_used_only_for_a_body_of_its_length():
    parts = [part_of(json_request([[1, 2]])) for _ in range(2)]
    merged = merging.merge(parts)
    answer = triton_answer(
        [{"name": "Y", "datatype": "INT32", "shape": [2], "parameters": {"binary_data_size": 8}}], [b"\x01" * 8]
    )
    assert [a.body[a.header_length :] for a in merged.split(answer, MODEL) or []] == [b"\x01" * 4] * 2
    assert [a.body[a.header_length :] for a in merged.split(answer, MODEL) or []] == [b"\x01" * 4] * 2  # kept
    longer = UpstreamResponse(200, answer.content_type, answer.header_length, answer.body + b"\x00")
    assert merged.split(longer, MODEL) is None


# ----- what is kept for JSON text that repeats but for its numbers ------------------------------------------
def _answer_text(values: list[list[str]], rows: int, extra: str = "") -> UpstreamResponse:
    outputs = ",".join(
        f'{{"name":"Y{n}","datatype":"FP32","shape":[{rows},{len(v) // rows}]{extra},"data":[{",".join(v)}]}}'
        for n, v in enumerate(values)
    )
    text = '{"model_name":"m","model_version":"1","outputs":[' + outputs + "]}"
    return UpstreamResponse(200, "application/json", None, text.encode())


def _fresh_split(merged: merging.Merged, answer: UpstreamResponse) -> list[bytes]:
    answer_rows._plans.clear()
    return [a.body for a in merged.split(answer, MODEL) or []]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(1, 3), min_size=1, max_size=4),
    st.integers(1, 3),
    st.integers(1, 2),
    st.data(),
)
def test_a_json_answer_cut_by_a_plan_kept_for_its_text_around_the_numbers_is_cut_as_walked(
    rows, per_row, outputs, data
):
    """A plan made for one answer is used for the next whose text differs only in its numbers (longer,
    shorter, signs, exponents): each part's answer is what a fresh walk of that answer gives."""
    number = st.one_of(st.integers(-(10**12), 10**12).map(str), st.floats(allow_nan=False).map(repr))
    total = sum(rows)
    merged = merging.merge([part_of(json_request([[1, 2]] * count)) for count in rows])
    answers = [
        _answer_text(
            [data.draw(st.lists(number, min_size=total * per_row, max_size=total * per_row)) for _ in range(outputs)],
            total,
        )
        for _ in range(3)
    ]
    expected = [_fresh_split(merged, answer) for answer in answers]
    answer_rows._plans.clear()
    assert [[a.body for a in merged.split(answer, MODEL) or []] for answer in answers] == expected
    assert len(answer_rows._plans) == 1  # "inf" and "-inf" write as Infinity in Triton; here as text alike
    assert all(len(cut) == len(rows) for cut in expected)


def test_a_data_member_the_walk_does_not_read_as_an_outputs_data_keeps_no_plan():
    """A "data" member found where the walk finds none (an output's parameter here): nothing is kept, and
    every answer is walked and cut as its own."""
    merged = merging.merge([part_of(json_request([[1, 2]])) for _ in range(2)])
    answer_rows._plans.clear()
    for values in (["1", "2"], ["30", "-4"]):
        answer = _answer_text([values], 2, ',"parameters":{"data":[5]}')
        cuts = [a.body for a in merged.split(answer, MODEL) or []]
        assert [orjson.loads(c)["outputs"][0]["data"] for c in cuts] == [[float(values[0])], [float(values[1])]]
    assert not answer_rows._plans


def test_a_json_requests_part_kept_for_its_text_around_the_numbers_takes_each_requests_own_numbers():
    """Requests alike but for their numbers (compact, or spaced as Python's json writes them) share what
    their part is made of; each part's data is its own text, and data of another count goes alone."""
    mergeable._made_json.clear()
    for dumps in (orjson.dumps, lambda value: json.dumps(value).encode()):
        made = [
            mergeable.part(
                read(
                    dumps({"id": "a", "inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": data}]}),
                    None,
                ),
                MODEL,
            )
            for data in ([1, 2], [-30.5, 4e-7], [[5, 6]])
        ]
        assert all(item is not None for item in made)
        assert len({item.key for item in made if item}) == 1
        assert [item.tensors for item in made if item][:2] == [(dumps([1, 2])[1:-1],), (dumps([-30.5, 4e-7])[1:-1],)]
        wrong = read(
            dumps({"id": "a", "inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2], "data": [1, 2, 3]}]}), None
        )
        assert mergeable.part(wrong, MODEL) is None
    assert len(mergeable._made_json) == 2  # one for each writing; nested data is walked each time


def test_a_kept_plan_cuts_binary_outputs_after_a_header_whose_numbers_changed_its_length():
    """An answer of JSON and binary outputs: the binary rows lie after a header whose length moves with
    its numbers; each part gets its own rows of both."""
    merged = merging.merge([part_of(json_request([[1, 2]])) for _ in range(2)])
    answer_rows._plans.clear()
    for values, raw in (
        (["1", "2"], b"\x01\x00\x00\x00\x02\x00\x00\x00"),
        (["-300.25", "4"], b"\x07" * 4 + b"\x09" * 4),
    ):
        head = (
            '{"model_name":"m","model_version":"1","outputs":[{"name":"Y","datatype":"FP32","shape":[2],'
            f'"data":[{",".join(values)}]}},{{"name":"B","datatype":"INT32","shape":[2],'
            '"parameters":{"binary_data_size":8}}]}'
        ).encode()
        first, second = (
            merging.merge(merged.parts).split(
                UpstreamResponse(200, "application/octet-stream", len(head), head + raw), MODEL
            )
            or []
        )
        for answer, value, row in ((first, values[0], raw[:4]), (second, values[1], raw[4:])):
            assert answer.header_length is not None
            assert orjson.loads(answer.body[: answer.header_length])["outputs"][0]["data"] == [float(value)]
            assert answer.body[answer.header_length :] == row
    assert len(answer_rows._plans) == 1
