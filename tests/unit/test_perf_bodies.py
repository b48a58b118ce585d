"""What perf sends: random inputs from a config, .npy files, ready bodies."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from smtriton.aws.invoke import encode_request
from smtriton.errors import ToolUsageError
from smtriton.perf.bodies import (
    POOL_SIZE,
    binary_json_header_size,
    body_from_file,
    build_bodies,
    inputs_from_config,
    parse_shapes,
)

CONFIG = """name: "m"
max_batch_size: 8
input [
  { name: "ids", data_type: TYPE_INT64, dims: [-1] },
  { name: "mask", data_type: TYPE_BOOL, dims: [4] },
  { name: "scale", data_type: TYPE_FP16, dims: [1] },
  { name: "text", data_type: TYPE_STRING, dims: [2] }
]
"""


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    (tmp_path / "config.pbtxt").write_text(CONFIG)
    return tmp_path


def test_inputs_follow_the_config_with_the_batch_and_given_shapes(model_dir: Path):
    arrays = inputs_from_config(model_dir, 3, {"ids": [16]}, np.random.default_rng(0))
    assert arrays["ids"].shape == (3, 16)
    assert arrays["ids"].dtype == np.int64
    assert arrays["mask"].dtype == bool
    assert arrays["scale"].dtype == np.float16
    assert arrays["text"].dtype == object
    assert arrays["text"].shape == (3, 2)
    assert inputs_from_config(model_dir, 1, {}, np.random.default_rng(0))["ids"].shape == (1, 1)  # -1 -> 1


def test_shapes_that_do_not_fit_the_config_are_refused(model_dir: Path):
    with pytest.raises(ToolUsageError, match="does not fit"):
        inputs_from_config(model_dir, 1, {"mask": [5]}, np.random.default_rng(0))
    with pytest.raises(ToolUsageError, match="max_batch_size 8"):
        inputs_from_config(model_dir, 9, {}, np.random.default_rng(0))
    with pytest.raises(ToolUsageError, match="NAME=D1"):
        parse_shapes(["ids:16"])
    assert parse_shapes(["ids=1,16"]) == {"ids": [1, 16]}


def test_generated_bodies_are_a_pool_of_distinct_binary_requests_that_decode(model_dir: Path):
    bodies = build_bodies(model_dir=model_dir, input_files=[], batch_size=2, shapes={}, binary=True)
    assert len(bodies) == POOL_SIZE
    assert len({b.data for b in bodies}) == POOL_SIZE
    assert bodies[0].content_type.startswith("application/vnd.sagemaker-triton.binary+json;json-header-size=")
    size = int(bodies[0].content_type.rsplit("=", 1)[1])
    header = json.loads(bodies[0].data[:size])
    assert [t["name"] for t in header["inputs"]] == ["ids", "mask", "scale", "text"]


def test_json_bodies_refuse_fp16_which_json_cannot_carry(model_dir: Path):
    with pytest.raises(ToolUsageError, match="FP16"):
        build_bodies(model_dir=model_dir, input_files=[], batch_size=1, shapes={}, binary=False)


def test_npy_files_are_sent_as_they_are(tmp_path: Path):
    array = np.arange(32, dtype=np.int32).reshape(2, 16)
    np.save(tmp_path / "a.npy", array)
    (body,) = build_bodies(
        model_dir=None, input_files=[f"INPUT0={tmp_path / 'a.npy'}"], batch_size=1, shapes={}, binary=False
    )
    assert body.content_type == "application/json"
    sent = json.loads(body.data)["inputs"][0]
    assert sent["shape"] == [2, 16]
    assert sent["data"] == array.reshape(-1).tolist()


def test_a_ready_binary_body_gets_its_header_size_from_the_body(tmp_path: Path):
    data, content_type = encode_request({"x": np.ones(4, dtype=np.float32)}, binary=True)
    (tmp_path / "b.bin").write_bytes(data)
    (tmp_path / "b.json").write_bytes(encode_request({"x": np.ones(4, dtype=np.float32)}, binary=False)[0])
    assert body_from_file(tmp_path / "b.bin").content_type == content_type
    assert body_from_file(tmp_path / "b.json").content_type == "application/json"
    assert binary_json_header_size(b'{"a": 1}') is None
    with pytest.raises(ToolUsageError, match="JSON object"):
        binary_json_header_size(b"\x00\x01")
    size = binary_json_header_size(data)
    assert size is not None
    assert data[size:] == np.ones(4, dtype=np.float32).tobytes()  # what follows the header is the tensor


def test_nothing_to_send_is_a_usage_error():
    with pytest.raises(ToolUsageError, match="--model-dir"):
        build_bodies(model_dir=None, input_files=[], batch_size=1, shapes={}, binary=True)
    with pytest.raises(ToolUsageError, match="not both"):
        build_bodies(model_dir=None, input_files=["a.json", "x=b.npy"], batch_size=1, shapes={}, binary=True)
