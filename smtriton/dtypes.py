"""Triton data types and their numpy / torch / model-config counterparts, in one table.

Triton's names (``FP32``, ``INT64``, ``BYTES``) are the key everywhere: recipes, signatures, requests.
The numpy side is tritonclient's own mapping (what Triton's clients put on the wire: BYTES travels as
numpy object arrays of ``bytes``, BF16 as ``ml_dtypes.bfloat16``). Importing this module imports
nothing: numpy and tritonclient.utils load on the first numpy question and torch only for a torch one,
so the Python backends inside Triton's stub and the builder's up-to-date check stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import torch

# Every tensor data type of Triton's inference protocol.
TRITON_DTYPES: tuple[str, ...] = (
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BF16", "BYTES",
)  # fmt: skip
# What the build tools (recipes, exporters, generated configs) handle: torch and ONNX have each one.
BUILD_DTYPES: tuple[str, ...] = ("BOOL", "UINT8", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64", "BYTES")

# ONNX TensorProto element type names -> Triton (what Triton's onnxruntime backend maps).
ONNX_TYPES: dict[str, str] = {
    "BOOL": "BOOL", "UINT8": "UINT8", "UINT16": "UINT16", "UINT32": "UINT32", "UINT64": "UINT64",
    "INT8": "INT8", "INT16": "INT16", "INT32": "INT32", "INT64": "INT64", "FLOAT16": "FP16", "FLOAT": "FP32",
    "DOUBLE": "FP64", "BFLOAT16": "BF16", "STRING": "BYTES",
}  # fmt: skip

INTEGER = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"})
FLOAT = frozenset({"FP16", "FP32", "FP64"})  # BF16 is no numpy float (only ml_dtypes')


def config_type(dtype: str) -> str:
    """The ModelConfig enum name: ``TYPE_FP32``; BYTES is ``TYPE_STRING`` in config files."""
    return "TYPE_STRING" if dtype == "BYTES" else f"TYPE_{dtype}"


def from_config_type(config_type: str) -> str:
    """``TYPE_FP32`` -> ``FP32``; ``TYPE_STRING`` -> ``BYTES``; raises for names that are no Triton type."""
    name = "BYTES" if config_type == "TYPE_STRING" else config_type.removeprefix("TYPE_")
    if name not in TRITON_DTYPES:
        raise ValueError(f"config data type {config_type} is not a Triton tensor type")
    return name


def numpy_dtype(dtype: str) -> np.dtype[Any]:
    """The numpy dtype a Triton tensor of ``dtype`` travels as (BYTES: object)."""
    import numpy as np
    from tritonclient.utils import triton_to_np_dtype

    found = triton_to_np_dtype(dtype)
    if found is None:
        raise ValueError(f"{dtype!r} is not a Triton data type")
    return np.dtype(found)


def from_numpy(dtype: Any) -> str:
    """Triton name of a numpy dtype (``float32`` -> ``FP32``; object or bytes -> ``BYTES``)."""
    import numpy as np
    from tritonclient.utils import np_to_triton_dtype

    name = np_to_triton_dtype(np.dtype(dtype))
    if name is None:
        raise ValueError(f"numpy dtype {np.dtype(dtype)} has no Triton equivalent")
    return str(name)


def from_numpy_name(name: str) -> str:
    """Triton name of a numpy dtype name the build tools handle (``float32`` -> ``FP32``; ``object``
    -> ``BYTES``); raises for the others (``uint16``, ``complex64``, ``float8_e4m3fn``, ...)."""
    try:
        triton = from_numpy(name)
    except (TypeError, ValueError):  # no numpy dtype by that name, or no Triton one for it
        triton = None
    if triton is None or triton not in BUILD_DTYPES:
        raise ValueError(f"dtype {name} has no Triton equivalent in this tool")
    return triton


def torch_dtype(dtype: str) -> torch.dtype:
    import torch

    if dtype == "BYTES":
        raise ValueError("BYTES tensors have no torch dtype")
    found: torch.dtype = getattr(torch, numpy_dtype(dtype).name)
    return found


def from_torch(dtype: torch.dtype) -> str:
    """Triton name of a torch dtype; raises for dtypes the build tools cannot express."""
    try:
        return from_numpy_name(str(dtype).removeprefix("torch."))
    except ValueError:
        raise ValueError(f"torch dtype {dtype} has no Triton equivalent in this tool") from None
