"""Large JSON requests read in slices (smtriton/serve/dataplane/reading/large_json.py, json_numbers.py): the
same request Triton would get from the whole reading, the same refusals, and an event loop that is never held
long."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smtriton.serve.dataplane.reading import json_numbers, large_json
from smtriton.serve.dataplane.reading.inference import SMALL_JSON, Inference, read
from smtriton.serve.errors import BadRequest, PayloadTooLarge
from smtriton.serve.host import memory
from smtriton.serve.triton.request_body import BodyPieces, contiguous
from tests.unit.loop_gaps import gaps_while


def sliced(body: bytes) -> Inference:
    """The request read in slices, its body as Triton receives it (the JSON part, then the tensors)."""
    got = asyncio.run(large_json.read(body))
    return dataclasses.replace(got, body=bytes(contiguous(got.body)))


def request(*inputs: dict[str, Any], **extra: Any) -> bytes:
    return orjson.dumps({**extra, "inputs": list(inputs)})


def tensor(name: str, values: np.ndarray, datatype: str, nested: bool = True) -> dict[str, Any]:
    data = values.tolist() if nested else values.ravel().tolist()
    return {"name": name, "shape": list(values.shape), "datatype": datatype, "data": data}


def test_a_request_read_in_slices_is_the_one_the_whole_reading_sends():
    rng = np.random.default_rng(0)
    pixels = rng.standard_normal((2, 3, 40, 40)).astype(np.float32)
    ids = rng.integers(-(2**40), 2**40, size=(3, 700), dtype=np.int64)
    body = request(
        tensor("pixels", pixels, "FP32"),
        tensor("ids", ids, "INT64", nested=False),
        id="r-1",
        parameters={"p": 1},
        outputs=[{"name": "out", "parameters": {"binary_data": True}}],
    )
    got = sliced(body)
    whole = read(body, None, transcode_min_bytes=1)
    assert bytes(got.body) == bytes(whole.body)
    assert got.header_length == whole.header_length
    assert got.header == whole.header


def test_the_tensors_are_written_into_a_mapping_of_their_own_after_the_json_part():
    """Never one growing buffer: that is copied whole when its allocator cannot extend it in place."""
    values = np.arange(24, dtype=np.float32).reshape(2, 12)
    got = asyncio.run(large_json.read(request(tensor("x", values, "FP32"))))
    assert isinstance(got.body, BodyPieces)
    head, tensors = got.body.pieces
    assert len(head) == got.header_length
    assert memory.is_untouched(tensors)
    assert np.array_equal(np.frombuffer(tensors, np.float32), values.ravel())
    assert len(got.body) == len(head) + values.nbytes


def test_keys_triton_does_not_read_are_not_carried_and_may_hold_anything():
    values = np.arange(12, dtype=np.float64).reshape(3, 4)
    body = request(
        {**tensor("x", values, "FP64"), "note": {"a": "]]}}[[{", "b": [[[1]]]}},
        junk=[{"s": 'x"]'}, [[], {}]],
        outputs=[{"name": "y", "note": [1]}],
    )
    got = sliced(body)
    assert got.header == {
        "outputs": [{"name": "y"}],
        "inputs": [{"name": "x", "shape": [3, 4], "datatype": "FP64", "parameters": {"binary_data_size": 96}}],
    }
    assert np.frombuffer(got.body[got.header_length :], np.float64).tolist() == values.ravel().tolist()


@pytest.mark.parametrize(
    ("body", "refusal"),
    [
        (b'{"inputs":[{"name":"x","shape":[2],"shape":[2],"datatype":"FP32","data":[1,2]}]}', "repeats the key"),
        (b'{"inputs":[{"name":"x","shape":[2],"datatype":"FP32","data":[1,2],"data":[3,4]}]}', "repeats the key"),
        (b'{"inputs":[{"name":"x","shape":[2],"datatype":"FP32","data":[1,NaN]}]}', "no array of numbers"),
        (b'{"inputs":[{"name":"x","shape":[899970039,4],"datatype":"FP32","data":[1,2]}]}', "declares shape"),
        (b'{"inputs":[{"name":"x","shape":[3],"datatype":"FP32","data":[1,2]}]}', r"2 values for its shape \[3\]"),
        (b'{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1,2]}]}', "more values than its shape"),
        (b'{"inputs":[{"name":"x","shape":[1],"datatype":"INT32","data":[1.5]}]}', "INT32 data must be integers"),
        (b'{"inputs":[{"name":"x","shape":[1],"datatype":"INT8","data":[300]}]}', "out of INT8's range"),
        (b'{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]', "malformed"),
        (b"[1,2]", "malformed"),
    ],
)
def test_what_the_whole_reading_refuses_the_sliced_one_refuses(body, refusal):
    with pytest.raises(BadRequest, match=refusal):
        sliced(body)


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "t", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]},
        {"name": "t", "shape": [2], "datatype": "BOOL", "data": [True, False]},
        {"name": "t", "shape": [1], "datatype": "FP16", "data": [1.0]},
        {"name": "t", "shape": [1], "datatype": "FP32", "parameters": {"binary_data_size": 4}},
    ],
    ids=["bytes", "bool", "fp16", "no-data"],
)
def test_a_request_this_large_must_carry_numbers_or_go_binary(spec):
    with pytest.raises(PayloadTooLarge, match="send others this large as binary\\+json"):
        sliced(request(spec))


def test_a_request_that_cannot_fit_in_the_memory_left_is_413_before_anything_is_allocated(monkeypatch):
    monkeypatch.setattr(large_json.cgroups, "available_memory", lambda group: 1000)
    body = request(tensor("x", np.zeros(1000, np.float32), "FP32"))
    with pytest.raises(PayloadTooLarge, match=r"needs about .* MiB of memory .* and the container has 0 MiB free"):
        sliced(body)


def test_the_event_loop_is_served_between_the_slices():
    values = np.random.default_rng(1).standard_normal(4_000_000).astype(np.float32)
    body = request(tensor("x", values.reshape(-1, 4), "FP32"))
    assert len(body) > 4 * large_json.SLICED_JSON_BYTES
    got, gaps = asyncio.run(gaps_while(large_json.read(body)))
    assert np.array_equal(np.frombuffer(contiguous(got.body)[got.header_length :], np.float32), values)
    assert len(gaps) > 20  # the loop ran again and again while the request was read
    assert sorted(gaps)[len(gaps) // 2] < 0.05  # most steps are short: no step holds the loop for the whole read


@settings(max_examples=60, deadline=None)
@given(
    shape=st.lists(st.integers(0, 6), min_size=1, max_size=3),
    datatype=st.sampled_from(["FP32", "FP64", "INT8", "INT32", "INT64", "UINT8", "UINT64"]),
    nested=st.booleans(),
    spaces=st.booleans(),
)
def test_any_numeric_request_reads_the_same_either_way(shape, datatype, nested, spaces):
    count = int(np.prod(shape))
    kinds = {"FP32": np.float32, "FP64": np.float64, "INT8": np.int8, "INT32": np.int32, "INT64": np.int64,
             "UINT8": np.uint8, "UINT64": np.uint64}  # fmt: skip
    values = np.arange(count).astype(kinds[datatype]).reshape(shape)
    body = request(tensor("x", values, datatype, nested))
    if spaces:
        body = body.replace(b",", b" ,\n ").replace(b"[", b"[ ")
    whole = read(body, None, transcode_min_bytes=1)
    got = sliced(body)
    assert bytes(got.body) == bytes(whole.body)


def numbers_request(data: bytes, count: int, datatype: str = "FP64") -> bytes:
    """A request of one input whose data is ``data`` as written (``count`` values for its shape)."""
    return b'{"inputs":[{"name":"x","shape":[%d],"datatype":"%s","data":%s}]}' % (count, datatype.encode(), data)


@pytest.mark.parametrize(
    "data",
    [
        b"[1,2,3]]]]",  # a bracket too many closes the array before its end
        b"[1,2],[3]",  # a second array after the data's
        b"[1,2,3]4]",  # garbage after the value (its brackets dropped, it read as 34)
        b"[1,2] 3]",
        b"[[1,2,3]",  # a bracket never closed
        b"[1,[2],3",
        b"[1,2,]",
        b"[1,,2,3]",
        b"[[,1],2,3]",
        b"[1][2,3]",
    ],
)
def test_data_whose_brackets_do_not_make_one_array_is_refused_as_the_whole_reading_and_triton_refuse_it(data):
    body = numbers_request(data, 3)
    with pytest.raises(json.JSONDecodeError):
        json.loads(body)  # and so rapidjson: Triton answers 400
    for whole in (body, body[:-1] + b" " * (SMALL_JSON + 1) + b"}"):
        with pytest.raises(BadRequest, match="failed to parse the request JSON buffer"):
            read(whole, None, transcode_min_bytes=1)
    with pytest.raises(BadRequest, match="failed to parse the request JSON buffer") as refused:
        sliced(body)
    assert refused.value.status == 400


@pytest.mark.parametrize(
    "junk",
    [
        b'{"inputs":[{"name":"x","shape":[1],"datatype":"FP64","data":[1],"note":tru}]}',
        b'{"inputs":[{"name":"x","shape":[1],"datatype":"FP64","data":[1],"note":{]}]}',
        b'{"inputs":[{"name":"x","shape":[1],"datatype":"FP64","data":[1]}],"note":[1,,2]}',
        b'{"inputs":[{"name":"x","shape":[1],"datatype":"FP64","data":[1]}],"note":NaN}',
        b'{"inputs":[{"name":"x","shape":[1],"datatype":"FP64","data":[1]}]} and more',
    ],
    ids=["scalar", "object", "array", "nan", "after-the-request"],
)
def test_what_keys_triton_does_not_read_hold_and_what_follows_the_request_is_read_too(junk):
    with pytest.raises(BadRequest, match="failed to parse the request JSON buffer"):
        sliced(junk)


_TOKENS = st.sampled_from([b"[", b"]", b",", b"1", b"-2.5", b"0", b" ", b"\n"])


def _flat(value: Any) -> list[float]:
    return [float(x) for item in value for x in (_flat(item) if isinstance(item, list) else [item])]


@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(_TOKENS, max_size=24), slice_bytes=st.integers(1, 12))
def test_data_arrays_cut_anywhere_are_refused_exactly_when_they_are_no_json(tokens, slice_bytes):
    """However a data array is cut into slices, the sliced reading takes it iff it is JSON (then with the
    values JSON reads), and refuses it with 400 otherwise."""
    data = b"[" + b"".join(tokens) + b"]"
    try:
        values = _flat(json.loads(data))
    except json.JSONDecodeError:
        values = None
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(json_numbers, "_SLICE", slice_bytes)
        if values is None:  # a shape larger than any count: the refusal is the array's own
            with pytest.raises(BadRequest, match="failed to parse the request JSON buffer"):
                sliced(numbers_request(data, 30))
            return
        got = sliced(numbers_request(data, len(values)))
    assert np.frombuffer(got.body[got.header_length :], np.float64).tolist() == values
