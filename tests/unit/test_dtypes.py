"""smtriton.dtypes: the one table of Triton data types and their numpy, torch and config names."""

from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2

from smtriton import dtypes

NUMPY = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BF16": ml_dtypes.bfloat16,
    "BYTES": np.object_,
}


def test_the_table_holds_every_triton_dtype_once():
    assert sorted(dtypes.TRITON_DTYPES) == sorted(NUMPY)
    assert set(dtypes.BUILD_DTYPES) < set(dtypes.TRITON_DTYPES)
    assert set(dtypes.TRITON_DTYPES) > dtypes.INTEGER | dtypes.FLOAT


@pytest.mark.parametrize("name", sorted(NUMPY))
def test_every_triton_dtype_maps_to_numpy_and_back(name):
    assert dtypes.numpy_dtype(name) == np.dtype(NUMPY[name])
    assert dtypes.from_numpy(dtypes.numpy_dtype(name)) == name


@pytest.mark.parametrize("name", sorted(NUMPY))
def test_every_triton_dtype_is_a_model_config_enum(name):
    enum = dtypes.config_type(name)
    assert model_config_pb2.DataType.Value(enum) != model_config_pb2.TYPE_INVALID
    assert dtypes.from_config_type(enum) == name


def test_bytes_is_type_string_in_configs_and_object_in_numpy():
    assert dtypes.config_type("BYTES") == "TYPE_STRING"
    assert dtypes.from_config_type("TYPE_STRING") == "BYTES"
    assert dtypes.numpy_dtype("BYTES") == np.dtype(object)
    assert dtypes.from_numpy(np.array([b"a"], dtype=object).dtype) == "BYTES"
    assert dtypes.from_numpy(np.array([b"a"]).dtype) == "BYTES"  # fixed-width bytes travel as BYTES too
    with pytest.raises(ValueError, match="no torch dtype"):
        dtypes.torch_dtype("BYTES")


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="'FP8' is not a Triton data type"):
        dtypes.numpy_dtype("FP8")
    with pytest.raises(ValueError, match="TYPE_FP8 is not a Triton tensor type"):
        dtypes.from_config_type("TYPE_FP8")
    with pytest.raises(ValueError, match="complex64 has no Triton equivalent"):
        dtypes.from_numpy(np.complex64)


def test_the_build_tools_map_only_their_own_dtypes():
    assert [dtypes.from_numpy_name(np.dtype(NUMPY[n]).name) for n in dtypes.BUILD_DTYPES] == list(dtypes.BUILD_DTYPES)
    for name in ("uint16", "bfloat16", "complex64", "str", "float8_e4m3fn", "no-such-dtype"):
        with pytest.raises(ValueError, match="in this tool"):
            dtypes.from_numpy_name(name)


def test_torch_lookups():
    torch = pytest.importorskip("torch")
    for name in dtypes.BUILD_DTYPES:
        if name != "BYTES":
            assert dtypes.from_torch(dtypes.torch_dtype(name)) == name
    assert dtypes.torch_dtype("BF16") is torch.bfloat16
    with pytest.raises(ValueError, match=r"torch\.complex64"):
        dtypes.from_torch(torch.complex64)


def test_importing_the_table_loads_neither_torch_nor_grpc():
    """The Python backends import it inside Triton's stub, where every import costs start-up time."""
    code = (
        "import sys, smtriton.dtypes as d; d.numpy_dtype('FP32'); "
        "print(sorted(m for m in ('torch', 'tritonclient.grpc', 'grpc') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
