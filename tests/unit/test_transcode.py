"""smtriton.serve.dataplane.reading.transcode: which JSON requests are re-encoded binary, and that the encoding
is exact."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smtriton.serve.dataplane.reading.inference import read
from smtriton.serve.errors import BadRequest


def to_binary(body: bytes) -> tuple[bytes, int] | None:
    """The request as the front sends it to Triton when re-encoding it is asked for at any size: None
    when it goes as it came."""
    inference = read(body, None, transcode_min_bytes=1)
    if inference.body is body:
        return None
    assert inference.header_length is not None
    return bytes(inference.body), inference.header_length


def decode(body: bytes, header_length: int) -> tuple[dict, dict[str, np.ndarray]]:
    """Read a Triton binary request the way Triton does: JSON header, then each input's bytes in order."""
    header = json.loads(body[:header_length])
    offset, tensors = header_length, {}
    for spec in header["inputs"]:
        size = spec["parameters"]["binary_data_size"]
        dtype = {"FP32": np.float32, "FP64": np.float64, "INT8": np.int8, "INT32": np.int32, "INT64": np.int64,
                 "UINT8": np.uint8, "UINT64": np.uint64}[spec["datatype"]]  # fmt: skip
        tensors[spec["name"]] = np.frombuffer(body[offset : offset + size], dtype=dtype).reshape(spec["shape"])
        offset += size
    assert offset == len(body)
    return header, tensors


def request(*inputs: dict, **extra) -> bytes:
    return json.dumps({**extra, "inputs": list(inputs)}).encode()


def test_an_fp32_image_round_trips_exactly_and_the_rest_of_the_request_is_kept():
    image = np.random.default_rng(0).standard_normal((1, 3, 8, 8), dtype=np.float32)
    body = request(
        {"name": "pixels", "shape": [1, 3, 8, 8], "datatype": "FP32", "data": image.tolist()},  # nested lists
        {"name": "ids", "shape": [2], "datatype": "INT64", "data": [-(2**63), 2**63 - 1], "parameters": {"p": 1}},
        id="req-7",
        parameters={"custom": "x"},
        outputs=[{"name": "out", "parameters": {"binary_data": False}}],
    )
    binary, header_length = to_binary(body)
    header, tensors = decode(binary, header_length)
    assert np.array_equal(tensors["pixels"], image)
    assert tensors["ids"].tolist() == [-(2**63), 2**63 - 1]
    assert header["id"] == "req-7"
    assert header["parameters"] == {"custom": "x"}
    assert header["outputs"] == [{"name": "out", "parameters": {"binary_data": False}}]
    assert header["inputs"][1]["parameters"] == {"p": 1, "binary_data_size": 16}
    assert "data" not in header["inputs"][0]


def test_fp32_takes_json_integers_and_doubles_rounded_like_a_cast():
    values = [1, -2, 0.1, 3.4028234663852886e38, 1e-45]
    binary, header_length = to_binary(request({"name": "x", "shape": [5], "datatype": "FP32", "data": values}))
    _, tensors = decode(binary, header_length)
    assert tensors["x"].tolist() == np.array(values, dtype=np.float64).astype(np.float32).tolist()


def test_every_numeric_type_within_its_range():
    ranges = {"INT8": [-128, 127], "UINT8": [0, 255], "UINT64": [0, 2**64 - 1], "FP64": [0.1, 2]}
    for datatype, values in ranges.items():
        binary, header_length = to_binary(request({"name": "x", "shape": [2], "datatype": datatype, "data": values}))
        assert decode(binary, header_length)[1]["x"].tolist() == values


@pytest.mark.parametrize(
    "body",
    [
        request({"name": "x", "shape": [2], "datatype": "BOOL", "data": [True, False]}),
        request({"name": "x", "shape": [1], "datatype": "BYTES", "data": ["abc"]}),
        request({"name": "x", "shape": [1], "datatype": "FP16", "data": [1.0]}),
        request({"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0, True]}),
        request({"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0, "2"]}),
        request({"name": "x", "shape": [2], "datatype": "FP32", "data": [1.0, None]}),
        request({"name": "x", "shape": [1], "datatype": "FP32", "data": [1e39]}),
        request({"name": "x", "shape": [1], "datatype": "INT32", "data": [1.5]}),
        request({"name": "x", "shape": [1], "datatype": "INT8", "data": [128]}),
        request({"name": "x", "shape": [1], "datatype": "UINT8", "data": [-1]}),
        request({"name": "x", "shape": [3], "datatype": "FP32", "data": [1.0, 2.0]}),
        request({"name": "x", "shape": [1], "datatype": "FP32"}),
        request({"name": "x", "shape": [1], "datatype": "FP32", "parameters": {"shared_memory_region": "r"}}),
        request(),
    ],
)
def test_anything_unusual_goes_to_triton_as_it_came(body):
    assert to_binary(body) is None


@pytest.mark.parametrize(
    "body",
    [
        request({"name": "x", "shape": [-1], "datatype": "FP32", "data": [1.0]}),
        request({"name": "x", "shape": [1], "datatype": "FP32", "data": [1], "parameters": {"binary_data_size": 4}}),
        b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1], "data": [2]}]}',
        b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [NaN]}]}',
        b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]',
        b"[1, 2]",
        b"not json",
        b" ",
    ],
)
def test_what_triton_could_read_otherwise_is_refused_never_re_encoded(body):
    with pytest.raises(BadRequest):
        to_binary(body)


