"""serve.transcode: which JSON requests are re-encoded binary, and that the encoding is exact."""

from __future__ import annotations

import json

import numpy as np
import pytest

from serve.transcode import to_binary


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
    assert header["id"] == "req-7" and header["parameters"] == {"custom": "x"}
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
        request({"name": "x", "shape": [-1], "datatype": "FP32", "data": [1.0]}),
        request({"name": "x", "shape": [1], "datatype": "FP32"}),
        request({"name": "x", "shape": [1], "datatype": "FP32", "parameters": {"shared_memory_region": "r"}}),
        request({"name": "x", "shape": [1], "datatype": "FP32", "data": [1], "parameters": {"binary_data_size": 4}}),
        request(),
        b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1], "data": [2]}]}',
        b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [NaN]}]}',
        b'{"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]',
        b"[1, 2]",
        b"not json",
        b"",
    ],
)
def test_anything_unusual_goes_to_triton_as_it_came(body):
    assert to_binary(body) is None


def test_the_parser_is_free_again_after_a_refusal():
    """simdjson refuses to reuse a parser while its documents live; each call must let go of its own."""
    bad = request({"name": "x", "shape": [1], "datatype": "BOOL", "data": [True]})
    good = request({"name": "x", "shape": [1], "datatype": "FP32", "data": [1.5]})
    for _ in range(3):
        assert to_binary(bad) is None
        assert to_binary(good) is not None