def test_the_parser_is_free_again_after_a_refusal():
    """simdjson refuses to reuse a parser while its documents live; each call must let go of its own."""
    bad = request({"name": "x", "shape": [1], "datatype": "BOOL", "data": [True]})
    good = request({"name": "x", "shape": [1], "datatype": "FP32", "data": [1.5]})
    for _ in range(3):
        assert to_binary(bad) is None
        assert to_binary(good) is not None


_JSON_LEAF = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4)
)
_JSON = st.recursive(
    _JSON_LEAF, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4)
)
_DATATYPES = st.sampled_from(
    ["FP32", "FP64", "INT8", "INT32", "INT64", "UINT8", "UINT64", "BOOL", "BYTES", "FP16", "X"]
)


def _sometimes(draw, odd, usual):
    """``odd`` one time in eight, else ``usual``: mostly well-formed requests, with every kind of flaw."""
    return draw(odd) if draw(st.integers(0, 7)) == 0 else usual


@st.composite
def _requests(draw) -> bytes:
    """Inference requests, mostly well-formed (so they are re-encoded and checked), often flawed."""
    elements = (
        st.integers(-130, 260)
        | st.integers(-(2**64), 2**64)
        | st.floats(-1e39, 1e39, allow_nan=False, allow_infinity=False)
    )
    inputs = []
    for i in range(draw(st.integers(1, 3))):
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        data = draw(st.lists(elements, min_size=math.prod(shape), max_size=math.prod(shape)))
        if draw(st.booleans()):  # nested the way the shape says, as numpy's tolist() gives it
            data = np.array(data, dtype=object).reshape(shape).tolist() if shape else data
        spec = {
            "name": f"in{i}",
            "shape": _sometimes(draw, st.lists(st.integers(-1, 4), max_size=3), shape),
            "datatype": draw(_DATATYPES),
            "data": _sometimes(draw, _JSON, data),
        }
        spec.update(_sometimes(draw, st.dictionaries(st.sampled_from(["parameters", "data", "shape"]), _JSON), {}))
        inputs.append(spec)
    request = {"inputs": inputs, **draw(st.dictionaries(st.sampled_from(["id", "parameters", "outputs"]), _JSON))}
    text = json.dumps(request, allow_nan=False).encode()
    return _sometimes(draw, st.integers(0, len(text)).map(lambda cut: text[:cut]), text)  # truncated too


@settings(deadline=None)
@given(_requests())
def test_any_request_is_either_refused_left_alone_or_re_encoded_exactly(body):
    try:
        binary = to_binary(body)
    except BadRequest:
        return  # refused: never forwarded
    if binary is None:
        return
    header, tensors = decode(*binary)
    original = json.loads(body)
    if isinstance(original.get("outputs"), list):  # of an output, Triton reads its name and parameters alone
        original["outputs"] = [
            {k: v for k, v in spec.items() if k in ("name", "parameters")} if isinstance(spec, dict) else spec
            for spec in original["outputs"]
        ]
    assert {k: v for k, v in header.items() if k != "inputs"} == {k: v for k, v in original.items() if k != "inputs"}
    for spec, sent in zip(original["inputs"], header["inputs"], strict=True):
        expected = np.array(spec["data"], dtype=np.float64 if spec["datatype"].startswith("FP") else object)
        got = tensors[spec["name"]]
        assert got.shape == tuple(spec["shape"])
        assert np.array_equal(
            got.ravel().astype(expected.dtype), expected.ravel().astype(got.dtype).astype(expected.dtype)
        )
        assert {k: v for k, v in sent.items() if k != "parameters"} == {
            k: v for k, v in spec.items() if k not in ("data", "parameters")
        }
